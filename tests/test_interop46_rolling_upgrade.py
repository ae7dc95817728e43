"""Interop, the rolling upgrade: Python workers on our schema 26 with jobs flowing, then the
schema moves to 46 under them, and nothing is lost.

Two ways the schema moves: Node pg-boss 12.38.0 starts with its default ``migrate: true``,
or an operator runs ``alkstore db upgrade --schema-version 46``. Either way a Worker and an
AsyncWorker keep working: each engine notices the new version within
``SCHEMA_RECHECK_SECONDS`` (plus a little), logs the change once
(``action = schema_version_changed``), switches to the version's statements (claims now set
``heartbeat_on``), and every job sent before, during and after is completed exactly once.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.errors import DeadlockDetected
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import create_async_engine
from support.interop46 import sql, states, version_of, wait_until
from support.node import in_tx, node46, node46_modules, node_url
from support.schemas import drop_schema, random_schema

from alkstore_sa import Job, SchemaVersionChangedError, migrate, names
from alkstore_sa.worker import AsyncWorker, Worker

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop

QUEUES = ("roll-sync", "roll-async")
BEFORE = 2.0  # seconds of flow at 26
AFTER = 4.0  # seconds of flow after the runtime switched


@pytest.fixture
def schema26(engine: Engine) -> Iterator[str]:
    name = random_schema("roll_")
    migrate.upgrade(engine, name, schema_version=26)
    in_tx(engine, name, lambda q: [q.create_queue(n, retry_limit=3) for n in QUEUES])
    yield name
    drop_schema(engine, name)


class Flow:
    """A sender, a Worker on one queue and an AsyncWorker on the other, each on its own engine."""

    def __init__(self, engine: Engine, database_url: str, schema: str) -> None:
        self.engine, self.schema = engine, schema
        self.sync_engine = create_engine(database_url)
        self.sent: list[str] = []
        self.runs: list[str] = []
        self.lock = threading.Lock()
        self.stop_sending = threading.Event()
        self.errors: list[BaseException] = []
        self.sends_run_again: list[BaseException] = []
        self.worker = Worker(
            self.sync_engine, schema=schema, poll_interval=0.2, supervise=False, concurrency=4
        )
        self.worker.register(QUEUES[0], self.handle)
        self.database_url = database_url
        self._loop_ready = threading.Event()
        self._loop_stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run_async_worker, daemon=True)

    def handle(self, job: Job) -> str:
        with self.lock:
            self.runs.append(str(job.id))
        time.sleep(0.01)
        return "ok"

    async def ahandle(self, job: Job) -> str:
        with self.lock:
            self.runs.append(str(job.id))
        await asyncio.sleep(0.01)
        return "ok"

    def _run_async_worker(self) -> None:
        async def main() -> None:
            aengine = create_async_engine(self.database_url)
            worker = AsyncWorker(
                aengine, schema=self.schema, poll_interval=0.2, supervise=False, concurrency=4
            )
            worker.register(QUEUES[1], self.ahandle)
            self._loop_stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            await worker.start()
            self._loop_ready.set()
            try:
                await self._loop_stop.wait()
            finally:
                await worker.stop(10)
                await aengine.dispose()

        try:
            asyncio.run(main())
        except BaseException as exc:
            self.errors.append(exc)
            self._loop_ready.set()

    def send_loop(self) -> None:
        n = 0
        try:
            while not self.stop_sending.is_set():
                n += 1
                for name in QUEUES:
                    ids = self.send_three(name, n)
                    with self.lock:
                        self.sent += [str(i) for i in ids]
                self.stop_sending.wait(0.05)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def send_three(self, name: str, n: int) -> list[Any]:
        """Send three jobs in one transaction, run again (at most 5 times) when it failed
        the two ways a migration beside it can make it fail: as the docs ask of a caller
        (docs/concepts/compatibility.md, Live upgrades) after SchemaVersionChangedError,
        and as any PostgreSQL client does after a deadlock (the migration's ALTERs take
        their locks in another order than a send). Each run is kept in sends_run_again."""
        for attempt in range(5):
            try:
                return list(
                    in_tx(
                        self.engine,
                        self.schema,
                        lambda q: q.send_many(name, [{"data": {"n": n, "i": i}} for i in range(3)]),
                    )
                )
            except (SchemaVersionChangedError, OperationalError) as exc:
                transient = isinstance(exc, SchemaVersionChangedError) or isinstance(
                    exc.orig, DeadlockDetected
                )
                if not transient or attempt == 4:
                    raise
                with self.lock:
                    self.sends_run_again.append(exc)
        raise AssertionError("unreachable")

    def start(self) -> None:
        self.worker.start()
        self._thread.start()
        assert self._loop_ready.wait(15)
        self._sender = threading.Thread(target=self.send_loop, daemon=True)
        self._sender.start()

    def stop(self) -> None:
        self.stop_sending.set()
        self._sender.join(10)
        self.worker.stop(10)
        if self._loop is not None and self._loop_stop is not None:
            # The event belongs to the worker's loop: set it from that loop.
            self._loop.call_soon_threadsafe(self._loop_stop.set)
        self._thread.join(15)
        self.sync_engine.dispose()

    def all_done(self) -> bool:
        with self.lock:
            expected = set(self.sent)
        done = sum(states(self.engine, self.schema, name)["completed"] for name in QUEUES)
        return done >= len(expected) and set(self.runs) >= expected


def upgrade_with_cli(database_url: str, schema: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "alkstore_sa.cli", "db", "upgrade", "--schema-version", "46",
         "--database-url", database_url, "--schema", schema],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


def switched(caplog: pytest.LogCaptureFixture, schema: str) -> list[logging.LogRecord]:
    """The ``schema_version_changed`` records logged for ``schema``."""
    return [
        r
        for r in caplog.records
        if getattr(r, "action", None) == "schema_version_changed"
        and getattr(r, "schema", None) == schema
    ]


@pytest.mark.parametrize("upgrader", ["node", "cli"])
def test_python_workers_on_26_switch_to_46_under_a_live_upgrade_and_lose_no_job(
    engine: Engine,
    database_url: str,
    schema26: str,
    node46: Any,
    spoken46: None,
    caplog: pytest.LogCaptureFixture,
    upgrader: str,
) -> None:
    schema = schema26
    caplog.set_level(logging.INFO, logger="alkstore_sa")
    flow = Flow(engine, database_url, schema)
    flow.start()
    boss = None
    try:
        time.sleep(BEFORE)
        assert version_of(engine, schema) == 26
        with flow.lock:
            before_upgrade = len(flow.runs)
        assert before_upgrade > 0  # jobs flowed at 26

        if upgrader == "node":
            boss = node46(schema, migrate=True)
        else:
            upgrade_with_cli(database_url, schema)
        moved_at = time.time()
        assert version_of(engine, schema) == 46

        every_engine = wait_until(
            lambda: len(switched(caplog, schema)) >= 3, timeout=names.SCHEMA_RECHECK_SECONDS + 5
        )
        assert every_engine, ([r.getMessage() for r in switched(caplog, schema)], flow.errors)
        noticed = max(r.created for r in switched(caplog, schema)) - moved_at
        assert noticed <= names.SCHEMA_RECHECK_SECONDS + 3, noticed
        if boss is not None:  # Node sends too, once the schema is its own
            for name in QUEUES:
                ids = boss.call(
                    "insert", name, [{"data": {"node": i}} for i in range(10)], {"returnId": True}
                )
                with flow.lock:
                    flow.sent += ids
        time.sleep(AFTER)
    finally:
        flow.stop_sending.set()
    try:
        assert wait_until(flow.all_done, timeout=30)
    finally:
        flow.stop()

    assert flow.errors == []
    runs = Counter(flow.runs)
    assert set(runs) == set(flow.sent)
    assert max(runs.values()) == 1, [i for i, n in runs.items() if n > 1][:5]
    for name in QUEUES:
        counted = states(engine, schema, name)
        assert set(counted) == {"completed"}, (name, counted)
    # One log line per engine that ran statements (the sender's and the two workers').
    changes = switched(caplog, schema)
    assert len(changes) == 3, [r.getMessage() for r in changes]
    assert {(r.__dict__["from"], r.__dict__["to"]) for r in changes} == {(26, 46)}
    # Claims after the switch are 46 claims: they stamp heartbeat_on.
    for name in QUEUES:
        [(beats,)] = sql(
            engine,
            schema,
            "SELECT count(*) FROM {s}.job WHERE name = :n AND heartbeat_on IS NOT NULL",
            n=name,
        )
        assert beats > 0, name
    errors = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("alkstore_sa") and r.levelno >= logging.ERROR
    ]
    assert errors == []
    if boss is not None:
        assert boss.errors() == []
