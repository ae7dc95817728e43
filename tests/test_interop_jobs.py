"""Interop, jobs: sent on one side, worked on the other, with identical rows.

pg-boss's insertJobs (derived columns), fetchNextJob, complete/fail outputs, failJobs
(retry, additive backoff, dead letter). Each test uses a fresh schema made by our
migration and a Node pg-boss 11.1.2 instance without supervision.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.node import (
    NodeBoss,
    NodeFactory,
    in_tx,
    node,
    node_modules,
    node_url,
    parse_time,
    to_node_options,
)

from alkstore_sa import Job

__all__ = ["node", "node_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop

QUEUE_OPTIONS: dict[str, Any] = {
    "retry_limit": 1,
    "retry_delay": 3,
    "retry_backoff": True,
    "retry_delay_max": 20,
    "expire_seconds": 120,
    "retention_seconds": 3600,
    "deletion_seconds": 600,
    "dead_letter": "dlq",
}

EVERY_SEND_OPTION: dict[str, Any] = {
    "priority": 7,
    "start_after": 30,
    "singleton_key": "order-1",
    "singleton_seconds": 3600,
    "expire_seconds": 60,
    "retention_seconds": 7200,
    "deletion_seconds": 300,
    "retry_limit": 3,
    "retry_delay": 4,
    "retry_backoff": True,
    "retry_delay_max": 30,
}

# Columns of a job row that depend only on the options and the queue.
DERIVED = (
    "name, priority, data, state, retry_limit, retry_count, retry_delay, retry_backoff, "
    "retry_delay_max, expire_seconds, deletion_seconds, dead_letter, policy, "
    "extract(epoch FROM start_after - created_on) AS deferred_by, "
    "extract(epoch FROM keep_until - start_after) AS retained_for, "
    "singleton_on IS NOT NULL AS throttled"
)


def row_of(engine: Engine, schema: str, job_id: Any) -> dict[str, Any]:
    with engine.connect() as conn:
        row = conn.execute(
            text(f'SELECT {DERIVED} FROM "{schema}".job WHERE id = :id'), {"id": str(job_id)}
        )
        return dict(row.mappings().one())


def make_queues(engine: Engine, schema: str, name: str, **options: Any) -> None:
    def create(q: Any) -> None:
        q.create_queue("dlq", retry_limit=5, retention_seconds=100, deletion_seconds=50)
        q.create_queue(name, **{**QUEUE_OPTIONS, **options})

    in_tx(engine, schema, create)


def assert_same_time(node_value: str | None, ours: dt.datetime | None) -> None:
    # JavaScript dates carry milliseconds; PostgreSQL keeps microseconds.
    theirs = parse_time(node_value)
    if ours is None or theirs is None:
        assert theirs is ours is None
        return
    if ours.tzinfo is None:  # singleton_on is stored without a time zone, as UTC
        ours = ours.replace(tzinfo=dt.UTC)
    assert abs(theirs - ours) < dt.timedelta(milliseconds=1), (node_value, ours)


def assert_node_sees(node_job: dict[str, Any], job: Job) -> None:
    """Node's ``fetch(..., {includeMetadata: true})`` view equals our row."""
    assert node_job["id"] == str(job.id)
    plain = {
        "name": job.name,
        "data": job.data,
        "policy": job.policy,
        "priority": job.priority,
        "retryLimit": job.retry_limit,
        "retryDelay": job.retry_delay,
        "retryBackoff": job.retry_backoff,
        "retryDelayMax": job.retry_delay_max,
        "expireInSeconds": job.expire_seconds,
        "deleteAfterSeconds": job.deletion_seconds,
        "singletonKey": job.singleton_key,
        "deadLetter": job.dead_letter,
        "output": job.output,
    }
    assert {k: node_job[k] for k in plain} == plain
    for key, ours in (
        ("startAfter", job.start_after),
        ("createdOn", job.created_on),
        ("keepUntil", job.keep_until),
        ("singletonOn", job.singleton_on),
        ("completedOn", job.completed_on),
    ):
        assert_same_time(node_job[key], ours)


# --------------------------------------------------------------- Python -> Node


