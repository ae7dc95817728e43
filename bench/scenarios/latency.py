"""Scenario 4: pickup latency of an idle worker, from the sender's commit to handler start.

Jobs are sent one by one, each in its own transaction, about 20 ms apart, so
the worker is idle when each arrives and wakes on ``NOTIFY``. The latency of a
job is ``handler start - moment its sender's COMMIT returned`` (one process,
one monotonic clock). The ceiling is a raw psycopg connection that LISTENs and,
on each notification, fetches and completes with the ceiling's statements.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from psycopg import sql
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

from .. import ceiling
from ..common import QUEUE, Config, Sample, percentile, reset
from . import Variant

GAP = 0.020


class Clock:
    """Commit and start times by job number."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.committed: dict[int, float] = {}
        self.started: dict[int, float] = {}
        self.done = threading.Event()

    def start(self, data: Any) -> None:
        k = int(data["k"])
        self.started.setdefault(k, time.perf_counter())
        if len(self.started) >= self.n:
            self.done.set()

    def latencies_ms(self) -> list[float]:
        return [
            1000 * (self.started[k] - self.committed[k])
            for k in self.committed
            if k in self.started
        ]


def alkstore_sender(cfg: Config, clock: Clock) -> None:
    for k in range(clock.n):
        with Session(cfg.engine) as session, session.begin():
            QueueService(session, schema=cfg.schema).send(QUEUE, {"k": k})
        clock.committed[k] = time.perf_counter()
        time.sleep(GAP)


def ceiling_sender(cfg: Config, clock: Clock) -> None:
    st = ceiling.Statements(cfg.schema)
    with cfg.raw() as conn:
        for k in range(clock.n):
            ceiling.send(conn, st, QUEUE, [{"k": k}])
            conn.commit()
            clock.committed[k] = time.perf_counter()
            time.sleep(GAP)


def samples(scenario: str, variant: str, clock: Clock) -> list[Sample]:
    lat = clock.latencies_ms()
    if len(lat) < clock.n:
        raise RuntimeError(f"{variant}: only {len(lat)} of {clock.n} jobs were picked up")
    return [
        Sample(scenario, variant, f"p{p} ms", percentile(lat, p), {"jobs": float(len(lat))})
        for p in (50, 95, 99)
    ]


def run_worker(
    cfg: Config, n: int, concurrency: int | None = None, settings: dict[str, Any] | None = None
) -> Clock:
    from alkstore_sa.worker import Worker

    clock = Clock(n)
    settings = dict(settings or {})
    if concurrency is not None:
        settings["concurrency"] = concurrency
    worker = Worker(cfg.engine, schema=cfg.schema, **settings)
    worker.register(QUEUE, lambda job: clock.start(job.data))
    worker.start()
    try:
        time.sleep(0.2)  # idle, listening
        alkstore_sender(cfg, clock)
        clock.done.wait(10)
    finally:
        worker.stop(timeout=5)
    return clock


def run_async_worker(cfg: Config, n: int, concurrency: int | None = None) -> Clock:
    from alkstore_sa.worker import AsyncWorker

    clock = Clock(n)
    settings: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}

    async def main() -> None:
        engine = cfg.async_engine()
        worker = AsyncWorker(engine, schema=cfg.schema, **settings)

        async def handler(job: Any) -> None:
            clock.start(job.data)

        worker.register(QUEUE, handler)
        await worker.start()
        try:
            await asyncio.sleep(0.2)
            # The sender is another thread, as it would be another process.
            await asyncio.to_thread(alkstore_sender, cfg, clock)
            await asyncio.to_thread(clock.done.wait, 10)
        finally:
            await worker.stop(timeout=5)
            await engine.dispose()

    asyncio.run(main())
    return clock


def run_ceiling(cfg: Config, n: int) -> Clock:
    st = ceiling.Statements(cfg.schema)
    clock = Clock(n)
    ready = threading.Event()
    stop = threading.Event()

    def listen() -> None:
        with cfg.raw(autocommit=True) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(st.channel)))
            ready.set()
            while not stop.is_set():
                # Drain the notifications first: the generator holds the connection.
                if not list(conn.notifies(timeout=0.1, stop_after=1)):
                    continue
                while rows := ceiling.fetch(conn, st, QUEUE, 10):
                    for row in rows:
                        clock.start(row[ceiling.COL_DATA])
                    ceiling.complete(
                        conn, st, QUEUE, [(r[0], r[ceiling.COL_STARTED_ON]) for r in rows]
                    )

    thread = threading.Thread(target=listen)
    thread.start()
    ready.wait(5)
    try:
        time.sleep(0.2)
        ceiling_sender(cfg, clock)
        clock.done.wait(10)
    finally:
        stop.set()
        thread.join()
    return clock


def _variant(name: str, body: Callable[[Config, int], Clock], n: int, base: str | None) -> Variant:
    scenario = "pickup latency"

    def run(cfg: Config) -> list[Sample]:
        reset(cfg)
        return samples(scenario, name, body(cfg, n))

    return Variant(scenario, name, run, base, target=("<=", 2.0) if base else None)


def variants(cfg: Config) -> list[Variant]:
    n = cfg.size(150, 25)
    return [
        _variant("ceiling LISTEN", run_ceiling, n, None),
        _variant("Worker defaults", run_worker, n, "ceiling LISTEN"),
        _variant("AsyncWorker defaults", run_async_worker, n, "ceiling LISTEN"),
    ]
