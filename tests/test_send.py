"""send and its variants: every option lands in the right column (as pg-boss's insertJobs)."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from support.statements import recorded

from alkstore_sa.names import notify_channel

EPOCH = dt.datetime(1970, 1, 1)


def job_row(env: Any, job_id: uuid.UUID) -> Any:
    [row] = env.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    return row


def statements(env: Any) -> Any:
    """Collect the SQL statements the service sends while the block runs."""
    return recorded(env.async_engine.sync_engine if env.async_engine is not None else env.engine)


@contextmanager
def listener(env: Any) -> Iterator[psycopg.Connection[Any]]:
    """A separate connection LISTENing on the schema's notification channel."""
    url = env.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url, autocommit=True) as conn:
        channel = notify_channel(env.schema)
        conn.execute(psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel)))
        yield conn


def next_payload(conn: psycopg.Connection[Any]) -> str | None:
    for notice in conn.notifies(timeout=5.0, stop_after=1):
        return notice.payload
    return None


@pytest.fixture
def queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue("q"))
    return "q"


# ------------------------------------------------------------------ basic columns


def test_send_inserts_a_created_job_with_its_data(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, {"to": "a@example.com", "n": [1, 2]}))
    row = job_row(env, job_id)
    assert isinstance(job_id, uuid.UUID)
    assert row.name == queue
    assert row.state == "created"
    assert row.data == {"to": "a@example.com", "n": [1, 2]}
    assert row.priority == 0
    assert row.retry_count == 0
    assert row.started_on is None and row.completed_on is None and row.output is None
    assert row.singleton_key is None and row.singleton_on is None


def test_send_without_data_stores_sql_null(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue))
    [(is_null,)] = env.sql("SELECT data IS NULL FROM {s}.job WHERE id = :id", id=job_id)
    assert is_null is True


def test_send_uses_the_given_id(env: Any, queue: str) -> None:
    given = uuid.uuid4()
    assert env.tx(lambda q: q.send(queue, None, id=given)) == given
    assert job_row(env, given).id == given


def test_send_accepts_the_id_as_text(env: Any, queue: str) -> None:
    given = uuid.uuid4()
    assert env.tx(lambda q: q.send(queue, None, id=str(given))) == given


def test_send_with_a_taken_id_returns_none_and_keeps_the_first_job(env: Any, queue: str) -> None:
    given = uuid.uuid4()
    env.tx(lambda q: q.send(queue, {"n": 1}, id=given))
    assert env.tx(lambda q: q.send(queue, {"n": 2}, id=given)) is None
    assert job_row(env, given).data == {"n": 1}


def test_send_stores_the_priority(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, priority=-7))
    assert job_row(env, job_id).priority == -7


# ------------------------------------------------------------------ start_after


def test_start_after_aware_datetime_is_stored_as_given(env: Any, queue: str) -> None:
    when = dt.datetime(2031, 5, 6, 7, 8, 9, 123000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    job_id = env.tx(lambda q: q.send(queue, None, start_after=when))
    assert job_row(env, job_id).start_after == when


def test_start_after_timedelta_counts_from_the_database_clock(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, start_after=dt.timedelta(minutes=5)))
    row = job_row(env, job_id)
    assert row.start_after - row.created_on == dt.timedelta(minutes=5)


def test_start_after_seconds_as_number_or_numeric_text(env: Any, queue: str) -> None:
    values: list[Any] = [30, 30.0, "30", " 30 ", "30.0"]
    ids = env.tx(lambda q: [q.send(queue, None, start_after=v) for v in values])
    for value, job_id in zip(values, ids, strict=True):
        row = job_row(env, job_id)
        assert row.start_after - row.created_on == dt.timedelta(seconds=30), value


def test_start_after_fractional_seconds_are_kept(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, start_after=1.5))
    row = job_row(env, job_id)
    assert row.start_after - row.created_on == dt.timedelta(seconds=1.5)


