"""Interop at schema 46, workers: our Worker/AsyncWorker and Node pg-boss 12.38.0's ``work()``
on shared queues.

- NOTIFY: on a queue with ``notify``, each side's send wakes the other side's idle worker
  on Node's channel (``pgboss_`` + sha224(schema)), long before either polls again.
- Jobs sent by one side are worked by the other; failing handlers walk a job through the
  same states to the same dead-letter copy; a queue shared by both runs each job once, also
  with both sides claiming as on a distributed backend (no ``SKIP LOCKED``).
- Heartbeats: a Python worker keeps ``heartbeat_on`` fresh, so a Node supervisor does not
  fail its long job; a Node worker's heartbeat keeps a Python supervisor off its job.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import create_async_engine
from support.interop46 import (
    make_schema46,
    schema46_by,
    sql,
    states,
    wait_until,
)
from support.node import in_tx, node46, node46_modules, node_url, parse_time
from support.schemas import drop_schema
from support.worker import settled_claims

from alkstore_sa import Backend, Job, JobSpec
from alkstore_sa.backends import FOLLOWED_FLAGS
from alkstore_sa.supervision import Supervisor
from alkstore_sa.worker import AsyncWorker, Worker

__all__ = ["node46", "node46_modules", "node_url", "schema46_by"]  # fixtures

pytestmark = pytest.mark.interop

POLL = 0.2
SLOW_POLL = 60.0
"""A polling interval far beyond the pickup a notification must give."""
WAKE_WITHIN = 5.0
"""Seconds from send to pickup that only a notification explains: polls are a minute apart,
so three pickups this fast by polling alone would happen about once in 1,700 runs, while a
loaded machine still has room to answer a notification."""


def create_notify_queue(engine: Engine, schema: str, boss: Any, creator: str) -> None:
    if creator == "node":
        boss.call("createQueue", "mail", {"notify": True})
    else:
        in_tx(engine, schema, lambda q: q.create_queue("mail", notify=True))
    [(notify,)] = sql(engine, schema, "SELECT notify FROM {s}.queue WHERE name = 'mail'")
    assert notify is True


@pytest.mark.parametrize("creator", ["python", "node"])
def test_python_send_wakes_an_idle_node_worker_on_a_notify_queue(
    engine: Engine, schema46_by: str, node46: Any, creator: str
) -> None:
    schema = schema46_by
    if creator == "python":
        create_notify_queue(engine, schema, None, creator)
    boss = node46(schema, useListenNotify=True, queueCacheIntervalSeconds=1)
    if creator == "node":
        create_notify_queue(engine, schema, boss, creator)
    options = {"pollingIntervalSeconds": SLOW_POLL, "notifyPollingIntervalSeconds": SLOW_POLL}
    boss.call("work", "mail", options, {})
    time.sleep(2)  # the worker's first (empty) fetch is over; the queue cache knows notify
    delays = []
    for n in range(3):
        sent_at = time.monotonic()
        job_id = in_tx(engine, schema, lambda q, n=n: q.send("mail", {"n": n}))  # type: ignore[misc]
        assert boss.wait_for(
            lambda i=job_id: any(e["id"] == str(i) for e in boss.events_of("job")), 5
        )
        delays.append(time.monotonic() - sent_at)
    assert max(delays) < WAKE_WITHIN, delays
    assert wait_until(lambda: states(engine, schema, "mail")["completed"] == 3, 5)
    assert boss.errors() == []


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("creator", ["python", "node"])
def test_node_send_wakes_an_idle_python_worker_on_a_notify_queue(
    engine: Engine, database_url: str, schema46_by: str, node46: Any, creator: str, flavour: str
) -> None:
    schema = schema46_by
    boss = node46(schema, useListenNotify=True)
    create_notify_queue(engine, schema, boss, creator)
    picked: dict[str, float] = {}

    def handle(job: Job) -> str:
        picked[str(job.id)] = time.monotonic()
        return "python"

    async def ahandle(job: Job) -> str:
        return handle(job)

    sent: dict[str, float] = {}

    def send_three(worker: Any) -> None:
        settled_claims(worker, "mail")  # the worker's first (empty) claim is over
        for n in range(3):
            sent_at = time.monotonic()
            sent[boss.call("send", "mail", {"n": n})] = sent_at
            wait_until(lambda n=n: len(picked) == n + 1, 5)  # type: ignore[misc]

    if flavour == "sync":
        worker = Worker(engine, schema=schema, poll_interval=SLOW_POLL, supervise=False)
        worker.register("mail", handle)
        worker.start()
        try:
            send_three(worker)
        finally:
            worker.stop(5)
    else:

        async def run() -> None:
            aengine = create_async_engine(database_url)
            aworker = AsyncWorker(aengine, schema=schema, poll_interval=SLOW_POLL, supervise=False)
            aworker.register("mail", ahandle)
            await aworker.start()
            try:
                await asyncio.to_thread(send_three, aworker)
            finally:
                await aworker.stop(5)
                await aengine.dispose()

        asyncio.run(run())
    assert set(picked) == set(sent)
    delays = [picked[i] - sent[i] for i in sent]
    assert max(delays) < WAKE_WITHIN, delays


def test_python_worker_finds_node_jobs_and_node_worker_finds_python_jobs(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: (q.create_queue("to-python"), q.create_queue("to-node")))
    boss = node46(schema)
    seen: list[Any] = []
    lock = threading.Lock()

    def handle(job: Job) -> dict[str, Any]:
        with lock:
            seen.append(job.data["n"])
        return {"by": "python"}

    worker = Worker(engine, schema=schema, poll_interval=POLL, supervise=False, concurrency=4)
    worker.register("to-python", handle, batch_size=4)
    worker.start()
    # Batches of one: Node keeps a handler's result as the output only for a batch of one.
    options = {"pollingIntervalSeconds": 0.5, "localConcurrency": 4}
    boss.call("work", "to-node", options, {"output": {"by": "node"}})
    try:
        boss.call("insert", "to-python", [{"data": {"n": n}} for n in range(10)])
        ids = [boss.call("send", "to-python", {"n": n}) for n in range(10, 20)]
        theirs = in_tx(
            engine,
            schema,
            lambda q: q.send_many("to-node", [{"data": {"n": n}} for n in range(20)]),
        )
        assert wait_until(lambda: states(engine, schema, "to-python")["completed"] == 20)
        assert wait_until(lambda: states(engine, schema, "to-node")["completed"] == 20)
    finally:
        worker.stop(5)
    assert sorted(seen) == list(range(20))
    job = boss.call("getJobById", "to-python", ids[0])
    assert job["state"] == "completed" and job["output"] == {"by": "python"}
    mine = in_tx(engine, schema, lambda q: q.get_job("to-node", theirs[0]))
    assert mine.output == {"by": "node"}
    assert sorted(str(e["id"]) for e in boss.events_of("job")) == sorted(str(i) for i in theirs)


async def test_python_async_worker_processes_node_jobs(
    database_url: str, engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("mail"))
    boss = node46(schema)
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
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by

    def create(q: Any) -> None:
        q.create_queue("dlq", retry_limit=4)
        for name in ("py-q", "js-q"):
            q.create_queue(name, retry_limit=2, retry_delay=0, dead_letter="dlq")

    in_tx(engine, schema, create)
    boss = node46(schema)
    py_job = boss.call("send", "py-q", {"side": "python"})
    js_job = in_tx(engine, schema, lambda q: q.send("js-q", {"side": "node"}))
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
        {"pollingIntervalSeconds": 0.5},
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
    assert ours.output["message"] == theirs.output["message"] == "failed on purpose"
    assert {"name", "message", "stack"} <= set(ours.output) & set(theirs.output)
    copies = sql(
        engine, schema,
        "SELECT data, policy, retry_limit, output, source_output->>'message', source_name, "
        "source_retry_count FROM {s}.job WHERE name = 'dlq' ORDER BY data->>'side'",
    )  # fmt: skip
    assert [tuple(c) for c in copies] == [
        ({"side": "node"}, None, 4, None, "failed on purpose", "js-q", 2),
        ({"side": "python"}, None, 4, None, "failed on purpose", "py-q", 2),
    ]


NODE_RUNTIME_FLAGS = {
    "__test__distributed": True,
    "__test__noAdvisoryLocks": True,
    "__test__noIndexProgressView": True,
    "__test__noReindex": True,
    "__test__noTransactionalHeartbeat": True,
}
"""pg-boss 12.38's hooks that force its runtime flags on stock PostgreSQL."""


