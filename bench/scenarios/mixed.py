"""Scenario 5: senders and workers at the same time, for a while.

A separate sender process (an application service) runs four threads that each
send single-job transactions at a paced rate, an offered load, while the
workers drain the queue with concurrency 10 and fetch batches of 10.
Reported: the sustained completion rate, the latency from each sender's commit
to its handler's start (p50/p95/p99, on the system-wide monotonic clock, which
both processes read) and the largest backlog seen. The ceiling runs raw
senders and 10 raw fetch/complete threads woken by a raw LISTEN connection
(polling every 0.5 s as a floor), like the workers.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

from psycopg import sql
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

from .. import ceiling
from ..common import QUEUE, Config, Sample, libpq_url, percentile, reset, sa_url
from . import Variant

SENDERS = 4
CONCURRENCY = 10
BATCH = 10


def now() -> float:
    """CLOCK_MONOTONIC: one clock for the sender process and the worker's."""
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _send_process(url: str, schema: str, rate: float, raw: bool, pipe: Connection) -> None:
    """The sender service: paced single-job transactions until told to stop."""
    keys = itertools.count()
    committed: dict[int, float] = {}
    stop = threading.Event()
    engine = create_engine(sa_url(url), pool_size=SENDERS)

    def pace(per_second: float) -> Iterator[int]:
        interval, due = 1.0 / per_second, time.perf_counter()
        while not stop.is_set():
            yield next(keys)
            due += interval
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)

    def alkstore(per_second: float) -> None:
        for k in pace(per_second):
            with Session(engine) as session, session.begin():
                QueueService(session, schema=schema).send(QUEUE, {"k": k})
            committed[k] = now()

    def raw_psycopg(per_second: float) -> None:
        import psycopg

        st = ceiling.Statements(schema)
        with psycopg.connect(libpq_url(url)) as conn:
            for k in pace(per_second):
                ceiling.send(conn, st, QUEUE, [{"k": k}])
                conn.commit()
                committed[k] = now()

    # Warm up (imports, first connections) before saying ready.
    with Session(engine) as session:
        QueueService(session, schema=schema).get_queue(QUEUE)
    pipe.send("ready")
    pipe.recv()  # go
    target = raw_psycopg if raw else alkstore
    threads = [threading.Thread(target=target, args=(rate / SENDERS,)) for _ in range(SENDERS)]
    for t in threads:
        t.start()
    pipe.recv()  # stop
    stop.set()
    for t in threads:
        t.join()
    engine.dispose()
    pipe.send(committed)


class Load:
    """The sender process, and the start times the workers record."""

    def __init__(self, cfg: Config, seconds: float, rate: float, raw: bool) -> None:
        self.seconds = seconds
        self.started: dict[int, float] = {}
        self.committed: dict[int, float] = {}
        ctx = multiprocessing.get_context("spawn")
        self.pipe, child = ctx.Pipe()
        self.process = ctx.Process(
            target=_send_process, args=(cfg.url, cfg.schema, rate, raw, child), daemon=True
        )
        self.process.start()
        if not self.pipe.poll(60) or self.pipe.recv() != "ready":
            raise RuntimeError("the sender process did not start")

    def begin(self) -> None:
        self.pipe.send("go")

    def handled(self, data: Any) -> None:
        self.started.setdefault(int(data["k"]), now())

    def end(self) -> None:
        if self.process.is_alive():
            self.pipe.send("stop")
            self.committed = self.pipe.recv()
        self.process.join(10)

    def samples(self, scenario: str, variant: str, elapsed: float, backlog: int) -> list[Sample]:
        lat = [
            1000 * (s - self.committed[k]) for k, s in self.started.items() if k in self.committed
        ]
        extra = {"sent": float(len(self.committed)), "max_backlog": float(backlog)}
        out = [Sample(scenario, variant, "done jobs/s", len(self.started) / elapsed, extra)]
        out += [Sample(scenario, variant, f"p{p} ms", percentile(lat, p)) for p in (50, 95, 99)]
        return out


def _backlog(cfg: Config) -> int:
    with cfg.raw(autocommit=True) as conn:
        row = conn.execute(
            cfg.q("SELECT count(*) FROM {s}.job WHERE name = %s AND state < 'active'"), (QUEUE,)
        ).fetchone()
    return int(row[0]) if row else 0


