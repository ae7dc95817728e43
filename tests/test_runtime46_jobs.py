"""The write, claim and settle paths at schema 46 (pg-boss 12.38's statements).

Every test runs on a fresh schema made by our migrations at 46 (``env46``), once
with QueueService and once with AsyncQueueService. What pg-boss 12.38 does on each
path is the specification (docs/concepts/compatibility.md).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine
from support.blocking import run_blocked
from support.node import node_schema

from alkstore_sa import InvalidOptionsError, Job, QueuePolicy, UnreadableJob
from alkstore_sa.ops import Settlement
from alkstore_sa.sql.v46 import fetch as fetch46_sql
from alkstore_sa.sql.v46 import node_channel

KINDS = pytest.mark.parametrize("partition", [False, True], ids=["shared", "partitioned"])

POLICY_TABLE = {
    # policy: (first sent, second queued sent, fetched, sent while active, fetched while active)
    "standard": (True, True, 2, True, 1),
    "short": (True, False, 1, True, 1),
    "singleton": (True, True, 1, True, 0),
    "stately": (True, False, 1, True, 0),
    "exclusive": (True, False, 1, False, 0),
}


def make_queue(env: Any, policy: str = "standard", partition: bool = False, **opts: Any) -> str:
    name = f"{policy}-{'partitioned' if partition else 'shared'}"
    env.tx(lambda q: q.create_queue(name, policy=policy, partition=partition, **opts))
    return name


def row(env: Any, job_id: uuid.UUID, columns: str) -> Any:
    [found] = env.sql(f"SELECT {columns} FROM {{s}}.job WHERE id = :id", id=job_id)
    return found


# ------------------------------------------------------------------ send


def test_send_writes_the_columns_of_46_with_created_on_from_job_now(env46: Any) -> None:
    queue = make_queue(env46)
    env46.sql("UPDATE {s}.queue SET heartbeat_seconds = 30 WHERE name = :q", q=queue)
    job_id = env46.tx(lambda q: q.send(queue, {"a": 1}))
    r = row(
        env46,
        job_id,
        "created_on, start_after, keep_until, policy, heartbeat_seconds, blocked, blocking, "
        "pending_dependencies, upsert_by_key, source_root_id, trace_context, group_id",
    )
    # job_now() is the transaction's clock: one instant for both.
    assert r.created_on == r.start_after
    assert r.keep_until - r.start_after == dt.timedelta(seconds=1_209_600)
    assert (r.policy, r.heartbeat_seconds) == ("standard", 30)
    assert (r.blocked, r.blocking, r.pending_dependencies) == (False, False, 0)
    assert (r.upsert_by_key, r.source_root_id, r.trace_context, r.group_id) == (None,) * 4


def test_send_many_after_and_throttled_write_jobs_at_46(env46: Any) -> None:
    queue = make_queue(env46, retry_limit=5)
    ids = env46.tx(lambda q: q.send_many(queue, [{"data": i, "priority": i} for i in range(3)]))
    assert None not in ids and len(set(ids)) == 3
    later = env46.tx(lambda q: q.send_after(queue, None, dt.timedelta(hours=1)))
    r = row(env46, later, "start_after - created_on AS wait, retry_limit")
    assert r.wait == dt.timedelta(hours=1) and r.retry_limit == 5
    first = env46.tx(lambda q: q.send_throttled(queue, None, 3600, "t"))
    again = env46.tx(lambda q: q.send_throttled(queue, None, 3600, "t"))
    assert first is not None and again is None
    debounced = env46.tx(lambda q: q.send_debounced(queue, None, 3600, "t"))
    assert debounced is not None
    assert row(env46, debounced, "start_after > created_on AS later").later


@KINDS
def test_every_policy_follows_the_policy_table_at_46(env46: Any, partition: bool) -> None:
    for policy, expected in POLICY_TABLE.items():
        queue = make_queue(env46, policy, partition)
        first = env46.tx(lambda q, n=queue: q.send(n, 1, singleton_key="k"))
        while_queued = env46.tx(lambda q, n=queue: q.send(n, 2, singleton_key="k"))
        fetched = env46.tx(lambda q, n=queue: q.fetch(n, 10))
        while_active = env46.tx(lambda q, n=queue: q.send(n, 3, singleton_key="k"))
        fetched_active = env46.tx(lambda q, n=queue: q.fetch(n, 10))
        got = (
            first is not None,
            while_queued is not None,
            len(fetched),
            while_active is not None,
            len(fetched_active),
        )
        assert got == expected, policy


def test_a_send_to_a_missing_queue_raises_queue_not_found_at_46(env46: Any) -> None:
    from alkstore_sa import QueueNotFoundError

    with pytest.raises(QueueNotFoundError):
        env46.tx(lambda q: q.send("nope", None))


# ------------------------------------------------------------------ notify


def _listen(database_url: str, channel: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://"))
    conn.autocommit = True
    conn.execute(f'LISTEN "{channel}"')
    return conn


def _notices(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    return [(n.channel, n.payload) for n in conn.notifies(timeout=0.5, stop_after=None)]


def test_a_notify_queue_is_announced_on_nodes_channel_and_ours(
    env46: Any, database_url: str
) -> None:
    queue = make_queue(env46)
    plain = make_queue(env46, "short")
    env46.sql("UPDATE {s}.queue SET notify = true WHERE name = :q", q=queue)
    node = node_channel(env46.schema)
    ours = f"alkstore_{env46.schema}"
    listener = _listen(database_url, node)
    listener.execute(f'LISTEN "{ours}"')
    try:
        env46.tx(lambda q: q.send(queue, None))
        assert sorted(_notices(listener)) == sorted([(node, queue), (ours, queue)])
        # A queue without notify: ours only. A deferred job: nobody (polling finds it).
        env46.tx(lambda q: q.send(plain, None))
        assert _notices(listener) == [(ours, plain)]
        env46.tx(lambda q: q.send_after(queue, None, dt.timedelta(hours=1)))
        assert _notices(listener) == []
        # Node's channel follows the queue's setting even when ours is off.
        env46.tx(lambda q: q.send(queue, None), notify=False)
        assert _notices(listener) == [(node, queue)]
    finally:
        listener.close()


def test_nodes_channel_is_the_one_pgboss_computes(env46: Any) -> None:
    # From the schema as a Node configuration names it (in quotes unless a lower-case word).
    [(expected,)] = env46.sql(
        "SELECT 'pgboss_' || left(encode(sha224(CAST(:s AS bytea)), 'hex'), 24)",
        s=node_schema(env46.schema),
    )
    assert node_channel(env46.schema) == expected


# ------------------------------------------------------------------ fetch


def test_fetch_activates_and_stamps_started_on_and_heartbeat_on(env46: Any) -> None:
    queue = make_queue(env46)
    env46.sql("UPDATE {s}.queue SET heartbeat_seconds = 20 WHERE name = :q", q=queue)
    job_id = env46.tx(lambda q: q.send(queue, {"x": 1}))
    [job] = env46.tx(lambda q: q.fetch(queue))
    assert isinstance(job, Job) and job.id == job_id and job.data == {"x": 1}
    assert job.state == "active" and job.retry_count == 0
    assert job.started_on is not None and job.heartbeat_on == job.started_on
    assert job.heartbeat_seconds == 20
    r = row(env46, job_id, "state, heartbeat_on, started_on")
    assert (r.state, r.heartbeat_on) == ("active", r.started_on)


def test_fetch_counts_a_retry_only_when_the_job_ran_before(env46: Any) -> None:
    queue = make_queue(env46, retry_limit=3)
    env46.tx(lambda q: q.send(queue, None))
    [job] = env46.tx(lambda q: q.fetch(queue))
    env46.tx(lambda q: q.fail(queue, job))
    env46.sql("UPDATE {s}.job SET start_after = now() - interval '1 minute'")
    [again] = env46.tx(lambda q: q.fetch(queue))
    assert (job.retry_count, again.retry_count) == (0, 1)


@KINDS
def test_blocked_jobs_are_never_claimed(env46: Any, partition: bool) -> None:
    queue = make_queue(env46, partition=partition)
    blocked = env46.tx(lambda q: q.send(queue, "child"))
    free = env46.tx(lambda q: q.send(queue, "free"))
    env46.sql("UPDATE {s}.job SET blocked = true WHERE id = :id", id=blocked)
    fetched = env46.tx(lambda q: q.fetch(queue, 10))
    assert [j.id for j in fetched] == [free]
    assert env46.tx(lambda q: q.fetch(queue, 10, ignore_start_after=True)) == []
    assert row(env46, blocked, "state").state == "created"


def test_a_job_due_exactly_now_is_fetched_in_the_same_transaction(env46: Any) -> None:
    queue = make_queue(env46)
    svc = env46.service()
    job_id = svc.send(queue, None)
    # start_after = job_now() = this transaction's instant: due (pg-boss's <=).
    assert [j.id for j in svc.fetch(queue)] == [job_id]
    env46.commit()


def test_fetch_orders_by_priority_then_creation_whatever_the_priority_flag(env46: Any) -> None:
    queue = make_queue(env46)
    low = env46.tx(lambda q: q.send(queue, "low", priority=0))
    high = env46.tx(lambda q: q.send(queue, "high", priority=5))
    [first] = env46.tx(lambda q: q.fetch(queue, 1, priority=False))
    assert first.id == high
    [second] = env46.tx(lambda q: q.fetch(queue, 1))
    assert second.id == low


def test_a_deferred_job_waits_for_its_start_after(env46: Any) -> None:
    queue = make_queue(env46)
    env46.tx(lambda q: q.send_after(queue, None, 3600))
    assert env46.tx(lambda q: q.fetch(queue)) == []
    assert len(env46.tx(lambda q: q.fetch(queue, ignore_start_after=True))) == 1


@KINDS
def test_the_claim_reads_the_backlog_through_job_i11(
    env46: Any, engine: Engine, partition: bool
) -> None:
    queue = make_queue(env46, partition=partition)
    env46.tx(lambda q: q.send_many(queue, [{"data": i} for i in range(3000)]))
    env46.tx(lambda q: q.complete(queue, [j.id for j in q.fetch(queue, 1500)]))
    env46.sql("ANALYZE {s}.job")
    stmt = fetch46_sql.fetch_jobs(policy="standard", ignore_start_after=False)
    compiled = stmt.compile(
        dialect=engine.dialect,
        schema_translate_map={"pgboss": env46.schema},
        render_schema_translate=True,
    )
    params = compiled.construct_params({"qname": queue, "limit": 10, "cached_policy": "standard"})
    with engine.begin() as conn:
        plan = "\n".join(
            r[0] for r in conn.exec_driver_sql("EXPLAIN " + compiled.string, params).all()
        )
        conn.rollback()
    assert "_i11" in plan, plan
    assert "Sort" not in plan.split("CTE next")[1].split("CTE claimed")[0], plan


# ------------------------------------------------------------------ key_strict_fifo


def test_an_unkeyed_send_to_a_key_strict_fifo_queue_is_refused_before_sql(env46: Any) -> None:
    queue = make_queue(env46, "key_strict_fifo", True)
    assert env46.tx(lambda q: q.get_queue(queue)).policy is QueuePolicy.KEY_STRICT_FIFO
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match="singleton_key"):
        svc.send(queue, None)
    with pytest.raises(InvalidOptionsError, match="singleton_key"):
        svc.send_many(queue, [{"singleton_key": "a"}, {"data": 1}])
    # The transaction is intact and nothing of the refused batch was written.
    assert svc.send(queue, None, singleton_key="a") is not None
    env46.commit()
    assert env46.sql("SELECT count(*) FROM {s}.job WHERE name = :q", q=queue) == [(1,)]


def test_an_unkeyed_send_is_refused_even_when_the_cached_policy_is_stale(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("fifo"))
    env46.tx(lambda q: q.send("fifo", None))  # caches "standard"
    env46.sql("DELETE FROM {s}.job WHERE name = 'fifo'")
    env46.sql("SELECT {s}.delete_queue('fifo')")
    env46.sql("""SELECT {s}.create_queue('fifo', '{"policy": "key_strict_fifo"}')""")
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match="key_strict_fifo"):
        svc.send("fifo", None)
    assert svc.send("fifo", None, singleton_key="k") is not None
    env46.commit()
    assert env46.sql("SELECT count(*) FROM {s}.job WHERE name = 'fifo'") == [(1,)]


@KINDS
def test_key_strict_fifo_runs_each_keys_jobs_one_at_a_time_in_order(
    env46: Any, partition: bool
) -> None:
    queue = make_queue(env46, "key_strict_fifo", partition)
    a1 = env46.tx(lambda q: q.send(queue, "a1", singleton_key="a"))
    a2 = env46.tx(lambda q: q.send(queue, "a2", singleton_key="a"))
    b1 = env46.tx(lambda q: q.send(queue, "b1", singleton_key="b"))
    first = env46.tx(lambda q: q.fetch(queue, 10))
    assert sorted(j.data for j in first) == ["a1", "b1"]
    assert env46.tx(lambda q: q.fetch(queue, 10)) == []  # both keys held by active jobs
    env46.tx(lambda q: q.complete(queue, [j for j in first if j.id == a1]))
    assert [j.id for j in env46.tx(lambda q: q.fetch(queue, 10))] == [a2]
    # A failed job holds its key until it is dealt with.
    [b] = [j for j in first if j.id == b1]
    env46.tx(lambda q: q.update_queue(queue, retry_limit=0))
    env46.sql("UPDATE {s}.job SET retry_limit = 0 WHERE id = :id", id=b1)
    env46.tx(lambda q: q.fail(queue, b))
    env46.tx(lambda q: q.send(queue, "b2", singleton_key="b"))
    assert env46.tx(lambda q: q.fetch(queue, 10)) == []
    env46.tx(lambda q: q.delete_job(queue, b1))
    assert [j.data for j in env46.tx(lambda q: q.fetch(queue, 10))] == ["b2"]


def test_a_key_strict_fifo_retry_job_is_its_keys_head(env46: Any) -> None:
    queue = make_queue(env46, "key_strict_fifo", retry_limit=2)
    first = env46.tx(lambda q: q.send(queue, "first", singleton_key="k"))
    env46.tx(lambda q: q.send(queue, "second", singleton_key="k"))
    [job] = env46.tx(lambda q: q.fetch(queue))
    env46.tx(lambda q: q.fail(queue, job))
    env46.sql("UPDATE {s}.job SET start_after = now() - interval '1 minute'")
    [again] = env46.tx(lambda q: q.fetch(queue, 10))
    assert (again.id, again.retry_count) == (first, 1)


def test_a_key_strict_fifo_conflict_with_another_client_is_an_empty_fetch(
    env46: Any, engine: Engine
) -> None:
    queue = make_queue(env46, "key_strict_fifo")
    env46.tx(lambda q: q.send(queue, "a1", singleton_key="a"))
    a2 = env46.tx(lambda q: q.send(queue, "a2", singleton_key="a"))
    # Another client (no key locks, as Node) activates the key's second job and
    # commits while our claim waits on that job_i8 entry.
    other = engine.connect()
    other.exec_driver_sql(
        f"UPDATE \"{env46.schema}\".job SET state = 'active', started_on = now() WHERE id = '{a2}'"
    )
    svc = env46.service()
    try:
        # Commit only once our claim is seen waiting for the other client's transaction
        # (no timing: the wait is read from pg_blocking_pids).
        claim = run_blocked(engine, other, lambda: svc.fetch(queue, 10))
        assert claim.waited, ("our claim never waited on the other client's job_i8 entry", claim)
        assert claim.error is None and claim.result == []
        # The caller's transaction is still usable.
        assert svc.send(queue, "b", singleton_key="b") is not None
        env46.commit()
    finally:
        other.close()


def test_key_strict_fifo_is_refused_at_26(env: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="version 46"):
        env.tx(lambda q: q.create_queue("fifo", policy="key_strict_fifo"))


# ------------------------------------------------------------------ settle


def test_complete_writes_only_completed_on_state_and_output(env46: Any) -> None:
    queue = make_queue(env46)
    job_id = env46.tx(lambda q: q.send(queue, None))
    [job] = env46.tx(lambda q: q.fetch(queue))
    before = row(env46, job_id, "*")
    assert env46.tx(lambda q: q.complete(queue, job, {"ok": True})).count == 1
    after = row(env46, job_id, "*")
    changed = {k for k in before._mapping if before._mapping[k] != after._mapping[k]}
    assert changed == {"completed_on", "state", "output"}
    assert (after.state, after.output) == ("completed", {"ok": True})


def test_a_stale_fenced_complete_changes_nothing_at_46(env46: Any) -> None:
    queue = make_queue(env46)
    env46.tx(lambda q: q.send(queue, None))
    [job] = env46.tx(lambda q: q.fetch(queue))
    stale = Settlement(job.id, "stale", job.started_on - dt.timedelta(seconds=1))
    assert env46.tx(lambda q: q.complete_many(queue, [stale])).count == 0
    assert env46.tx(lambda q: q.complete_many(queue, [(job, "ok")])).count == 1


def test_cancel_and_resume_move_a_passed_start_after_up_and_clear_upsert_by_key(
    env46: Any,
) -> None:
    queue = make_queue(env46)
    past = env46.tx(lambda q: q.send(queue, None))
    future = env46.tx(lambda q: q.send_after(queue, None, dt.timedelta(hours=1)))
    env46.sql(
        "UPDATE {s}.job SET start_after = now() - interval '1 hour', upsert_by_key = true "
        "WHERE id = :id",
        id=past,
    )
    assert env46.tx(lambda q: q.cancel(queue, [past, future])).count == 2
    assert row(env46, past, "state").state == "cancelled"
    future_start = row(env46, future, "start_after").start_after
    assert env46.tx(lambda q: q.resume(queue, [past, future])).count == 2
    r = row(
        env46,
        past,
        "state, completed_on, upsert_by_key, start_after > now() - interval '1 minute' AS moved",
    )
    assert (r.state, r.completed_on, r.upsert_by_key, r.moved) == ("created", None, None, True)
    assert row(env46, future, "start_after").start_after == future_start


def test_retry_allows_one_more_attempt_from_now(env46: Any) -> None:
    queue = make_queue(env46, retry_limit=0)
    job_id = env46.tx(lambda q: q.send(queue, None))
    [job] = env46.tx(lambda q: q.fetch(queue))
    env46.tx(lambda q: q.fail(queue, job))
    env46.sql(
        "UPDATE {s}.job SET start_after = now() - interval '1 hour' WHERE id = :id", id=job_id
    )
    assert env46.tx(lambda q: q.retry(queue, job_id)).count == 1
    r = row(
        env46,
        job_id,
        "state, retry_limit, completed_on, start_after > now() - interval '1 minute' AS moved",
    )
    assert (r.state, r.retry_limit, r.completed_on, r.moved) == ("retry", 1, None, True)
    [again] = env46.tx(lambda q: q.fetch(queue))
    assert again.id == job_id


def _counted(env: Any, queue: str, retained: int, total: int) -> None:
    """Pretend the monitor counted the queue: every job finished so far is retained."""
    env.sql(
        "UPDATE {s}.queue SET retained_count = :r, total_count = :t, retained_on = now() "
        "WHERE name = :q",
        r=retained,
        t=total,
        q=queue,
    )


def _counts(env: Any, queue: str) -> tuple[int | None, int]:
    [(retained, total)] = env.sql(
        "SELECT retained_count, total_count FROM {s}.queue WHERE name = :q", q=queue
    )
    return retained, total


def test_deleting_and_resuming_counted_jobs_lowers_the_queues_counts(env46: Any) -> None:
    queue = make_queue(env46)
    ids = env46.tx(lambda q: q.send_many(queue, [{"data": i} for i in range(4)]))
    env46.tx(lambda q: q.complete(queue, [j.id for j in q.fetch(queue, 2)]))
    env46.tx(lambda q: q.cancel(queue, ids[2]))
    _counted(env46, queue, retained=3, total=4)
    done = [i for i in ids[:3] if row(env46, i, "state").state == "completed"]
    # A deleted counted job leaves both counts; a resumed one only retained_count.
    assert env46.tx(lambda q: q.delete_job(queue, done[0])).count == 1
    assert _counts(env46, queue) == (2, 3)
    assert env46.tx(lambda q: q.resume(queue, ids[2])).count == 1
    assert _counts(env46, queue) == (1, 3)
    # Deleting a live job leaves the counts to the monitor, as pg-boss does.
    assert env46.tx(lambda q: q.delete_job(queue, ids[3])).count == 1
    assert _counts(env46, queue) == (1, 3)
    assert env46.tx(lambda q: q.delete_stored_jobs(queue)) == 1
    assert _counts(env46, queue) == (0, 2)


def test_a_queue_never_counted_keeps_a_null_retained_count(env46: Any) -> None:
    queue = make_queue(env46)
    job_id = env46.tx(lambda q: q.send(queue, None))
    env46.tx(lambda q: q.complete(queue, [j.id for j in q.fetch(queue)]))
    env46.sql("UPDATE {s}.queue SET total_count = 5 WHERE name = :q", q=queue)
    assert env46.tx(lambda q: q.delete_job(queue, job_id)).count == 1
    assert _counts(env46, queue) == (None, 5)


def test_extend_leases_also_stamps_the_heartbeat(env46: Any) -> None:
    queue = make_queue(env46)
    job_id = env46.tx(lambda q: q.send(queue, None))
    [job] = env46.tx(lambda q: q.fetch(queue))
    env46.sql(
        "UPDATE {s}.job SET heartbeat_on = now() - interval '1 hour' WHERE id = :id", id=job_id
    )
    assert env46.tx(lambda q: q.extend_leases(queue, [job], 60)) == [job_id]
    r = row(env46, job_id, "heartbeat_on > now() - interval '1 minute' AS fresh")
    assert r.fresh


# ------------------------------------------------------------------ reads


def test_get_job_and_list_jobs_read_the_columns_of_46(env46: Any) -> None:
    queue = make_queue(env46)
    job_id = env46.tx(lambda q: q.send(queue, None))
    root = uuid.uuid4()
    env46.sql(
        "UPDATE {s}.job SET group_id = 'g', heartbeat_seconds = 15, source_name = 'src', "
        "source_root_id = :root, source_output = '{\"e\": 1}', "
        'trace_context = \'{"traceparent": "00-ab"}\' WHERE id = :id',
        root=root,
        id=job_id,
    )
    job = env46.tx(lambda q: q.get_job(queue, job_id))
    [listed] = env46.tx(lambda q: q.list_jobs(queue))
    for j in (job, listed):
        assert (j.group_id, j.heartbeat_seconds, j.source_name) == ("g", 15, "src")
        assert (j.source_root_id, j.source_output) == (root, {"e": 1})
        assert j.trace_context == {"traceparent": "00-ab"}


def test_get_queue_reads_the_settings_of_46(env46: Any) -> None:
    queue = make_queue(env46)
    env46.sql("UPDATE {s}.queue SET heartbeat_seconds = 30, notify = true WHERE name = :q", q=queue)
    info = env46.tx(lambda q: q.get_queue(queue))
    assert (info.heartbeat_seconds, info.notify) == (30, True)
    assert env46.tx(lambda q: q.update_queue(queue, retry_limit=7)).retry_limit == 7


def test_a_poison_row_is_failed_by_fetch_and_read_as_unreadable_at_46(env46: Any) -> None:
    queue = make_queue(env46)
    bad = env46.tx(lambda q: q.send(queue, "bad"))
    good = env46.tx(lambda q: q.send(queue, "good"))
    env46.sql("UPDATE {s}.job SET source_created_on = 'infinity' WHERE id = :id", id=bad)
    unreadable = env46.tx(lambda q: q.get_job(queue, bad))
    assert isinstance(unreadable, UnreadableJob)
    assert "source_created_on" in unreadable.unreadable
    fetched = env46.tx(lambda q: q.fetch(queue, 10))
    assert [j.id for j in fetched] == [good]
    assert row(env46, bad, "state").state == "failed"


# ------------------------------------------------------------------ queue and send options of 46


def test_create_queue_stores_notify_and_heartbeat_seconds_under_pgboss_keys(env46: Any) -> None:
    info = env46.tx(lambda q: q.create_queue("beating", notify=True, heartbeat_seconds=30))
    assert (info.notify, info.heartbeat_seconds) == (True, 30)
    [stored] = env46.sql("SELECT notify, heartbeat_seconds FROM {s}.queue WHERE name = 'beating'")
    assert (stored.notify, stored.heartbeat_seconds) == (True, 30)
    [read] = env46.tx(lambda q: q.get_queues(["beating"]))
    assert (read.notify, read.heartbeat_seconds) == (True, 30)


def test_update_queue_changes_and_clears_the_settings_of_46(env46: Any) -> None:
    before = env46.tx(lambda q: q.create_queue("beating", notify=True, heartbeat_seconds=30))
    after = env46.tx(lambda q: q.update_queue("beating", notify=False, heartbeat_seconds=None))
    assert (after.notify, after.heartbeat_seconds) == (False, None)
    assert after.updated_on > before.updated_on
    again = env46.tx(lambda q: q.update_queue("beating", heartbeat_seconds=45))
    assert (again.notify, again.heartbeat_seconds) == (False, 45)


def test_a_jobs_heartbeat_seconds_overrides_the_queues_and_falls_back_to_it(env46: Any) -> None:
    queue = make_queue(env46, heartbeat_seconds=30)
    own = env46.tx(lambda q: q.send(queue, None, heartbeat_seconds=20))
    inherited = env46.tx(lambda q: q.send(queue, None))
    batch = env46.tx(
        lambda q: q.send_many(queue, [{"data": 1, "heartbeat_seconds": 60}, {"data": 2}])
    )
    assert row(env46, own, "heartbeat_seconds").heartbeat_seconds == 20
    assert row(env46, inherited, "heartbeat_seconds").heartbeat_seconds == 30
    assert [row(env46, i, "heartbeat_seconds").heartbeat_seconds for i in batch] == [60, 30]


def test_deletion_seconds_zero_is_accepted_and_stored_at_46(env46: Any) -> None:
    queue = make_queue(env46, deletion_seconds=0)
    assert env46.tx(lambda q: q.get_queue(queue)).deletion_seconds == 0
    inherited = env46.tx(lambda q: q.send(queue, None))
    other = make_queue(env46, policy="short")
    own = env46.tx(lambda q: q.send(other, None, deletion_seconds=0))
    assert row(env46, inherited, "deletion_seconds").deletion_seconds == 0
    assert row(env46, own, "deletion_seconds").deletion_seconds == 0
    updated = env46.tx(lambda q: q.update_queue(other, deletion_seconds=0))
    assert updated.deletion_seconds == 0


def test_a_queue_created_with_notify_announces_sends_on_nodes_channel(
    env46: Any, database_url: str
) -> None:
    queue = make_queue(env46, notify=True)
    node = node_channel(env46.schema)
    listener = _listen(database_url, node)
    try:
        env46.tx(lambda q: q.send(queue, None))
        assert _notices(listener) == [(node, queue)]
        env46.tx(lambda q: q.update_queue(queue, notify=False))
        env46.tx(lambda q: q.send(queue, None))
        assert _notices(listener) == []
    finally:
        listener.close()


def test_send_many_stores_each_jobs_data_and_none_as_sql_null_at_46(env46: Any) -> None:
    queue = make_queue(env46)
    datas: list[Any] = [None, "null", {"q": 'a "b" \\ c', "u": "é ✓"}, [1, None], None]
    ids = env46.tx(lambda q: q.send_many(queue, [{"data": d} for d in datas]))
    rows = {r.id: r for r in env46.sql("SELECT id, data, data IS NULL AS n FROM {s}.job")}
    assert [rows[i].data for i in ids] == datas
    assert [rows[i].n for i in ids] == [d is None for d in datas]