@pytest.mark.parametrize("claims", ["skip locked", "distributed", "distributed singleton"])
def test_python_and_node_workers_share_one_queue_without_running_a_job_twice(
    engine: Engine, schema46_by: str, node46: Any, claims: str
) -> None:
    """``distributed``: a distributed backend's runtime forced on stock PostgreSQL on both
    sides (docs/how-to/backends.md), both supervising: Node with every ``__test__`` option
    pg-boss 12.38 has (claims without ``SKIP LOCKED`` and settlements split, no advisory
    locks, no index progress view, no reindex, no transactional heartbeat), our worker
    with every flag we follow. ``distributed singleton``: the same on a singleton queue whose
    jobs share ten keys, where neither side locks a key before claiming it: two claims of
    one key collide on its unique index, and the loser's claim is empty."""
    schema = schema46_by
    singleton = claims == "distributed singleton"
    policy = "singleton" if singleton else "standard"
    in_tx(engine, schema, lambda q: q.create_queue("mail", policy=policy))
    distributed = claims.startswith("distributed")
    boss = node46(schema, supervise=True, **NODE_RUNTIME_FLAGS) if distributed else node46(schema)
    runs: list[str] = []
    lock = threading.Lock()

    def handle(job: Job) -> str:
        with lock:
            runs.append(str(job.id))
        time.sleep(0.05)
        return "python"

    worker = Worker(
        engine,
        schema=schema,
        poll_interval=POLL,
        supervise=distributed,
        supervisor_options={"supervise_interval": 1, "monitor_interval": 1},
        backend=Backend("postgres", frozenset(FOLLOWED_FLAGS)) if distributed else None,
        concurrency=2,
    )
    worker.register("mail", handle, batch_size=2)
    worker.start()
    for _ in range(2):
        boss.call("work", "mail", {"pollingIntervalSeconds": 0.5, "batchSize": 3}, {"sleepMs": 50})
    try:

        def spec(n: int) -> JobSpec:
            if singleton:
                return {"data": {"n": n}, "singleton_key": f"k{n % 10}"}
            return {"data": {"n": n}}

        sent = in_tx(engine, schema, lambda q: q.send_many("mail", [spec(n) for n in range(30)]))
        node_key = {"singletonKey": "k{}"} if singleton else {}
        ids = [str(i) for i in sent] + [
            boss.call("send", "mail", {"n": n}, {k: v.format(n % 10) for k, v in node_key.items()})
            for n in range(30, 60)
        ]
        assert wait_until(lambda: states(engine, schema, "mail")["completed"] == 60, timeout=30)
    finally:
        worker.stop(5)
    counts = Counter(runs + [e["id"] for e in boss.events_of("job")])
    assert sorted(counts) == sorted(ids)
    assert set(counts.values()) == {1}
    assert runs and boss.events_of("job")


