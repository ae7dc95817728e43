"""Scenario 3 (and 6): drain pre-enqueued no-op jobs at concurrency 10.

The ceiling is 10 threads (or asyncio tasks), each with its own autocommit
psycopg connection, looping fetch-batch -> complete-batch. alkstore_sa runs the
same work through its ``Worker``/``AsyncWorker`` (with their own architecture:
one fetch loop per queue, a handler pool and a batching completer) and, to
separate the library's per-statement cost from the worker's design, through
plain ``QueueService.fetch``/``complete_many`` loops shaped exactly like the
ceiling's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from alkstore_sa import AsyncQueueService, Backend, QueueService
from alkstore_sa.ops import Settlement

from .. import ceiling
from ..common import QUEUE, Config, Sample, Stopwatch, count_jobs, preload, reset
from . import Variant

CONCURRENCY = 10

Body = Callable[[Config, Callable[[], None]], float]
"""A measured drain: given the function that enqueues the jobs, returns jobs/s."""


def _check(cfg: Config, n: int) -> None:
    done = count_jobs(cfg, QUEUE, "completed")
    if done != n:
        raise RuntimeError(f"drain finished with {done} completed jobs, expected {n}")


# ------------------------------------------------------------------ ceiling


def ceiling_sync(cfg: Config, n: int, batch: int) -> float:
    st = ceiling.Statements(cfg.schema)
    go = threading.Event()
    conns = [cfg.raw(autocommit=True) for _ in range(CONCURRENCY)]

    def loop(conn: Any) -> None:
        go.wait()
        while rows := ceiling.fetch(conn, st, QUEUE, batch):
            for _row in rows:
                pass  # the no-op handler
            ceiling.complete(conn, st, QUEUE, [(r[0], r[ceiling.COL_STARTED_ON]) for r in rows])

    threads = [threading.Thread(target=loop, args=(c,)) for c in conns]
    for t in threads:
        t.start()
    with Stopwatch() as w:
        go.set()
        for t in threads:
            t.join()
    for c in conns:
        c.close()
    return n / w.seconds


async def ceiling_async(cfg: Config, n: int, batch: int) -> float:
    st = ceiling.Statements(cfg.schema)
    conns = [await cfg.araw(autocommit=True) for _ in range(CONCURRENCY)]

    async def loop(conn: Any) -> None:
        while rows := await ceiling.afetch(conn, st, QUEUE, batch):
            for _row in rows:
                pass
            await ceiling.acomplete(
                conn, st, QUEUE, [(r[0], r[ceiling.COL_STARTED_ON]) for r in rows]
            )

    with Stopwatch() as w:
        await asyncio.gather(*(loop(c) for c in conns))
    for c in conns:
        await c.close()
    return n / w.seconds


# ------------------------------------------------------------------ alkstore service loops


def service_sync(cfg: Config, n: int, batch: int) -> float:
    engine, schema = cfg.engine, cfg.schema
    go = threading.Event()

    def loop() -> None:
        go.wait()
        while True:
            with Session(engine) as session, session.begin():
                jobs = QueueService(session, schema=schema).fetch(QUEUE, batch)
            if not jobs:
                return
            for _job in jobs:
                pass
            with Session(engine) as session, session.begin():
                QueueService(session, schema=schema).complete_many(
                    QUEUE, [Settlement(j.id, None, j.started_on) for j in jobs]
                )

    threads = [threading.Thread(target=loop) for _ in range(CONCURRENCY)]
    for t in threads:
        t.start()
    with Stopwatch() as w:
        go.set()
        for t in threads:
            t.join()
    return n / w.seconds


async def service_async(cfg: Config, n: int, batch: int) -> float:
    engine, schema = cfg.async_engine(), cfg.schema

    async def loop() -> None:
        while True:
            async with AsyncSession(engine) as session, session.begin():
                jobs = await AsyncQueueService(session, schema=schema).fetch(QUEUE, batch)
            if not jobs:
                return
            async with AsyncSession(engine) as session, session.begin():
                await AsyncQueueService(session, schema=schema).complete_many(
                    QUEUE, [Settlement(j.id, None, j.started_on) for j in jobs]
                )

    try:
        # Open the pool's connections before the clock starts, as the ceiling does.
        async with AsyncSession(engine) as session, session.begin():
            await AsyncQueueService(session, schema=schema).get_queue(QUEUE)
        with Stopwatch() as w:
            await asyncio.gather(*(loop() for _ in range(CONCURRENCY)))
    finally:
        await engine.dispose()
    return n / w.seconds


# ------------------------------------------------------------------ workers


NO_SKIP_LOCKED = Backend("postgres", frozenset({"noSkipLocked"}))


def _noop(job: Any) -> None:
    return None


async def _anoop(job: Any) -> None:
    return None


def worker_sync(
    cfg: Config,
    n: int,
    settings: dict[str, Any],
    prepare: Callable[[], None],
    cap: float | None = None,
    concurrency: int = CONCURRENCY,
) -> float:
    """Jobs/s of a ``Worker`` draining ``n`` jobs; with ``cap``, of its first ``cap`` seconds.

    A capped run keeps more jobs ready than a full drain does on average, which
    makes each claim dearer (see ``drain_variants``): the cap never flatters us.
    """
    from alkstore_sa.worker import Worker

    worker = Worker(cfg.engine, schema=cfg.schema, concurrency=concurrency, **settings)
    worker.register(QUEUE, _noop)
    worker.start()
    try:
        prepare()
        with Stopwatch() as w:
            worker.wake(QUEUE)
            deadline = time.perf_counter() + (cap or float("inf"))
            while (done := worker.stats()[QUEUE].completed) < n:
                if time.perf_counter() > deadline:
                    break
                time.sleep(0.002)
    finally:
        worker.stop(timeout=10)
    return done / w.seconds


async def worker_async(
    cfg: Config,
    n: int,
    settings: dict[str, Any],
    prepare: Callable[[], None],
    cap: float | None = None,
    concurrency: int = CONCURRENCY,
) -> float:
    """:func:`worker_sync` for the ``AsyncWorker``."""
    from alkstore_sa.worker import AsyncWorker

    engine = cfg.async_engine()
    worker = AsyncWorker(engine, schema=cfg.schema, concurrency=concurrency, **settings)
    worker.register(QUEUE, _anoop)
    await worker.start()
    try:
        await asyncio.to_thread(prepare)
        with Stopwatch() as w:
            worker.wake(QUEUE)
            deadline = time.perf_counter() + (cap or float("inf"))
            while (done := worker.stats()[QUEUE].completed) < n:
                if time.perf_counter() > deadline:
                    break
                await asyncio.sleep(0.002)
    finally:
        await worker.stop(timeout=10)
        await engine.dispose()
    return done / w.seconds


# ------------------------------------------------------------------ variants


def _variant(
    scenario: str,
    name: str,
    body: Body,
    n: int,
    *,
    backlog: int = 0,
    base: str | None = None,
    target: float | None = None,
    note: str = "",
    capped: bool = False,
) -> Variant:
    def run(cfg: Config) -> list[Sample]:
        reset(cfg)

        def prepare() -> None:
            if backlog:
                # Far in the future, in the same queue: they sit in the fetch index.
                preload(cfg, QUEUE, backlog, deferred=True)
            preload(cfg, QUEUE, n)

        rate = body(cfg, prepare)
        if not capped:
            _check(cfg, n)
        return [Sample(scenario, name, "jobs/s", rate)]

    goal = (">=", target) if target is not None else None
    return Variant(scenario, name, run, base, note, goal)


def _pre(fn: Callable[[Config], float]) -> Body:
    """A body that needs the jobs in place before it starts its clock."""

    def body(cfg: Config, prepare: Callable[[], None]) -> float:
        prepare()
        return fn(cfg)

    return body


def _loop(fn: Callable[[Config, int, int], float], n: int, batch: int) -> Body:
    return _pre(lambda cfg: fn(cfg, n, batch))


def _aloop(
    fn: Callable[[Config, int, int], Coroutine[Any, Any, float]], n: int, batch: int
) -> Body:
    return _pre(lambda cfg: asyncio.run(fn(cfg, n, batch)))


def _worker(n: int, settings: dict[str, Any], cap: float | None = None) -> Body:
    return lambda cfg, prepare: worker_sync(cfg, n, settings, prepare, cap)


def _async_worker(n: int, settings: dict[str, Any], cap: float | None = None) -> Body:
    return lambda cfg, prepare: asyncio.run(worker_async(cfg, n, settings, prepare, cap))


def drain_variants(cfg: Config) -> list[Variant]:
    out: list[Variant] = []
    loop_note = "QueueService fetch/complete_many loops shaped like the ceiling"
    # The claim statement sorts every ready job of the queue (schema 26 has no
    # index in fetch order), so its cost grows with the ready backlog: both sides
    # drain the same number of jobs.
    # The default settings (batch 1) are slow enough that their runs are capped.
    cap = cfg.size(10.0, 1.0)
    for batch, n in ((10, cfg.size(3_000, 1_000)), (100, cfg.size(10_000, 1_500))):
        scenario = f"drain c=10 b={batch}"
        ceil, aceil = f"ceiling threads b={batch}", f"ceiling tasks b={batch}"
        out += [
            _variant(scenario, ceil, _loop(ceiling_sync, n, batch), n),
            _variant(
                scenario,
                f"service loop b={batch}",
                _loop(service_sync, n, batch),
                n,
                base=ceil,
                note=loop_note,
            ),
            _variant(
                scenario,
                f"Worker b={batch}",
                _worker(n, {"batch_size": batch}),
                n,
                base=ceil,
                target=0.5,
            ),
        ]
        if batch == 100:
            # What the optional instruments cost: the variant above counts into
            # prometheus_client (when installed) and opens a span per job (when
            # OpenTelemetry is, with whatever provider is set: none here).
            out.append(
                _variant(
                    scenario,
                    f"Worker b={batch} no metrics",
                    _worker(n, {"batch_size": batch, "metrics": False}),
                    n,
                    base=ceil,
                    note="metrics=False: the worker's Prometheus counters off",
                )
            )
        if cfg.schema_version >= 46:
            # What a distributed backend's claim costs on PostgreSQL itself (the
            # "Database backends" page): no SKIP LOCKED, the state rechecked instead.
            out.append(
                _variant(
                    scenario,
                    f"Worker b={batch} noSkipLocked",
                    _worker(n, {"batch_size": batch, "backend": NO_SKIP_LOCKED}),
                    n,
                    base=f"Worker b={batch}",
                    note="the noSkipLocked flag forced on: claims wait for and skip each other",
                )
            )
        if batch == 10:
            out.append(
                _variant(
                    scenario,
                    "Worker defaults",
                    _worker(n, {}, cap),
                    n,
                    base=ceil,
                    target=0.5,
                    note=f"concurrency 10, other settings default; first {cap:g} s of the drain",
                    capped=True,
                )
            )
        out += [
            _variant(
                scenario,
                aceil,
                _aloop(ceiling_async, n, batch),
                n,
            ),
            _variant(
                scenario,
                f"async service loop b={batch}",
                _aloop(service_async, n, batch),
                n,
                base=aceil,
                note=loop_note,
            ),
            _variant(
                scenario,
                f"AsyncWorker b={batch}",
                _async_worker(n, {"batch_size": batch}),
                n,
                base=aceil,
                target=0.5,
            ),
        ]
        if batch == 10:
            out.append(
                _variant(
                    scenario,
                    "AsyncWorker defaults",
                    _async_worker(n, {}, cap),
                    n,
                    base=aceil,
                    target=0.5,
                    note=f"concurrency 10, other settings default; first {cap:g} s of the drain",
                    capped=True,
                )
            )
    return out


def backlog_variants(cfg: Config) -> list[Variant]:
    """Scenario 6: the same drain with a large deferred backlog in the same queue."""
    n, backlog = cfg.size(3_000, 1_000), cfg.size(100_000, 10_000)
    scenario = f"drain b=10 + {backlog // 1000}k deferred"
    settings = {"batch_size": 10}
    return [
        _variant(scenario, "Worker b=10, no backlog", _worker(n, settings), n),
        _variant(
            scenario,
            "Worker b=10, backlog",
            _worker(n, settings),
            n,
            backlog=backlog,
            base="Worker b=10, no backlog",
            target=0.8,
        ),
        _variant(scenario, "ceiling b=10, no backlog", _loop(ceiling_sync, n, 10), n),
        _variant(
            scenario,
            "ceiling b=10, backlog",
            _loop(ceiling_sync, n, 10),
            n,
            backlog=backlog,
            base="ceiling b=10, no backlog",
        ),
    ]


def variants(cfg: Config) -> list[Variant]:
    return drain_variants(cfg) + backlog_variants(cfg)
