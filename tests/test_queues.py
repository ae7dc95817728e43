"""Queues: create, update, delete, read and live stats (pg-boss's
create_queue(), delete_queue(), queue options and queue operations)."""

from __future__ import annotations

import datetime as dt
import hashlib
import time
from typing import Any

import pytest

from alkstore_sa import (
    InvalidOptionsError,
    QueueExistsError,
    QueueInfo,
    QueueNotFoundError,
    QueuePolicy,
    QueueStats,
)

POLICY_INDEX = {
    "standard": None,
    "short": "i1",
    "singleton": "i2",
    "stately": "i3",
    "exclusive": "i6",
}


def queue_row(env: Any, name: str) -> Any:
    rows = env.sql("SELECT * FROM {s}.queue WHERE name = :n", n=name)
    return rows[0] if rows else None


def table_exists(env: Any, table: str) -> bool:
    [(found,)] = env.sql("SELECT to_regclass(:t) IS NOT NULL", t=f'"{env.schema}".{table}')
    return bool(found)


def indexes_of(env: Any, table: str) -> set[str]:
    rows = env.sql(
        "SELECT indexname FROM pg_indexes WHERE schemaname = :s AND tablename = :t",
        s=env.schema,
        t=table,
    )
    return {r.indexname for r in rows}


# ------------------------------------------------------------------ create


def test_create_queue_applies_pgboss_defaults(env: Any) -> None:
    info = env.tx(lambda q: q.create_queue("q"))
    assert isinstance(info, QueueInfo)
    assert info.name == "q" and info.policy is QueuePolicy.STANDARD
    assert (info.retry_limit, info.retry_delay, info.retry_backoff, info.retry_delay_max) == (
        2,
        0,
        False,
        None,
    )
    assert (info.expire_seconds, info.retention_seconds, info.deletion_seconds) == (
        900,
        1209600,
        604800,
    )
    assert (info.dead_letter, info.partition, info.table_name) == (None, False, "job_common")
    assert (info.warning_queued, info.deferred_count, info.queued_count) == (0, 0, 0)
    assert (info.active_count, info.total_count, info.singletons_active) == (0, 0, None)
    assert info.monitor_on is None and info.maintain_on is None
    assert info.created_on == info.updated_on