def _watch(cfg: Config, load: Load) -> tuple[float, int]:
    """Let the load run; return the elapsed time and the largest backlog seen."""
    start, worst = time.perf_counter(), 0
    while time.perf_counter() - start < load.seconds:
        time.sleep(1.0)
        worst = max(worst, _backlog(cfg))
    return time.perf_counter() - start, worst


def run_worker(cfg: Config, seconds: float, rate: float) -> tuple[Load, float, int]:
    from alkstore_sa.worker import Worker

    load = Load(cfg, seconds, rate, raw=False)
    worker = Worker(cfg.engine, schema=cfg.schema, concurrency=CONCURRENCY, batch_size=BATCH)
    worker.register(QUEUE, lambda job: load.handled(job.data))
    worker.start()
    try:
        load.begin()
        elapsed, worst = _watch(cfg, load)
    finally:
        load.end()
        worker.stop(timeout=5)
    return load, elapsed, worst


def run_async_worker(cfg: Config, seconds: float, rate: float) -> tuple[Load, float, int]:
    from alkstore_sa.worker import AsyncWorker

    load = Load(cfg, seconds, rate, raw=False)
    out: list[Any] = []

    async def main() -> None:
        engine = cfg.async_engine()
        worker = AsyncWorker(engine, schema=cfg.schema, concurrency=CONCURRENCY, batch_size=BATCH)

        async def handler(job: Any) -> None:
            load.handled(job.data)

        worker.register(QUEUE, handler)
        await worker.start()
        try:
            load.begin()
            out.extend(await asyncio.to_thread(_watch, cfg, load))
        finally:
            await asyncio.to_thread(load.end)
            await worker.stop(timeout=5)
            await engine.dispose()

    asyncio.run(main())
    return load, out[0], out[1]


def run_ceiling(cfg: Config, seconds: float, rate: float) -> tuple[Load, float, int]:
    st = ceiling.Statements(cfg.schema)
    load = Load(cfg, seconds, rate, raw=True)
    wake = threading.Condition()
    ready = threading.Event()
    done = threading.Event()

    def listener() -> None:
        with cfg.raw(autocommit=True) as conn:
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(st.channel)))
            ready.set()
            while not done.is_set():
                # One notification = one job ready: wake one idle thread, not all.
                got = list(conn.notifies(timeout=0.1, stop_after=1))
                if got:
                    with wake:
                        wake.notify(len(got))

    def drain() -> None:
        with cfg.raw(autocommit=True) as conn:
            while not done.is_set():
                rows = ceiling.fetch(conn, st, QUEUE, BATCH)
                for row in rows:
                    load.handled(row[ceiling.COL_DATA])
                if rows:
                    ceiling.complete(
                        conn, st, QUEUE, [(r[0], r[ceiling.COL_STARTED_ON]) for r in rows]
                    )
                if len(rows) < BATCH:
                    # Caught up: sleep until a notification (or the 0.5 s poll).
                    with wake:
                        wake.wait(0.5)

    threads = [threading.Thread(target=listener)]
    threads += [threading.Thread(target=drain) for _ in range(CONCURRENCY)]
    threads[0].start()
    ready.wait(5)
    for t in threads[1:]:
        t.start()
    try:
        load.begin()
        elapsed, worst = _watch(cfg, load)
    finally:
        load.end()
        done.set()
        with wake:
            wake.notify_all()
        for t in threads:
            t.join()
    return load, elapsed, worst


def _variant(
    name: str,
    body: Callable[[Config, float, float], tuple[Load, float, int]],
    seconds: float,
    rate: float,
    base: str | None,
) -> Variant:
    scenario = f"mixed {rate:.0f}/s offered"

    def run(cfg: Config) -> list[Sample]:
        reset(cfg)
        load, elapsed, worst = body(cfg, seconds, rate)
        return load.samples(scenario, name, elapsed, worst)

    return Variant(scenario, name, run, base)


def variants(cfg: Config) -> list[Variant]:
    seconds = 10.0 if cfg.quick else 60.0
    rate = cfg.mixed_rate
    out = [
        _variant("ceiling", run_ceiling, seconds, rate, None),
        _variant("Worker c=10 b=10", run_worker, seconds, rate, "ceiling"),
    ]
    if cfg.mixed_async:
        # Opt-in (--mixed-async): three more minutes would break the 15-minute budget.
        out.append(_variant("AsyncWorker c=10 b=10", run_async_worker, seconds, rate, "ceiling"))
    return out
