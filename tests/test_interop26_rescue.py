"""Interop at schema 26: our workers' claim records and rescue sweep, with Node pg-boss
11.1.2's workers on the same queue.

- A Node worker's job (its claim records nothing) is never failed by our worker's
  sweep, however long it runs.
- A job our sweep failed for retry (its worker stopped answering) is claimed by a Node
  worker and run to completion, while our sweep runs and the old attempt's claim row is
  still there: the row names an attempt that ended (its ``started_on``), so it matches
  nothing.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.node import in_tx, node, node_modules, node_url, wait_until

from alkstore_sa.worker import Worker

__all__ = ["node", "node_modules", "node_url"]  # fixtures

pytestmark = pytest.mark.interop

LIVENESS = 10  # the least liveness_seconds: a claimer lapses 10 s after its last renewal
LONG_MS = (LIVENESS + 5) * 1000  # a handler running past a lapse and a half


def sql(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result) if result.returns_rows else []


def states(engine: Engine, schema: str) -> dict[str, int]:
    found = sql(engine, schema, "SELECT state::text, count(*) FROM {s}.job GROUP BY 1")
    return {state: int(n) for state, n in found}


def job_row(engine: Engine, schema: str, job_id: Any) -> Any:
    [row] = sql(
        engine,
        schema,
        "SELECT retry_count, output, started_on, expire_seconds FROM {s}.job WHERE id = :i",
        i=job_id,
    )
    return row


def our_worker(engine: Engine, schema: str, ran: list[Any]) -> Worker:
    worker = Worker(
        engine, schema=schema, poll_interval=0.2, supervise=False, liveness_seconds=LIVENESS
    )
    worker.register("mix", lambda job: ran.append(job.id))
    return worker


def test_a_node_workers_long_job_is_never_failed_by_our_workers_sweep(
    engine: Engine, schema: str, node: Any
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("mix", retry_limit=0))
    boss = node(schema)
    boss.call("work", "mix", {"pollingIntervalSeconds": 0.5}, {"sleepMs": LONG_MS})
    job_id = boss.call("send", "mix", {"n": 1})
    assert wait_until(lambda: states(engine, schema).get("active") == 1, timeout=10)
    ran: list[Any] = []
    worker = our_worker(engine, schema, ran)
    worker.start()
    try:
        assert wait_until(
            lambda: states(engine, schema).get("completed") == 1, timeout=LONG_MS / 1000 + 10
        )
    finally:
        worker.stop(5)
    row = job_row(engine, schema, job_id)
    assert (row.retry_count, row.output) == (0, {"by": "node"})
    assert sql(engine, schema, "SELECT 1 FROM {s}.alkstore_claim WHERE job_id = :i", i=job_id) == []
    assert ran == []
    assert boss.errors() == []


def test_a_node_worker_runs_a_job_our_rescue_retried_to_completion(
    engine: Engine, schema: str, node: Any
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("mix", retry_limit=1, retry_delay=8))
    job_id = in_tx(engine, schema, lambda q: q.send("mix", {"n": 1}))
    # Claimed by a worker of ours that then died: its claim row names an owner whose
    # liveness row lapsed.
    [first] = in_tx(engine, schema, lambda q: q.fetch("mix"))
    dead = uuid.uuid4()
    sql(
        engine,
        schema,
        "INSERT INTO {s}.alkstore_claimer VALUES (:o, now() - interval '1 min', 10)",
        o=dead,
    )
    plant = (
        "INSERT INTO {s}.alkstore_claim (job_id, name, started_on, owner)"
        " VALUES (:i, 'mix', :so, :o) ON CONFLICT (job_id) DO NOTHING"
    )
    sql(engine, schema, plant, i=job_id, so=first.started_on, o=dead)
    ran: list[Any] = []
    rescuer = our_worker(engine, schema, ran)
    rescuer.start()
    try:
        assert wait_until(lambda: states(engine, schema).get("retry") == 1, timeout=LIVENESS + 5)
    finally:
        rescuer.stop(5)
    assert ran == []  # retry_delay: not due yet
    boss = node(schema)
    boss.call("work", "mix", {"pollingIntervalSeconds": 0.5}, {"sleepMs": LONG_MS})
    assert wait_until(lambda: states(engine, schema).get("active") == 1, timeout=20)
    # Node runs the second attempt; the first attempt's row is planted again, and a
    # worker of ours sweeps the queue all the while.
    sql(engine, schema, plant, i=job_id, so=first.started_on, o=dead)
    sweeper = our_worker(engine, schema, ran)
    sweeper.start()
    try:
        assert wait_until(
            lambda: states(engine, schema).get("completed") == 1, timeout=LONG_MS / 1000 + 10
        )
    finally:
        sweeper.stop(5)
    row = job_row(engine, schema, job_id)
    assert (row.retry_count, row.output, row.expire_seconds) == (1, {"by": "node"}, 900)
    assert ran == []
    causes = sql(
        engine, schema, "SELECT cause FROM {s}.alkstore_job_attempt WHERE job_id = :i", i=job_id
    )
    assert [c.cause for c in causes] == ["heartbeat"]  # the rescue alone; Node's run completed
    assert boss.errors() == []