def test_start_after_iso_text_is_an_absolute_time(env: Any, queue: str) -> None:
    values = ["2031-05-06T07:08:09Z", "2031-05-06T09:08:09+02:00", "2031-05-06T07:08:09.000+00:00"]
    ids = env.tx(lambda q: [q.send(queue, None, start_after=v) for v in values])
    for value, job_id in zip(values, ids, strict=True):
        expected = dt.datetime(2031, 5, 6, 7, 8, 9, tzinfo=dt.UTC)
        assert job_row(env, job_id).start_after == expected, value


def test_start_after_zero_negative_or_none_means_now(env: Any, queue: str) -> None:
    values: list[Any] = [0, -5, "0", "-1.5", dt.timedelta(0), dt.timedelta(seconds=-3), None]
    ids = env.tx(lambda q: [q.send(queue, None, start_after=v) for v in values])
    for value, job_id in zip(values, ids, strict=True):
        row = job_row(env, job_id)
        assert row.start_after == row.created_on, value


def test_deferred_job_is_not_fetched_until_due(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, start_after=3600))
    assert env.tx(lambda q: q.fetch(queue)) == []
    # Move the clock instead of waiting: make the job due one second ago.
    env.sql("UPDATE {s}.job SET start_after = now() - interval '1s' WHERE id = :id", id=job_id)
    [job] = env.tx(lambda q: q.fetch(queue))
    assert job.id == job_id


def test_job_due_in_a_fraction_of_a_second_is_fetched_once_due(env: Any, queue: str) -> None:
    import time

    job_id = env.tx(lambda q: q.send(queue, None, start_after=0.3))
    assert env.tx(lambda q: q.fetch(queue)) == []
    time.sleep(0.35)
    assert [j.id for j in env.tx(lambda q: q.fetch(queue))] == [job_id]


def test_send_after_sets_start_after(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send_after(queue, {"a": 1}, dt.timedelta(seconds=90), priority=3))
    row = job_row(env, job_id)
    assert row.start_after - row.created_on == dt.timedelta(seconds=90)
    assert (row.data, row.priority) == ({"a": 1}, 3)


# ------------------------------------------------------------------ singleton and retention


def test_send_stores_the_singleton_key(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, singleton_key="order-42"))
    assert job_row(env, job_id).singleton_key == "order-42"


def test_singleton_seconds_sets_singleton_on_to_the_utc_naive_slot_start(
    env: Any, queue: str
) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, singleton_seconds=300))
    row = job_row(env, job_id)
    slot = 300 * math.floor(row.created_on.timestamp() / 300)
    assert row.singleton_on.tzinfo is None
    assert row.singleton_on == EPOCH + dt.timedelta(seconds=slot)


def test_job_options_are_stored_on_the_row(env: Any, queue: str) -> None:
    job_id = env.tx(
        lambda q: q.send(
            queue,
            None,
            expire_seconds=61,
            deletion_seconds=62,
            retry_limit=7,
            retry_delay=8,
            retry_backoff=True,
            retry_delay_max=99,
        )
    )
    row = job_row(env, job_id)
    assert (row.expire_seconds, row.deletion_seconds) == (61, 62)
    assert (row.retry_limit, row.retry_delay, row.retry_backoff, row.retry_delay_max) == (
        7,
        8,
        True,
        99,
    )


def test_keep_until_is_start_after_plus_retention(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, start_after=600, retention_seconds=120))
    row = job_row(env, job_id)
    assert row.keep_until - row.start_after == dt.timedelta(seconds=120)


def test_keep_until_uses_the_queue_retention_by_default(env: Any) -> None:
    env.tx(lambda q: q.create_queue("r", retention_seconds=3600))
    job_id = env.tx(lambda q: q.send("r", None, start_after=600))
    row = job_row(env, job_id)
    assert row.keep_until - row.start_after == dt.timedelta(seconds=3600)


def test_per_job_dead_letter_is_stored(env: Any, queue: str) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    job_id = env.tx(lambda q: q.send(queue, None, dead_letter="dlq"))
    assert job_row(env, job_id).dead_letter == "dlq"


