"""Interop at schema 46: our workers' liveness heartbeat and rescue sweep, with Node
pg-boss 12.38's workers on the same queue.

- A Node worker's job (no heartbeat) is never failed by our worker's sweep, however long
  it runs.
- A job our claim gave a heartbeat (``liveness_seconds``) and that was retried carries it;
  a Node worker that claims it touches it as pg-boss does for any job with a heartbeat,
  and runs it to completion while both supervisors run.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import job_row, states, wait_until
from support.node import in_tx, node46, node46_modules, node_url

from alkstore_sa import Job
from alkstore_sa.supervision import Supervisor
from alkstore_sa.worker import Worker

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures

pytestmark = pytest.mark.interop

LIVENESS = 10  # the least liveness_seconds (pg-boss's smallest heartbeat)
LONG_MS = (LIVENESS + 4) * 1000  # a handler running past a heartbeat and a half


def test_a_node_workers_long_job_is_never_failed_by_our_workers_sweep(
    engine: Engine, schema46: str, node46: Any
) -> None:
    schema = schema46
    in_tx(engine, schema, lambda q: q.create_queue("mix", retry_limit=0))
    boss = node46(schema)
    boss.call("work", "mix", {"pollingIntervalSeconds": 0.5}, {"sleepMs": LONG_MS})
    job_id = boss.call("send", "mix", {"n": 1})
    assert wait_until(lambda: states(engine, schema, "mix")["active"] == 1, timeout=10)
    ran: list[Any] = []
    worker = Worker(
        engine, schema=schema, poll_interval=0.2, supervise=False, liveness_seconds=LIVENESS
    )
    worker.register("mix", lambda job: ran.append(job.id))
    worker.start()
    try:
        assert wait_until(
            lambda: states(engine, schema, "mix")["completed"] == 1, timeout=LONG_MS / 1000 + 10
        )
    finally:
        worker.stop(5)
    row = job_row(engine, schema, job_id, "retry_count, output, heartbeat_seconds")
    assert (row["retry_count"], row["output"]) == (0, {"by": "node"})
    assert row["heartbeat_seconds"] is None  # Node's claim: we gave it nothing
    assert ran == []
    assert boss.errors() == []


def test_a_node_worker_runs_a_retried_job_carrying_our_heartbeat_to_completion(
    engine: Engine, schema46: str, node46: Any
) -> None:
    schema = schema46
    in_tx(engine, schema, lambda q: q.create_queue("mix", retry_limit=1, retry_delay=2))
    failed = threading.Event()

    def fail_once(job: Job) -> None:
        failed.set()
        raise RuntimeError("first attempt fails")

    worker = Worker(
        engine, schema=schema, poll_interval=0.2, supervise=False, liveness_seconds=LIVENESS
    )
    worker.register("mix", fail_once)
    job_id = in_tx(engine, schema, lambda q: q.send("mix", {"n": 1}))
    worker.start()
    try:
        assert wait_until(lambda: states(engine, schema, "mix")["retry"] == 1, timeout=10)
    finally:
        worker.stop(5)
    assert failed.is_set()
    assert job_row(engine, schema, job_id, "heartbeat_seconds")["heartbeat_seconds"] == LIVENESS
    boss = node46(schema, supervise=True, superviseIntervalSeconds=1, monitorIntervalSeconds=1)
    ours = Supervisor(engine, schema=schema, schedule=False, supervise_interval=0.5)
    ours.start()
    try:
        boss.call("work", "mix", {"pollingIntervalSeconds": 0.5}, {"sleepMs": LONG_MS})
        assert wait_until(
            lambda: states(engine, schema, "mix")["completed"] == 1, timeout=LONG_MS / 1000 + 10
        )
    finally:
        ours.stop(5)
    row = job_row(engine, schema, job_id, "retry_count, output")
    assert (row["retry_count"], row["output"]) == (1, {"by": "node"})
    assert boss.errors() == []
