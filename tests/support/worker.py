"""Harness for the worker tests: one sync-looking API over Worker and AsyncWorker.

Test modules import :class:`Harness` and the ``harness`` fixture from here; the
fixture runs each test once with the threaded worker and once with the asyncio
worker (on an event loop in a background thread).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session

from alkstore_sa import AsyncWorker, QueueService, Worker
from alkstore_sa.records import Job
from support.statements import recorded


def wait_for(predicate: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02) -> Any:
    """Poll ``predicate`` until it is truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        time.sleep(interval)


def claims(worker: Any, queue: str) -> int:
    """How many claim statements ``worker`` has run for ``queue`` (empty answers included)."""
    return int(worker.stats()[queue].claims)


def settled_claims(worker: Any, queue: str, at_least: int = 1, quiet: float = 0.2) -> int:
    """Wait until ``worker`` has claimed on ``queue`` ``at_least`` times and then not again
    for ``quiet`` seconds (its start's claims are behind it); the count then."""
    wait_for(lambda: claims(worker, queue) >= at_least)
    while True:
        seen = claims(worker, queue)
        time.sleep(quiet)
        if claims(worker, queue) == seen:
            return seen


class Harness:
    """Builds workers and handlers of one flavour and drives them synchronously."""

    def __init__(self, flavour: str, engine: Engine, schema: str, database_url: str) -> None:
        self.flavour = flavour
        self.engine = engine
        self.schema = schema
        self.loop: asyncio.AbstractEventLoop | None = None
        self.async_engine: AsyncEngine | None = None
        self._thread: threading.Thread | None = None
        if flavour == "async":
            self.loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
            self._thread.start()
            self.async_engine = create_async_engine(database_url)
        self.workers: list[Any] = []
        self.started: list[uuid.UUID] = []
        self.cancelled: list[uuid.UUID] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    @property
    def is_async(self) -> bool:
        return self.flavour == "async"

    # ----------------------------------------------------------- database

    def service_tx(self, fn: Callable[[QueueService], Any], **kwargs: Any) -> Any:
        """Run ``fn(service)`` in its own committed transaction."""
        with Session(self.engine) as session, session.begin():
            return fn(QueueService(session, schema=self.schema, **kwargs))

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.engine.begin() as conn:
            result = conn.execute(text(statement.replace("{s}", f'"{self.schema}"')), params)
            return list(result.all()) if result.returns_rows else []

    def job(self, queue: str, job_id: uuid.UUID) -> Job:
        job = self.service_tx(lambda q: q.get_job(queue, job_id))
        assert isinstance(job, Job)
        return job

    def statements(self) -> Any:
        """SQL statements sent by the workers' engine while the block runs."""
        return recorded(
            self.async_engine.sync_engine if self.async_engine is not None else self.engine
        )

    # ----------------------------------------------------------- workers

    def worker(self, **options: Any) -> Any:
        options.setdefault("schema", self.schema)
        options.setdefault("supervise", False)
        options.setdefault("shutdown_timeout", 5)
        if self.is_async:
            assert self.async_engine is not None
            w: Any = AsyncWorker(self.async_engine, **options)
        else:
            w = Worker(self.engine, **options)
        self.workers.append(w)
        return w

    def call(self, value: Any, timeout: float = 30.0) -> Any:
        """Run a coroutine on the harness loop (async flavour) and wait for it."""
        if asyncio.iscoroutine(value):
            assert self.loop is not None
            return asyncio.run_coroutine_threadsafe(value, self.loop).result(timeout)
        return value

    def start(self, worker: Any) -> Any:
        self.call(worker.start())
        return worker

    def stop(self, worker: Any, timeout: float | None = None) -> float:
        """Stop ``worker``; returns how long it took."""
        began = time.monotonic()
        self.call(worker.stop(timeout))
        return time.monotonic() - began

    # ----------------------------------------------------------- handlers

    def handler(
        self,
        body: Callable[..., Any] | None = None,
        *,
        sleep: float = 0.0,
        block: threading.Event | Callable[[Job], threading.Event | None] | None = None,
        on_start: Callable[[Job], Any] | None = None,
        sql: str | None = None,
    ) -> Callable[..., Any]:
        """A handler of this flavour: record the start, run ``on_start(job)``,
        sleep, wait for ``block``, execute ``sql`` (transactional handlers, with
        ``:id`` bound to the job id), then return ``body(job)`` (or raise).
        ``block`` may be a function of the job giving the event to wait for.
        """

        def gate(job: Job) -> threading.Event | None:
            return block(job) if callable(block) else block

        def enter(job: Job) -> None:
            with self._lock:
                self.started.append(job.id)
                self.active += 1
                self.max_active = max(self.max_active, self.active)
            if on_start is not None:
                on_start(job)

        def leave() -> None:
            with self._lock:
                self.active -= 1

        if not self.is_async:

            def sync_handler(job: Job, session: Session | None = None) -> Any:
                enter(job)
                try:
                    if sleep:
                        time.sleep(sleep)
                    event = gate(job)
                    if event is not None:
                        event.wait(30)
                    if sql is not None and session is not None:
                        session.execute(
                            text(sql.replace("{s}", f'"{self.schema}"')), {"id": job.id}
                        )
                    return body(job) if body is not None else None
                finally:
                    leave()

            return sync_handler

        async def async_handler(job: Job, session: Any = None) -> Any:
            enter(job)
            try:
                if sleep:
                    await asyncio.sleep(sleep)
                event = gate(job)
                while event is not None and not event.is_set():
                    await asyncio.sleep(0.01)
                if sql is not None and session is not None:
                    statement = text(sql.replace("{s}", f'"{self.schema}"'))
                    await session.execute(statement, {"id": job.id})
                return body(job) if body is not None else None
            except asyncio.CancelledError:
                with self._lock:
                    self.cancelled.append(job.id)
                raise
            finally:
                leave()

        return async_handler

    def close(self) -> None:
        for w in self.workers:
            with suppress(Exception):
                self.stop(w, 0)
        if self.loop is not None:
            if self.async_engine is not None:
                self.call(self.async_engine.dispose())
            self.loop.call_soon_threadsafe(self.loop.stop)
            assert self._thread is not None
            self._thread.join(5)
            self.loop.close()


def send(h: Harness, queue: str, data: Any = None, **options: Any) -> uuid.UUID:
    """Send one job in its own transaction and return its id."""
    job_id = h.service_tx(lambda q: q.send(queue, data, **options))
    assert isinstance(job_id, uuid.UUID)
    return job_id


def state_of(h: Harness, queue: str, job_id: uuid.UUID) -> str:
    """The job's current state, as text."""
    return str(h.job(queue, job_id).state.value)