# ------------------------------------------------------------------ queue defaults


def test_queue_defaults_fill_in_options_the_job_does_not_give(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(
        lambda q: q.create_queue(
            "d",
            policy="short",
            dead_letter="dlq",
            retry_limit=5,
            retry_delay=7,
            retry_backoff=True,
            retry_delay_max=100,
            expire_seconds=60,
            deletion_seconds=120,
        )
    )
    row = job_row(env, env.tx(lambda q: q.send("d", None)))
    assert (row.retry_limit, row.retry_delay, row.retry_backoff, row.retry_delay_max) == (
        5,
        7,
        True,
        100,
    )
    assert (row.expire_seconds, row.deletion_seconds) == (60, 120)
    assert (row.dead_letter, row.policy) == ("dlq", "short")


def test_job_options_override_the_queue_defaults(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq1"))
    env.tx(lambda q: q.create_queue("dlq2"))
    env.tx(
        lambda q: q.create_queue(
            "d", dead_letter="dlq1", retry_limit=5, retry_delay=7, expire_seconds=60
        )
    )
    job_id = env.tx(
        lambda q: q.send(
            "d", None, dead_letter="dlq2", retry_limit=0, retry_delay=0, expire_seconds=1
        )
    )
    row = job_row(env, job_id)
    assert (row.dead_letter, row.retry_limit, row.retry_delay, row.expire_seconds) == (
        "dlq2",
        0,
        0,
        1,
    )


def test_default_queue_gives_pgboss_job_defaults(env: Any, queue: str) -> None:
    row = job_row(env, env.tx(lambda q: q.send(queue, None)))
    assert (row.retry_limit, row.retry_delay, row.retry_backoff, row.retry_delay_max) == (
        2,
        0,
        False,
        None,
    )
    assert (row.expire_seconds, row.deletion_seconds) == (900, 604800)
    assert row.keep_until - row.start_after == dt.timedelta(seconds=1209600)
    assert (row.policy, row.dead_letter) == ("standard", None)


def test_policy_is_copied_from_the_queue_onto_the_job(env: Any) -> None:
    for policy in ("standard", "short", "singleton", "stately", "exclusive"):
        env.tx(lambda q, p=policy: q.create_queue(p, policy=p))
        assert job_row(env, env.tx(lambda q, p=policy: q.send(p, None))).policy == policy


# ------------------------------------------------------------------ send_many


def test_send_many_returns_ids_in_input_order(env: Any, queue: str) -> None:
    ids = env.tx(lambda q: q.send_many(queue, [{"data": {"n": n}} for n in range(20)]))
    rows = env.sql("SELECT id, data FROM {s}.job")
    by_id = {r.id: r.data for r in rows}
    assert [by_id[i] for i in ids] == [{"n": n} for n in range(20)]


def test_send_many_stores_every_kind_of_data_as_given_and_none_as_sql_null(
    env: Any, queue: str
) -> None:
    # The batch's data travel as one JSON array: each element must come back as it
    # was sent, in its job, and None (no data) must stay SQL NULL, not JSON null.
    datas: list[Any] = [
        None,
        "null",
        0,
        False,
        [],
        {},
        {"quote": 'a "b" \\ c', "nl": "x\ny", "uni": "é ✓ 𝄞"},
        [1, [2, [3, None]]],
        "[1,2]",
        None,
    ]
    jobs: list[dict[str, Any]] = [{"data": d} for d in datas]
    jobs[3]["priority"] = 5  # a job with options takes the other path of the same statement
    ids = env.tx(lambda q: q.send_many(queue, jobs))
    rows = {r.id: r for r in env.sql("SELECT id, data, data IS NULL AS is_null FROM {s}.job")}
    assert [rows[i].data for i in ids] == datas
    assert [rows[i].is_null for i in ids] == [d is None for d in datas]


def test_send_many_uses_a_single_statement(env: Any, queue: str) -> None:
    svc = env.service()
    svc.get_queue(queue)  # warm up: the schema check runs once per engine
    with statements(env) as seen:
        svc.send_many(queue, [{"data": n} for n in range(100)])
    env.commit()
    assert len(seen) == 1
    assert env.sql("SELECT count(*) FROM {s}.job") == [(100,)]


def test_send_many_returns_none_for_rejected_jobs(env: Any) -> None:
    env.tx(lambda q: q.create_queue("s", policy="short"))
    taken = uuid.uuid4()
    env.tx(lambda q: q.send("s", None, id=taken, singleton_key="x"))
    ids = env.tx(
        lambda q: q.send_many(
            "s",
            [
                {"data": 1, "singleton_key": "a"},
                {"data": 2, "singleton_key": "a"},  # same key in the same batch
                {"data": 3, "id": taken, "singleton_key": "b"},  # id taken
                {"data": 4, "singleton_key": "x"},  # key already queued
                {"data": 5, "singleton_key": "c"},
            ],
        )
    )
    assert ids[0] is not None and ids[4] is not None
    assert ids[1:4] == [None, None, None]
    assert env.sql("SELECT count(*) FROM {s}.job") == [(3,)]


def test_send_many_gives_an_id_repeated_in_the_batch_to_its_first_job_only(
    env: Any, queue: str
) -> None:
    given = uuid.uuid4()
    ids = env.tx(lambda q: q.send_many(queue, [{"id": given, "data": 1}, {"id": given, "data": 2}]))
    assert ids == [given, None]
    assert job_row(env, given).data == 1


def test_send_many_applies_per_job_options(env: Any, queue: str) -> None:
    ids = env.tx(
        lambda q: q.send_many(
            queue,
            [
                {"data": "a", "priority": 5, "retry_limit": 9},
                {"data": "b", "start_after": 60, "singleton_key": "k"},
            ],
        )
    )
    a, b = (job_row(env, i) for i in ids)
    assert (a.priority, a.retry_limit, a.data) == (5, 9, "a")
    assert (b.priority, b.retry_limit, b.singleton_key) == (0, 2, "k")
    assert b.start_after - b.created_on == dt.timedelta(seconds=60)


def test_send_many_of_nothing_returns_an_empty_list(env: Any, queue: str) -> None:
    assert env.tx(lambda q: q.send_many(queue, [])) == []


# ------------------------------------------------------------------ throttle and debounce


def test_send_throttled_refuses_a_second_job_in_the_same_slot(env: Any, queue: str) -> None:
    svc = env.service()
    first = svc.send_throttled(queue, {"n": 1}, 3600, "k")
    second = svc.send_throttled(queue, {"n": 2}, 3600, "k")
    env.commit()
    assert first is not None and second is None
    assert [r.data for r in env.sql("SELECT data FROM {s}.job")] == [{"n": 1}]


def test_send_throttled_slots_are_per_key(env: Any, queue: str) -> None:
    svc = env.service()
    ids = [svc.send_throttled(queue, None, 3600, key) for key in ("a", "b", None)]
    env.commit()
    assert None not in ids


def test_send_throttled_holds_across_transactions(env: Any, queue: str) -> None:
    assert env.tx(lambda q: q.send_throttled(queue, None, 86400, "k")) is not None
    assert env.tx(lambda q: q.send_throttled(queue, None, 86400, "k")) is None


def test_send_debounced_puts_the_second_job_in_the_next_slot(env: Any, queue: str) -> None:
    seconds = 3600
    svc = env.service()
    first = svc.send_debounced(queue, {"n": 1}, seconds, "k")
    second = svc.send_debounced(queue, {"n": 2}, seconds, "k")
    third = svc.send_debounced(queue, {"n": 3}, seconds, "k")
    env.commit()
    assert first is not None and second is not None and third is None
    a, b = job_row(env, first), job_row(env, second)
    assert b.singleton_on == a.singleton_on + dt.timedelta(seconds=seconds)
    # The second job waits for its slot to open (plus pg-boss's one-second margin).
    next_slot = (b.singleton_on - EPOCH).total_seconds()
    opens = dt.datetime.fromtimestamp(next_slot, dt.UTC)
    assert opens < b.start_after <= opens + dt.timedelta(seconds=2)
    assert a.start_after == a.created_on


def test_send_debounced_start_after_is_about_the_slot_remainder(env: Any, queue: str) -> None:
    svc = env.service()
    svc.send_debounced(queue, None, 60, "k")
    second = svc.send_debounced(queue, None, 60, "k")
    env.commit()
    row = job_row(env, second)
    elapsed = row.created_on.timestamp() % 60
    wait = (row.start_after - row.created_on).total_seconds()
    assert 60 - elapsed < wait <= 60 - elapsed + 2


def test_send_debounced_first_job_of_a_slot_is_sent_now(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send_debounced(queue, None, 60, "k"))
    row = job_row(env, job_id)
    assert row.start_after == row.created_on
    assert row.singleton_key == "k"


# ------------------------------------------------------------------ transactions and NOTIFY


@pytest.fixture
def business(env: Any) -> str:
    env.sql("CREATE TABLE {s}.orders (id int PRIMARY KEY)")
    return "orders"


def _insert_order(env: Any, order_id: int) -> None:
    statement = text(f'INSERT INTO "{env.schema}".orders (id) VALUES (:id)')
    env.session.execute(statement, {"id": order_id})


def test_send_in_a_rolled_back_transaction_leaves_no_job_and_no_notification(
    env: Any, business: str
) -> None:
    env.tx(lambda q: q.create_queue("a"))
    env.tx(lambda q: q.create_queue("b"))
    with listener(env) as conn:
        svc = env.service()
        _insert_order(env, 1)
        svc.send("a", {"order": 1})
        env.rollback()
        # A later committed send is the first (and only) notification to arrive.
        env.tx(lambda q: q.send("b", None))
        assert next_payload(conn) == "b"
    assert env.sql("SELECT count(*) FROM {s}.job WHERE name = 'a'") == [(0,)]
    assert env.sql("SELECT count(*) FROM {s}.orders") == [(0,)]


def test_send_in_a_committed_transaction_notifies_with_the_queue_name(
    env: Any, business: str
) -> None:
    env.tx(lambda q: q.create_queue("emails"))
    with listener(env) as conn:
        svc = env.service()
        _insert_order(env, 1)
        job_id = svc.send("emails", {"order": 1})
        env.commit()
        assert next_payload(conn) == "emails"
    assert job_row(env, job_id).data == {"order": 1}
    assert env.sql("SELECT id FROM {s}.orders") == [(1,)]


def test_deferred_send_does_not_notify(env: Any) -> None:
    env.tx(lambda q: q.create_queue("later"))
    env.tx(lambda q: q.create_queue("now"))
    with listener(env) as conn:
        env.tx(lambda q: q.send("later", None, start_after=3600))
        env.tx(lambda q: q.send("now", None))
        assert next_payload(conn) == "now"


def test_send_with_notify_off_does_not_notify(env: Any) -> None:
    env.tx(lambda q: q.create_queue("quiet"))
    env.tx(lambda q: q.create_queue("loud"))
    with listener(env) as conn:
        env.tx(lambda q: q.send("quiet", None), notify=False)
        env.tx(lambda q: q.send("loud", None))
        assert next_payload(conn) == "loud"


def test_conflict_leaves_the_transaction_usable(env: Any, business: str) -> None:
    env.tx(lambda q: q.create_queue("s", policy="short"))
    svc = env.service()
    first = svc.send("s", {"n": 1}, singleton_key="k")
    second = svc.send("s", {"n": 2}, singleton_key="k")
    _insert_order(env, 7)
    third = svc.send("s", {"n": 3}, singleton_key="other")
    env.commit()
    assert first is not None and second is None and third is not None
    assert env.sql("SELECT id FROM {s}.orders") == [(7,)]
    assert sorted(r.data["n"] for r in env.sql("SELECT data FROM {s}.job")) == [1, 3]