def test_job_sent_by_python_with_every_option_is_seen_alike_by_node_fetch(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    job_id = in_tx(engine, schema, lambda q: q.send("orders", {"n": 1}, **EVERY_SEND_OPTION))
    sent = in_tx(engine, schema, lambda q: q.get_job("orders", job_id))

    boss = node(schema)
    [fetched] = boss.call(
        "fetch", "orders", {"includeMetadata": True, "ignoreStartAfter": True, "batchSize": 5}
    )

    assert_node_sees(fetched, sent)
    assert fetched["state"] == "active" and fetched["retryCount"] == 0
    assert sent.dead_letter == "dlq" and sent.policy == "standard"
    assert sent.singleton_on is not None


@pytest.mark.parametrize("options", [EVERY_SEND_OPTION, {}], ids=["every-option", "defaults"])
def test_python_and_node_derive_the_same_columns_from_the_same_options(
    engine: Engine, schema: str, node: NodeFactory, options: dict[str, Any]
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    # Different keys, or the throttle slot taken by one would refuse the other.
    ours = in_tx(
        engine, schema, lambda q: q.send("orders", {"n": 1}, **{**options, "singleton_key": "py"})
    )
    theirs = boss.call(
        "send", "orders", {"n": 1}, to_node_options({**options, "singleton_key": "js"})
    )

    assert ours is not None and theirs is not None
    row = row_of(engine, schema, ours)
    assert row == row_of(engine, schema, theirs)
    assert row["deferred_by"] == options.get("start_after", 0)
    assert row["retained_for"] == options.get(
        "retention_seconds", QUEUE_OPTIONS["retention_seconds"]
    )


def test_singleton_slot_of_python_and_node_jobs_is_the_slot_they_were_created_in(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    ours = in_tx(engine, schema, lambda q: q.send_throttled("orders", None, 60, "py"))
    theirs = boss.call("sendThrottled", "orders", None, {}, 60, "js")
    sql = (
        f"SELECT extract(epoch FROM singleton_on) AS slot, "
        f'extract(epoch FROM created_on) AS created FROM "{schema}".job WHERE id = :id'
    )
    with engine.connect() as conn:
        for job_id in (ours, theirs):
            row = conn.execute(text(sql), {"id": str(job_id)}).one()
            assert row.slot == 60 * math.floor(float(row.created) / 60)


@pytest.mark.smoke  # one Node round trip each way stays in the fast tier
def test_node_completes_and_fails_jobs_sent_by_python(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders", retry_limit=0)
    first = in_tx(engine, schema, lambda q: q.send("orders", {"n": 1}))
    second = in_tx(engine, schema, lambda q: q.send("orders", {"n": 2}))
    boss = node(schema)
    fetched = boss.call("fetch", "orders", {"batchSize": 2})
    assert sorted(j["id"] for j in fetched) == sorted([str(first), str(second)])

    done = boss.call("complete", "orders", str(first), {"ok": True})
    failed = boss.call("fail", "orders", str(second), {"reason": "no stock"})
    assert done["affected"] == 1 and failed["affected"] == 1

    completed = in_tx(engine, schema, lambda q: q.get_job("orders", first))
    dead = in_tx(engine, schema, lambda q: q.get_job("orders", second))
    assert completed.state == "completed" and completed.output == {"ok": True}
    assert dead.state == "failed" and dead.output == {"reason": "no stock"}
    assert dead.completed_on is not None


def test_node_fail_of_a_python_job_dead_letters_it_like_python_fail(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders", retry_limit=0)
    by_node = in_tx(engine, schema, lambda q: q.send("orders", {"n": 1}))
    by_python = in_tx(engine, schema, lambda q: q.send("orders", {"n": 2}))
    boss = node(schema)
    boss.call("fail", "orders", str(by_node), {"reason": "boom"})
    in_tx(engine, schema, lambda q: q.fail("orders", by_python, {"reason": "boom"}))

    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT {DERIVED}, output FROM \"{schema}\".job WHERE name = 'dlq' ORDER BY data")
        )
        copies = [dict(r) for r in rows.mappings()]
    assert [c["data"] for c in copies] == [{"n": 1}, {"n": 2}]
    for copy in copies:
        copy.pop("data")
    assert copies[0] == copies[1]
    assert copies[0]["policy"] is None and copies[0]["retry_limit"] == 5
    assert copies[0]["deletion_seconds"] == 50 and copies[0]["output"] == {"reason": "boom"}


def test_node_fail_honours_a_per_job_dead_letter_set_by_python(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders", retry_limit=0)
    in_tx(engine, schema, lambda q: q.create_queue("vip-dlq"))
    job_id = in_tx(engine, schema, lambda q: q.send("orders", {"n": 1}, dead_letter="vip-dlq"))
    boss = node(schema)
    boss.call("fail", "orders", str(job_id), {"reason": "boom"})
    # Node's fail reads the job row's dead_letter, so the per-job choice holds.
    assert count_jobs(engine, schema, "vip-dlq") == 1
    assert count_jobs(engine, schema, "dlq") == 0


def count_jobs(engine: Engine, schema: str, name: str) -> int:
    with engine.connect() as conn:
        sql = text(f'SELECT count(*) FROM "{schema}".job WHERE name = :n')
        return int(conn.execute(sql, {"n": name}).scalar_one())


def test_node_worker_completes_a_python_job_with_its_handler_result(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    job_id = in_tx(engine, schema, lambda q: q.send("orders", {"n": 1}))
    boss = node(schema)
    boss.call("work", "orders", {"pollingIntervalSeconds": 0.5}, {"output": {"sent": True}})

    def finished() -> bool:
        job = in_tx(engine, schema, lambda q: q.get_job("orders", job_id))
        return bool(job.state == "completed")

    assert boss.wait_for(finished, timeout=10)
    job = in_tx(engine, schema, lambda q: q.get_job("orders", job_id))
    assert job.output == {"sent": True}
    assert [e["id"] for e in boss.events_of("job")] == [str(job_id)]


# --------------------------------------------------------------- Node -> Python


def test_jobs_inserted_by_node_are_fetched_by_python_in_priority_order(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    # insert() answers nothing in 11.1.2 (pg-boss's insertJobs), whatever it inserted.
    assert (
        boss.call("insert", "orders", [{"data": {"n": 1}}, {"data": {"n": 2}, "priority": 5}])
        is None
    )
    jobs = in_tx(engine, schema, lambda q: q.fetch("orders", 5))
    assert [j.data for j in jobs] == [{"n": 2}, {"n": 1}]
    assert all(j.policy == "standard" and j.dead_letter == "dlq" for j in jobs)


@pytest.mark.smoke  # one Node round trip each way stays in the fast tier
def test_python_completes_a_node_job_and_node_reads_the_output(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    job_id = boss.call("send", "orders", {"n": 1}, {"priority": 2})
    [job] = in_tx(engine, schema, lambda q: q.fetch("orders"))
    in_tx(engine, schema, lambda q: q.complete("orders", job.id, "shipped"))

    seen = boss.call("getJobById", "orders", job_id)
    assert str(job.id) == job_id
    assert seen["state"] == "completed" and seen["output"] == {"value": "shipped"}


def _fail_until_dead(
    engine: Engine, schema: str, fetch: Any, fail: Any, job_id: str
) -> list[tuple[str, int, int]]:
    """Fetch and fail one job until it is failed; per attempt: state, retry_count and
    the retry delay rounded down (whole seconds, measured on the database clock)."""
    history: list[tuple[str, int, int]] = []
    for _ in range(10):
        fetch()
        with engine.connect() as conn:
            before = conn.execute(text("SELECT now()")).scalar_one()
        fail()
        with engine.connect() as conn:
            row = conn.execute(
                text(f'SELECT state, retry_count, start_after FROM "{schema}".job WHERE id = :id'),
                {"id": job_id},
            ).one()
        delay = (row.start_after - before).total_seconds()
        history.append((row.state, row.retry_count, math.floor(delay)))
        if row.state == "failed":
            return history
    raise AssertionError(f"job {job_id} never failed: {history}")


def test_retries_backoff_and_dead_letter_are_the_same_for_python_and_node_workers(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    # Backoff delays: retry_delay + 2^n/2 * (1 + random()), capped at 4 s:
    # attempt 1 -> 2..3 s, attempt 2 -> 3..4 s; the last failure leaves start_after.
    settings = {"retry_limit": 2, "retry_delay": 1, "retry_backoff": True, "retry_delay_max": 4}
    make_queues(engine, schema, "py-orders", **settings)
    make_queues(engine, schema, "js-orders", **settings)
    boss: NodeBoss = node(schema)
    for_python = boss.call("send", "py-orders", {"worker": "python"})
    for_node = boss.call("send", "js-orders", {"worker": "node"})

    python_history = _fail_until_dead(
        engine,
        schema,
        lambda: in_tx(engine, schema, lambda q: q.fetch("py-orders", ignore_start_after=True)),
        lambda: in_tx(engine, schema, lambda q: q.fail("py-orders", for_python, {"error": "boom"})),
        for_python,
    )
    node_history = _fail_until_dead(
        engine,
        schema,
        lambda: boss.call("fetch", "js-orders", {"ignoreStartAfter": True}),
        lambda: boss.call("fail", "js-orders", for_node, {"error": "boom"}),
        for_node,
    )

    states = [(s, n) for s, n, _ in python_history]
    assert states == [(s, n) for s, n, _ in node_history]
    assert states == [("retry", 0), ("retry", 1), ("failed", 2)]
    for history in (python_history, node_history):
        first, second, _ = (d for _, _, d in history)
        assert 1 <= first <= 3 and 2 <= second <= 4, history
    with engine.connect() as conn:
        copies = conn.execute(
            text(f"SELECT data, output, policy, retry_limit FROM \"{schema}\".job "
                 "WHERE name = 'dlq' ORDER BY data->>'worker'")
        ).all()  # fmt: skip
    assert [tuple(c) for c in copies] == [
        ({"worker": "node"}, {"error": "boom"}, None, 5),
        ({"worker": "python"}, {"error": "boom"}, None, 5),
    ]


# --------------------------------------------------------------- throttle & debounce


def test_throttle_slot_taken_by_python_refuses_a_node_send_throttled(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    assert in_tx(engine, schema, lambda q: q.send_throttled("orders", None, 3600, "k"))
    assert boss.call("sendThrottled", "orders", None, {}, 3600, "k") is None


def test_throttle_slot_taken_by_node_refuses_a_python_send_throttled(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    assert boss.call("sendThrottled", "orders", None, {}, 3600, "k")
    assert in_tx(engine, schema, lambda q: q.send_throttled("orders", None, 3600, "k")) is None


def _assert_in_next_slot(engine: Engine, schema: str, job_id: Any, seconds: int) -> None:
    sql = (
        "SELECT extract(epoch FROM singleton_on) AS slot, extract(epoch FROM created_on) AS c, "
        f'extract(epoch FROM start_after) AS s FROM "{schema}".job WHERE id = :id'
    )
    with engine.connect() as conn:
        row = conn.execute(text(sql), {"id": str(job_id)}).one()
    created, slot, starts = float(row.c), float(row.slot), float(row.s)
    next_slot = seconds * (math.floor(created / seconds) + 1)
    assert slot == next_slot
    # Both sides start the job about one second after the next slot opens.
    assert next_slot - 1 <= starts <= next_slot + 2, (starts, next_slot)


def test_python_debounce_moves_to_the_next_slot_when_node_took_the_current_one(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    assert boss.call("sendThrottled", "orders", None, {}, 3600, "k")
    job_id = in_tx(engine, schema, lambda q: q.send_debounced("orders", None, 3600, "k"))
    assert job_id is not None
    _assert_in_next_slot(engine, schema, job_id, 3600)
    assert boss.call("sendDebounced", "orders", None, {}, 3600, "k") is None


def test_node_debounce_moves_to_the_next_slot_when_python_took_the_current_one(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    assert in_tx(engine, schema, lambda q: q.send_throttled("orders", None, 3600, "k"))
    job_id = boss.call("sendDebounced", "orders", None, {}, 3600, "k")
    assert job_id is not None
    _assert_in_next_slot(engine, schema, job_id, 3600)
    assert in_tx(engine, schema, lambda q: q.send_debounced("orders", None, 3600, "k")) is None