HEARTBEAT = 10  # pg-boss's smallest heartbeatSeconds


@pytest.fixture
def node_made_schema(
    engine: Engine, database_url: str, spoken46: None, node46_modules: None
) -> Any:
    name = make_schema46(engine, database_url, "node")
    yield name
    drop_schema(engine, name)


def test_python_worker_heartbeat_keeps_a_node_supervisor_from_failing_its_long_job(
    engine: Engine, node_made_schema: str, node46: Any
) -> None:
    schema = node_made_schema
    boss = node46(schema, supervise=True, superviseIntervalSeconds=1, monitorIntervalSeconds=1)
    boss.call("createQueue", "slow", {"heartbeatSeconds": HEARTBEAT, "retryLimit": 1})
    runs: list[int] = []
    beats: list[Any] = []

    def handle(job: Job) -> str:
        runs.append(job.retry_count)
        deadline = time.monotonic() + HEARTBEAT + 3
        while time.monotonic() < deadline:
            [(beat,)] = sql(
                engine, schema, "SELECT heartbeat_on FROM {s}.job WHERE id = :i", i=str(job.id)
            )
            beats.append(beat)
            time.sleep(0.5)
        return "done"

    worker = Worker(engine, schema=schema, poll_interval=POLL, supervise=False)
    worker.register("slow", handle)
    job_id = boss.call("send", "slow", None)
    worker.start()
    try:
        assert wait_until(
            lambda: states(engine, schema, "slow")["completed"] == 1, timeout=HEARTBEAT + 10
        )
    finally:
        worker.stop(5)
    job = in_tx(engine, schema, lambda q: q.get_job("slow", job_id))
    assert runs == [0] and job.retry_count == 0 and job.output == {"value": "done"}
    assert len(set(beats)) >= 2  # heartbeat_on moved while the handler ran
    assert boss.errors() == []


def test_node_worker_heartbeat_keeps_a_python_supervisor_off_its_job_and_a_silent_one_fails(
    engine: Engine, node_made_schema: str, node46: Any
) -> None:
    schema = node_made_schema
    boss = node46(schema)
    boss.call("createQueue", "slow", {"heartbeatSeconds": HEARTBEAT, "retryLimit": 0})
    boss.call("createQueue", "silent", {"heartbeatSeconds": HEARTBEAT, "retryLimit": 0})
    supervisor = Supervisor(
        engine, schema=schema, schedule=False, supervise_interval=0.5, monitor_interval=1
    )
    kept = boss.call("send", "slow", None)
    dropped = boss.call("send", "silent", None)
    boss.call("work", "slow", {"pollingIntervalSeconds": 0.5}, {"sleepMs": (HEARTBEAT + 3) * 1000})
    [taken] = boss.call("fetch", "silent")  # claimed, then never touched
    supervisor.start()
    try:
        assert wait_until(
            lambda: states(engine, schema, "slow")["completed"] == 1, timeout=HEARTBEAT + 10
        )
        assert wait_until(lambda: states(engine, schema, "silent")["failed"] == 1, timeout=5)
    finally:
        supervisor.stop(5)
    assert taken["id"] == dropped
    assert boss.call("getJobById", "slow", kept)["state"] == "completed"
    failed = boss.call("getJobById", "silent", dropped)
    assert failed["output"] == {"value": {"message": "job heartbeat timeout"}}
    started = parse_time(failed["startedOn"])
    completed = parse_time(failed["completedOn"])
    assert started is not None and completed is not None
    assert (completed - started).total_seconds() >= HEARTBEAT
