"""Interop at schema 46 under a distributed backend's runtime, forced on stock PostgreSQL.

Node pg-boss 12.38.0 started with ``__test__distributed`` (its own test option: claims
without ``SKIP LOCKED`` and settlements split into separate statements) and our worker with
``noSkipLocked`` forced (docs/how-to/backends.md) work one queue, both supervising: each
job runs once, whichever side sent it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import schema46_by, states, wait_until
from support.node import in_tx, node46, node46_modules, node_url

from alkstore_sa import Backend, Job
from alkstore_sa.worker import Worker

__all__ = ["node46", "node46_modules", "node_url", "schema46_by"]  # fixtures

pytestmark = pytest.mark.interop

NO_SKIP_LOCKED = Backend("postgres", frozenset({"noSkipLocked"}))


def test_node_and_python_claiming_without_skip_locked_run_each_job_once(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("mail"))
    boss = node46(schema, __test__distributed=True, supervise=True)
    runs: list[str] = []
    lock = threading.Lock()

    def handle(job: Job) -> None:
        with lock:
            runs.append(str(job.id))
        time.sleep(0.02)

    worker = Worker(
        engine,
        schema=schema,
        backend=NO_SKIP_LOCKED,
        poll_interval=0.2,
        concurrency=3,
        supervisor_options={"supervise_interval": 1, "monitor_interval": 1},
    )
    worker.register("mail", handle, batch_size=3)
    worker.start()
    for _ in range(2):
        boss.call("work", "mail", {"pollingIntervalSeconds": 0.5, "batchSize": 3}, {"sleepMs": 20})
    try:
        sent = in_tx(
            engine, schema, lambda q: q.send_many("mail", [{"data": {"n": n}} for n in range(60)])
        )
        ids = [str(i) for i in sent] + [boss.call("send", "mail", {"n": n}) for n in range(60, 120)]
        assert wait_until(lambda: states(engine, schema, "mail")["completed"] == 120, timeout=40)
    finally:
        worker.stop(5)
    counts = Counter(runs + [e["id"] for e in boss.events_of("job")])
    assert sorted(counts) == sorted(ids)
    assert set(counts.values()) == {1}  # no job ran twice
    assert runs and boss.events_of("job")  # both sides worked
