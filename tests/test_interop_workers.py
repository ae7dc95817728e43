"""Interop, workers: the Python Worker/AsyncWorker and Node's ``work()`` on shared queues.

Node pg-boss 11.1.2 sends no NOTIFY, so our workers find Node's jobs by polling
(see docs/how-to/workers.md). Failing handlers on both sides must walk a job through
the same states to the same dead-letter copy (pg-boss's failJobs).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from support.node import NodeFactory, in_tx, node, node_modules, node_url

from alkstore_sa import Job
from alkstore_sa.worker import AsyncWorker, Worker

__all__ = ["node", "node_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop

POLL = 0.2


def wait_until(predicate: Callable[[], bool], timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def states(engine: Engine, schema: str, name: str) -> Counter[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(f'SELECT state::text, count(*) FROM "{schema}".job WHERE name = :n GROUP BY 1'),
            {"n": name},
        )
        return Counter({state: count for state, count in rows})


def test_python_worker_finds_node_jobs_by_polling(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("mail"))
    boss = node(schema)
    seen: list[Any] = []
    lock = threading.Lock()

    def handle(job: Job) -> dict[str, Any]:
        with lock:
            seen.append(job.data["n"])
        return {"by": "python"}

    worker = Worker(engine, schema=schema, poll_interval=POLL, supervise=False, concurrency=4)
    worker.register("mail", handle, batch_size=4)
    worker.start()
    try:
        # Sent after the worker is idle: only polling can find them (Node does not notify).
        boss.call("insert", "mail", [{"data": {"n": n}} for n in range(10)])
        ids = [boss.call("send", "mail", {"n": n}) for n in range(10, 20)]
        assert wait_until(lambda: states(engine, schema, "mail")["completed"] == 20)
    finally:
        worker.stop(5)
    assert sorted(seen) == list(range(20))
    job = boss.call("getJobById", "mail", ids[0])
    assert job["state"] == "completed" and job["output"] == {"by": "python"}


async def test_python_async_worker_processes_node_jobs(
    database_url: str, engine: Engine, schema: str, node: NodeFactory
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("mail"))
    boss = node(schema)
    ids = [boss.call("send", "mail", {"n": n}) for n in range(5)]
    aengine = create_async_engine(database_url)

    async def handle(job: Job) -> int:
        return int(job.data["n"]) * 2

    worker = AsyncWorker(aengine, schema=schema, poll_interval=POLL, supervise=False)
    worker.register("mail", handle)
    await worker.start()
    try:
        for _ in range(300):
            if states(engine, schema, "mail")["completed"] == 5:
                break
            await asyncio.sleep(0.05)
    finally:
        await worker.stop(5)
        await aengine.dispose()
    outputs = [boss.call("getJobById", "mail", i)["output"] for i in ids]
    assert outputs == [{"value": n * 2} for n in range(5)]


def test_failing_handlers_in_python_and_node_leave_the_same_trail(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    def create(q: Any) -> None:
        q.create_queue("dlq", retry_limit=4)
        for name in ("py-q", "js-q"):
            q.create_queue(name, retry_limit=2, retry_delay=0, dead_letter="dlq")

    in_tx(engine, schema, create)
    boss = node(schema)
    py_job = boss.call("send", "py-q", {"side": "python"})
    js_job = boss.call("send", "js-q", {"side": "node"})
    py_attempts: list[int] = []

    def explode(job: Job) -> None:
        py_attempts.append(job.retry_count)
        raise RuntimeError("failed on purpose")

    worker = Worker(engine, schema=schema, poll_interval=POLL, supervise=False)
    worker.register("py-q", explode)
    worker.start()
    boss.call(
        "work",
        "js-q",
        {"pollingIntervalSeconds": 0.5, "includeMetadata": True},
        {"fail": True, "message": "failed on purpose"},
    )
    try:
        assert wait_until(
            lambda: (
                states(engine, schema, "py-q")["failed"] == 1
                and states(engine, schema, "js-q")["failed"] == 1
            )
        )
    finally:
        worker.stop(5)
    js_attempts = [e["retryCount"] for e in boss.events_of("job")]
    assert py_attempts == js_attempts == [0, 1, 2]

    ours = in_tx(engine, schema, lambda q: q.get_job("py-q", py_job))
    theirs = in_tx(engine, schema, lambda q: q.get_job("js-q", js_job))
    assert (ours.state, ours.retry_count) == (theirs.state, theirs.retry_count) == ("failed", 2)
    # Both store the error as {name, message, stack}.
    assert ours.output["message"] == theirs.output["message"] == "failed on purpose"
    assert {"name", "message", "stack"} <= set(ours.output) & set(theirs.output)
    with engine.connect() as conn:
        copies = conn.execute(
            text(
                f"SELECT data, policy, retry_limit, output->>'message' FROM \"{schema}\".job "
                "WHERE name = 'dlq' ORDER BY data->>'side'"
            )
        ).all()
    assert [tuple(c) for c in copies] == [
        ({"side": "node"}, None, 4, "failed on purpose"),
        ({"side": "python"}, None, 4, "failed on purpose"),
    ]


def test_python_and_node_workers_share_one_queue_without_running_a_job_twice(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("mail"))
    boss = node(schema)
    runs: list[str] = []
    lock = threading.Lock()

    def handle(job: Job) -> str:
        with lock:
            runs.append(str(job.id))
        time.sleep(0.05)  # slow enough that the Node workers get their share
        return "python"

    worker = Worker(engine, schema=schema, poll_interval=POLL, supervise=False, concurrency=2)
    worker.register("mail", handle, batch_size=2)
    worker.start()
    for _ in range(2):
        boss.call("work", "mail", {"pollingIntervalSeconds": 0.5, "batchSize": 3}, {"sleepMs": 50})
    try:
        sent = in_tx(
            engine, schema, lambda q: q.send_many("mail", [{"data": {"n": n}} for n in range(30)])
        )
        ids = [str(i) for i in sent]
        ids += [boss.call("send", "mail", {"n": n}) for n in range(30, 60)]
        assert wait_until(lambda: states(engine, schema, "mail")["completed"] == 60, timeout=30)
    finally:
        worker.stop(5)
    node_runs = [e["id"] for e in boss.events_of("job")]
    counts = Counter(runs + node_runs)
    assert sorted(counts) == sorted(ids)
    assert set(counts.values()) == {1}
    assert runs and node_runs  # both sides took part


def test_python_lease_extension_keeps_node_supervisor_from_expiring_a_long_job(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("slow", expire_seconds=1, retry_limit=1))
    boss = node(schema, supervise=True, superviseIntervalSeconds=1, monitorIntervalSeconds=1)
    runs: list[int] = []

    def handle(job: Job) -> str:
        runs.append(job.retry_count)
        time.sleep(4)  # four times the job's expire_seconds
        return "done"

    worker = Worker(engine, schema=schema, poll_interval=POLL, supervise=False, extend_lease=True)
    worker.register("slow", handle)
    job_id = in_tx(engine, schema, lambda q: q.send("slow", None))
    worker.start()
    try:
        assert wait_until(lambda: states(engine, schema, "slow")["completed"] == 1, timeout=15)
    finally:
        worker.stop(5)
    job = in_tx(engine, schema, lambda q: q.get_job("slow", job_id))
    assert runs == [0] and job.retry_count == 0 and job.output == {"value": "done"}
    assert boss.errors() == []


def test_job_expired_by_node_supervisor_cannot_be_completed_by_the_late_python_worker(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    def create(q: Any) -> None:
        q.create_queue("dlq")
        q.create_queue("slow", expire_seconds=1, retry_limit=0, dead_letter="dlq")

    in_tx(engine, schema, create)
    boss = node(schema, supervise=True, superviseIntervalSeconds=1, monitorIntervalSeconds=1)
    finished = threading.Event()

    def handle(job: Job) -> str:
        # Outlives its lease; the worker neither extends it nor times it out.
        time.sleep(4)
        finished.set()
        return "too late"

    worker = Worker(
        engine, schema=schema, poll_interval=POLL, supervise=False, extend_lease=False, timeout=30
    )
    worker.register("slow", handle)
    job_id = in_tx(engine, schema, lambda q: q.send("slow", None))
    worker.start()
    try:
        assert finished.wait(10)
        time.sleep(0.5)  # let the worker try to complete it
    finally:
        worker.stop(5)
    job = in_tx(engine, schema, lambda q: q.get_job("slow", job_id))
    assert job.state == "failed"
    assert job.output == {"value": {"message": "job timed out"}}  # Node's expiration output
    assert states(engine, schema, "dlq")["created"] == 1
    assert boss.errors() == []
