"""Scenario 5: senders and workers at the same time, for a while.

Four sender threads each send single-job transactions at a paced rate (an
offered load, as an application would), while the workers drain the queue with
concurrency 10 and fetch batches of 10. Reported: the sustained completion
rate, the latency from each sender's commit to its handler's start
(p50/p95/p99) and the largest backlog seen. The ceiling runs raw senders and 10
raw fetch/complete threads woken by a raw LISTEN connection (polling every
0.5 s as a floor), like the workers.
"""

from __future__ import annotations

import asyncio
import itertools
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

SENDERS = 4
CONCURRENCY = 10
BATCH = 10


class Load:
    """Paced senders plus bookkeeping of commit and start times."""

    def __init__(self, cfg: Config, seconds: float, rate: float, raw: bool) -> None:
        self.cfg, self.seconds, self.rate, self.raw = cfg, seconds, rate, raw
        self.committed: dict[int, float] = {}
        self.started: dict[int, float] = {}
        self.keys = itertools.count()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def begin(self) -> None:
        per_thread = self.rate / SENDERS
        for _ in range(SENDERS):
            target = self._raw_sender if self.raw else self._sender
            t = threading.Thread(target=target, args=(per_thread,), daemon=True)
            t.start()
            self.threads.append(t)

    def _pace(self, per_second: float) -> Any:
        interval, due = 1.0 / per_second, time.perf_counter()
        while not self.stop.is_set():
            yield next(self.keys)
            due += interval
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)

    def _sender(self, per_second: float) -> None:
        engine, schema = self.cfg.engine, self.cfg.schema
        for k in self._pace(per_second):
            with Session(engine) as session, session.begin():
                QueueService(session, schema=schema).send(QUEUE, {"k": k})
            self.committed[k] = time.perf_counter()

    def _raw_sender(self, per_second: float) -> None:
        st = ceiling.Statements(self.cfg.schema)
        with self.cfg.raw() as conn:
            for k in self._pace(per_second):
                ceiling.send(conn, st, QUEUE, [{"k": k}])
                conn.commit()
                self.committed[k] = time.perf_counter()

    def handled(self, data: Any) -> None:
        self.started.setdefault(int(data["k"]), time.perf_counter())

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join()

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