def test_create_queue_stores_every_option(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(
        lambda q: q.create_queue(
            "q",
            policy="stately",
            dead_letter="dlq",
            retry_limit=4,
            retry_delay=5,
            retry_backoff=True,
            retry_delay_max=60,
            expire_seconds=70,
            retention_seconds=80,
            deletion_seconds=90,
            warning_queued=100,
        )
    )
    row = queue_row(env, "q")
    assert (row.policy, row.dead_letter, row.partition, row.table_name) == (
        "stately",
        "dlq",
        False,
        "job_common",
    )
    assert (row.retry_limit, row.retry_delay, row.retry_backoff, row.retry_delay_max) == (
        4,
        5,
        True,
        60,
    )
    assert (row.expire_seconds, row.retention_seconds, row.deletion_seconds) == (70, 80, 90)
    assert row.warning_queued == 100


def test_create_queue_accepts_a_policy_enum(env: Any) -> None:
    assert env.tx(lambda q: q.create_queue("q", policy=QueuePolicy.SHORT)).policy == "short"


def test_create_existing_queue_returns_it_unchanged(env: Any) -> None:
    first = env.tx(lambda q: q.create_queue("q", retry_limit=1))
    again = env.tx(lambda q: q.create_queue("q", retry_limit=9, policy="short"))
    assert again == first
    assert (queue_row(env, "q").retry_limit, queue_row(env, "q").policy) == (1, "standard")


def test_create_existing_queue_with_exist_ok_false_raises(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    with pytest.raises(QueueExistsError, match="'q'"):
        env.tx(lambda q: q.create_queue("q", exist_ok=False))


def test_create_queue_with_a_missing_dead_letter_is_refused(env: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="dead_letter"):
        env.tx(lambda q: q.create_queue("q", dead_letter="nowhere"))
    assert queue_row(env, "q") is None


def test_queue_created_in_a_rolled_back_transaction_does_not_exist(env: Any) -> None:
    env.service().create_queue("q", partition=True)
    env.rollback()
    assert queue_row(env, "q") is None
    assert not table_exists(env, "j" + hashlib.sha224(b"q").hexdigest())


def test_partitioned_queue_gets_its_own_table_with_its_policy_index_only(env: Any) -> None:
    for policy, own in POLICY_INDEX.items():
        name = f"p-{policy}"
        info = env.tx(lambda q, n=name, p=policy: q.create_queue(n, policy=p, partition=True))
        table = "j" + hashlib.sha224(name.encode()).hexdigest()
        assert (info.partition, info.table_name) == (True, table)
        expected = {f"{table}_pkey", f"{table}_i4", f"{table}_i5"}
        if own is not None:
            expected.add(f"{table}_{own}")
        assert indexes_of(env, table) == expected, policy


def test_jobs_of_a_partitioned_queue_live_in_its_table(env: Any) -> None:
    env.tx(lambda q: q.create_queue("p", partition=True))
    job_id = env.tx(lambda q: q.send("p", None))
    table = "j" + hashlib.sha224(b"p").hexdigest()
    assert env.sql(f"SELECT id FROM {{s}}.{table}") == [(job_id,)]
    assert env.sql("SELECT count(*) FROM {s}.job_common") == [(0,)]


# ------------------------------------------------------------------ delete


def test_delete_queue_deletes_its_jobs_only(env: Any) -> None:
    env.tx(lambda q: q.create_queue("a"))
    env.tx(lambda q: q.create_queue("b"))
    env.tx(lambda q: q.send_many("a", [{}, {}]))
    kept = env.tx(lambda q: q.send("b", None))
    assert env.tx(lambda q: q.delete_queue("a")) is True
    assert queue_row(env, "a") is None
    assert env.sql("SELECT id FROM {s}.job") == [(kept,)]


def test_delete_partitioned_queue_drops_its_table(env: Any) -> None:
    env.tx(lambda q: q.create_queue("p", partition=True))
    env.tx(lambda q: q.send("p", None))
    env.tx(lambda q: q.delete_queue("p"))
    assert not table_exists(env, "j" + hashlib.sha224(b"p").hexdigest())
    assert table_exists(env, "job_common")


def test_delete_queue_removes_its_schedules_and_subscriptions(env: Any) -> None:
    env.tx(lambda q: q.create_queue("a"))
    env.tx(lambda q: q.create_queue("b"))
    env.tx(lambda q: q.schedule("a", "* * * * *"))
    env.tx(lambda q: q.schedule("b", "* * * * *"))
    env.tx(lambda q: q.subscribe("evt", "a"))
    env.tx(lambda q: q.subscribe("evt", "b"))
    env.tx(lambda q: q.delete_queue("a"))
    assert env.sql("SELECT name FROM {s}.schedule") == [("b",)]
    assert env.sql("SELECT name FROM {s}.subscription") == [("b",)]


def test_subscriptions_are_listed_by_event_then_queue(env: Any) -> None:
    for name in ("a", "b"):
        env.tx(lambda q, name=name: q.create_queue(name))
    env.tx(lambda q: q.subscribe("paid", "b"))
    env.tx(lambda q: q.subscribe("paid", "a"))
    env.tx(lambda q: q.subscribe("created", "b"))
    every = env.tx(lambda q: q.get_subscriptions())
    assert [(s.event, s.name) for s in every] == [("created", "b"), ("paid", "a"), ("paid", "b")]
    assert every[0].created_on <= every[0].updated_on
    of_b = env.tx(lambda q: q.get_subscriptions("b"))
    assert [s.event for s in of_b] == ["created", "paid"]
    assert [s.name for s in env.tx(lambda q: q.get_subscriptions(event="paid"))] == ["a", "b"]
    assert env.tx(lambda q: q.get_subscriptions("a", "created")) == []
    assert env.tx(lambda q: q.get_subscriptions("unknown")) == []
    with pytest.raises(InvalidOptionsError, match="event"):
        env.tx(lambda q: q.get_subscriptions(event=""))


def test_delete_missing_queue_returns_false(env: Any) -> None:
    assert env.tx(lambda q: q.delete_queue("nope")) is False


def test_delete_queue_refuses_another_queues_dead_letter(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("work", dead_letter="dlq"))
    with pytest.raises(InvalidOptionsError, match="work"):
        env.tx(lambda q: q.delete_queue("dlq"))
    assert queue_row(env, "dlq") is not None


@pytest.mark.parametrize("partition", [False, True])
def test_delete_queue_refuses_a_dead_letter_named_by_jobs(env: Any, partition: bool) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("work", partition=partition))
    env.tx(lambda q: q.send("work", None, dead_letter="dlq"))
    # Found by the foreign key's check at the delete, in a savepoint: the caller's
    # transaction goes on, with what it did before intact.
    svc = env.service()
    svc.create_queue("other")
    with pytest.raises(InvalidOptionsError, match="jobs of other queues dead-letter into 'dlq'"):
        svc.delete_queue("dlq")
    assert svc.delete_queue("other") is True
    env.commit()
    assert queue_row(env, "dlq") is not None and queue_row(env, "other") is None
    env.tx(lambda q: q.delete_queue("work"))
    assert env.tx(lambda q: q.delete_queue("dlq")) is True


def test_delete_queue_at_46_refuses_a_dead_letter_named_by_jobs(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("dlq"))
    env46.tx(lambda q: q.create_queue("work", partition=True))
    env46.tx(lambda q: q.send("work", None, dead_letter="dlq"))
    with pytest.raises(InvalidOptionsError, match="dead-letter into 'dlq'"):
        env46.tx(lambda q: q.delete_queue("dlq"))
    assert env46.tx(lambda q: q.delete_queue("work")) is True
    assert env46.tx(lambda q: q.delete_queue("dlq")) is True


def test_deleted_queue_can_be_created_again_with_another_policy(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q", policy="short"))
    env.tx(lambda q: q.delete_queue("q"))
    assert env.tx(lambda q: q.create_queue("q", policy="exclusive")).policy == "exclusive"


# ------------------------------------------------------------------ update


def test_update_queue_changes_every_updatable_option(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("q"))
    info = env.tx(
        lambda q: q.update_queue(
            "q",
            dead_letter="dlq",
            retry_limit=4,
            retry_delay=5,
            retry_backoff=True,
            retry_delay_max=60,
            expire_seconds=70,
            retention_seconds=80,
            deletion_seconds=90,
            warning_queued=100,
        )
    )
    assert (info.dead_letter, info.retry_limit, info.retry_delay, info.retry_backoff) == (
        "dlq",
        4,
        5,
        True,
    )
    assert (info.retry_delay_max, info.expire_seconds, info.retention_seconds) == (60, 70, 80)
    assert (info.deletion_seconds, info.warning_queued) == (90, 100)
    assert queue_row(env, "q").retry_limit == 4


def test_update_queue_moves_updated_on(env: Any) -> None:
    created = env.tx(lambda q: q.create_queue("q"))
    time.sleep(0.01)
    updated = env.tx(lambda q: q.update_queue("q", retry_limit=3))
    assert updated.updated_on > created.updated_on
    assert updated.created_on == created.created_on


def test_update_queue_applies_to_jobs_sent_afterwards(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    before = env.tx(lambda q: q.send("q", None))
    env.tx(lambda q: q.update_queue("q", retry_limit=9))
    after = env.tx(lambda q: q.send("q", None))
    rows = {r.id: r.retry_limit for r in env.sql("SELECT id, retry_limit FROM {s}.job")}
    assert (rows[before], rows[after]) == (2, 9)


def test_update_queue_can_clear_the_dead_letter(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("q", dead_letter="dlq"))
    assert env.tx(lambda q: q.update_queue("q", dead_letter=None)).dead_letter is None


def test_update_queue_refuses_policy_and_partition(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    with pytest.raises(InvalidOptionsError, match="policy"):
        env.tx(lambda q: q.update_queue("q", policy="short"))
    with pytest.raises(InvalidOptionsError, match="partition"):
        env.tx(lambda q: q.update_queue("q", partition=True))
    assert (queue_row(env, "q").policy, queue_row(env, "q").partition) == ("standard", False)


def test_update_queue_refuses_retry_delay_max_without_backoff(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    with pytest.raises(InvalidOptionsError, match="retry_delay_max"):
        env.tx(lambda q: q.update_queue("q", retry_delay_max=10))
    assert queue_row(env, "q").retry_delay_max is None


def test_update_queue_refuses_turning_backoff_off_under_a_delay_max(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q", retry_backoff=True, retry_delay_max=10))
    with pytest.raises(InvalidOptionsError, match="retry_delay_max"):
        env.tx(lambda q: q.update_queue("q", retry_backoff=False))
    info = env.tx(lambda q: q.update_queue("q", retry_backoff=False, retry_delay_max=None))
    assert (info.retry_backoff, info.retry_delay_max) == (False, None)


def test_update_queue_refuses_a_missing_dead_letter(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    with pytest.raises(InvalidOptionsError, match="dead_letter"):
        env.tx(lambda q: q.update_queue("q", dead_letter="nowhere"))


def test_update_queue_refuses_itself_as_dead_letter(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    with pytest.raises(InvalidOptionsError, match="dead_letter"):
        env.tx(lambda q: q.update_queue("q", dead_letter="q"))


def test_update_missing_queue_raises_queue_not_found(env: Any) -> None:
    with pytest.raises(QueueNotFoundError, match="'nope'"):
        env.tx(lambda q: q.update_queue("nope", retry_limit=1))


# ------------------------------------------------------------------ read


def test_get_queue_returns_none_for_a_missing_queue(env: Any) -> None:
    assert env.tx(lambda q: q.get_queue("nope")) is None


def test_get_queue_returns_what_create_returned(env: Any) -> None:
    created = env.tx(lambda q: q.create_queue("q", policy="singleton"))
    assert env.tx(lambda q: q.get_queue("q")) == created


def test_get_queues_lists_all_queues_by_name(env: Any) -> None:
    for name in ("c", "a", "b"):
        env.tx(lambda q, n=name: q.create_queue(n))
    assert [i.name for i in env.tx(lambda q: q.get_queues())] == ["a", "b", "c"]


def test_get_queues_with_names_lists_those_that_exist(env: Any) -> None:
    for name in ("a", "b", "c"):
        env.tx(lambda q, n=name: q.create_queue(n))
    assert [i.name for i in env.tx(lambda q: q.get_queues(["c", "a", "zz"]))] == ["a", "c"]


# ------------------------------------------------------------------ stats


def test_stats_of_an_empty_queue_are_zero(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    stats = env.tx(lambda q: q.get_queue_stats("q"))
    assert stats == QueueStats("q", 0, 0, 0, 0, [])


def test_stats_count_jobs_live(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    env.tx(lambda q: q.create_queue("other"))
    env.tx(lambda q: q.send("other", None))
    env.tx(lambda q: q.send("q", None, start_after=3600))
    env.tx(lambda q: q.send_many("q", [{"priority": 1}, {"priority": 1}, {}, {}]))
    [done, _running] = env.tx(lambda q: q.fetch("q", 2))
    env.tx(lambda q: q.complete("q", done.id))
    stats = env.tx(lambda q: q.get_queue_stats("q"))
    assert (stats.deferred_count, stats.queued_count, stats.active_count) == (1, 3, 1)
    assert stats.total_count == 5
    assert stats.singletons_active == []


def test_stats_become_zero_again_when_the_queue_empties(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    job_id = env.tx(lambda q: q.send("q", None))
    assert env.tx(lambda q: q.get_queue_stats("q")).total_count == 1
    env.tx(lambda q: q.delete_job("q", job_id))
    assert env.tx(lambda q: q.get_queue_stats("q")) == QueueStats("q", 0, 0, 0, 0, [])


def test_stats_list_the_keys_of_active_singleton_jobs(env: Any) -> None:
    for policy in ("singleton", "stately"):
        env.tx(lambda q, p=policy: q.create_queue(p, policy=p))
        env.tx(lambda q, p=policy: q.send_many(p, [{"singleton_key": k} for k in "bac"]))
        env.tx(lambda q, p=policy: q.send(p, None))
        env.tx(lambda q, p=policy: q.fetch(p, 10))
        stats = env.tx(lambda q, p=policy: q.get_queue_stats(p))
        assert sorted(stats.singletons_active) == ["a", "b", "c"], policy


def test_stats_of_a_partitioned_queue(env: Any) -> None:
    env.tx(lambda q: q.create_queue("p", partition=True))
    env.tx(lambda q: q.send_many("p", [{}, {}, {}]))
    env.tx(lambda q: q.fetch("p"))
    stats = env.tx(lambda q: q.get_queue_stats("p"))
    assert (stats.queued_count, stats.active_count, stats.total_count) == (2, 1, 3)


def test_stats_of_a_missing_queue_raise_queue_not_found(env: Any) -> None:
    with pytest.raises(QueueNotFoundError, match="'nope'"):
        env.tx(lambda q: q.get_queue_stats("nope"))


def test_stats_do_not_touch_the_cached_counters(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    env.tx(lambda q: q.send("q", None))
    env.tx(lambda q: q.get_queue_stats("q"))
    info = env.tx(lambda q: q.get_queue("q"))
    assert (info.queued_count, info.total_count) == (0, 0)
    assert isinstance(info.updated_on, dt.datetime)
