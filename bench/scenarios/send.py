"""Scenarios 1 and 2: ``send`` one job per transaction, and ``send_many`` in batches.

Besides alkstore_sa and the raw psycopg ceiling, the "SQLAlchemy floor"
variants run our compiled statement through a plain ``Session.execute`` with
parameters built the ceiling's way: the distance ceiling -> floor is the cost
of SQLAlchemy's Session itself, floor -> alkstore is the cost of our layer.

The "SQLAlchemy bare insert" variants are what an application would write without
a queue library: ``session.execute(insert(job).values(...))`` of the row a ``send``
of the same data stores (the queue's settings copied into it, read once), and a
commit. ``send`` one job per transaction is compared with them (target: at most
5 % slower, a ratio >= 0.952).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Table, insert, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import Session

from alkstore_sa import AsyncQueueService, JobSpec, QueueService
from alkstore_sa._engine_cache import execution_options
from alkstore_sa.sql.common import base as tables26
from alkstore_sa.sql.v26.send import insert_jobs
from alkstore_sa.sql.v46 import tables as tables46

from .. import ceiling
from ..common import QUEUE, Config, Sample, Stopwatch, reset
from . import Variant

WARMUP = 20
WARMUP_BATCHES = 5
"""Batches sent before a batch measurement: psycopg prepares a statement on its fifth
run on a connection (``prepare_threshold``), and the async variants start from a fresh
engine (so a fresh connection) each time, where the sync ones reuse a warm pool."""
SINGLE = "send 1 job/tx"
BARE_SYNC = "SQLAlchemy bare insert sync"
BARE_ASYNC = "SQLAlchemy bare insert async"
BARE_TARGET = round(1 / 1.05, 3)
"""``send`` at most 5 % slower than the bare insert: a rate ratio of at least 0.952."""

Body = Callable[[Config, list[list[dict[str, Any]]]], None]


def _batches(n_batches: int, size: int) -> list[list[dict[str, Any]]]:
    return [[{"n": b * size + i} for i in range(size)] for b in range(n_batches)]


# Each body sends every batch in its own committed transaction.


def alkstore_sync(cfg: Config, batches: list[list[dict[str, Any]]]) -> None:
    engine, schema = cfg.engine, cfg.schema
    if len(batches[0]) == 1:
        for (data,) in batches:
            with Session(engine) as session, session.begin():
                QueueService(session, schema=schema).send(QUEUE, data)
        return
    for datas in batches:
        jobs: list[JobSpec] = [{"data": d} for d in datas]
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema).send_many(QUEUE, jobs)


def floor_sync(cfg: Config, batches: list[list[dict[str, Any]]]) -> None:
    st, stmt, opts = (
        ceiling.Statements(cfg.schema),
        insert_jobs(notify=True, given=ceiling.GIVEN),
        execution_options(cfg.schema),
    )
    for datas in batches:
        with Session(cfg.engine) as session, session.begin():
            session.execute(
                stmt, ceiling.insert_params(st, QUEUE, datas), execution_options=opts
            ).all()


class BareRow:
    """The row ``send(QUEUE, data)`` stores, for a plain ``insert(job).values(...)``:
    the queue's settings (read once, here) where a send takes them from the queue,
    the columns a send leaves to the table's defaults left to them."""

    def __init__(self, cfg: Config) -> None:
        job, queue = (
            (tables46.JOB, tables46.QUEUE)
            if cfg.schema_version >= 46
            else (tables26.JOB, tables26.QUEUE)
        )
        self.job: Table = job
        names = ["policy", "retry_limit", "retry_delay", "retry_backoff", "retry_delay_max"]
        names += ["expire_seconds", "deletion_seconds", "retention_seconds", "dead_letter"]
        if cfg.schema_version >= 46:
            names.append("heartbeat_seconds")
        opts = execution_options(cfg.schema)
        with Session(cfg.engine) as session:
            row = session.execute(
                select(*(queue.c[n] for n in names)).where(queue.c.name == QUEUE),
                execution_options=opts,
            ).one()
        self.fixed = dict(zip(names, row, strict=True))
        self.retention = dt.timedelta(seconds=self.fixed.pop("retention_seconds"))
        self.fixed["priority"] = 0
        if cfg.schema_version >= 46:
            self.fixed.update(blocked=False, blocking=False, pending_dependencies=0)
        self.opts = opts

    def statement(self, data: Any) -> Any:
        now = dt.datetime.now(dt.UTC)
        return insert(self.job).values(
            id=uuid.uuid4(),
            name=QUEUE,
            data=data,
            start_after=now,
            keep_until=now + self.retention,
            **self.fixed,
        )


def bare_sync(cfg: Config, batches: list[list[dict[str, Any]]]) -> None:
    bare = BareRow(cfg)
    for (data,) in batches:
        with Session(cfg.engine) as session, session.begin():
            session.execute(bare.statement(data), execution_options=bare.opts)


def ceiling_sync(cfg: Config, batches: list[list[dict[str, Any]]]) -> None:
    st = ceiling.Statements(cfg.schema)
    with cfg.raw() as conn:
        for datas in batches:
            ceiling.send(conn, st, QUEUE, datas)
            conn.commit()


class AsyncSender:
    """An async sending loop whose engine or connection outlives warm-up and measurement."""

    def __init__(self, cfg: Config, kind: str) -> None:
        self.cfg, self.kind = cfg, kind
        self.st = ceiling.Statements(cfg.schema)
        self.opts = execution_options(cfg.schema)
        self.engine: Any = None
        self.conn: Any = None
        self.bare: Any = None

    async def open(self) -> None:
        if self.kind == "ceiling":
            self.conn = await self.cfg.araw()
        else:
            self.engine = self.cfg.async_engine()
        if self.kind == "bare":
            self.bare = await asyncio.to_thread(BareRow, self.cfg)

    async def send(self, batches: list[list[dict[str, Any]]]) -> None:
        schema, st = self.cfg.schema, self.st
        if self.kind == "ceiling":
            for datas in batches:
                await ceiling.asend(self.conn, st, QUEUE, datas)
                await self.conn.commit()
        elif self.kind == "floor":
            stmt = insert_jobs(notify=True, given=ceiling.GIVEN)
            for datas in batches:
                async with AsyncSession(self.engine) as session, session.begin():
                    params = ceiling.insert_params(st, QUEUE, datas)
                    (await session.execute(stmt, params, execution_options=self.opts)).all()
        elif self.kind == "bare":
            for (data,) in batches:
                async with AsyncSession(self.engine) as session, session.begin():
                    await session.execute(self.bare.statement(data), execution_options=self.opts)
        elif len(batches[0]) == 1:
            for (data,) in batches:
                async with AsyncSession(self.engine) as session, session.begin():
                    await AsyncQueueService(session, schema=schema).send(QUEUE, data)
        else:
            for datas in batches:
                jobs: list[JobSpec] = [{"data": d} for d in datas]
                async with AsyncSession(self.engine) as session, session.begin():
                    await AsyncQueueService(session, schema=schema).send_many(QUEUE, jobs)

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
        if self.engine is not None:
            await self.engine.dispose()


def _timed(body: Body, n_batches: int, size: int) -> Callable[[Config], float]:
    def run(cfg: Config) -> float:
        body(cfg, _batches(WARMUP, size) if size == 1 else _batches(WARMUP_BATCHES, size))
        batches = _batches(n_batches, size)
        with Stopwatch() as w:
            body(cfg, batches)
        return n_batches * size / w.seconds

    return run


def _atimed(kind: str, n_batches: int, size: int = 1) -> Callable[[Config], float]:
    def run(cfg: Config) -> float:
        async def main() -> float:
            sender = AsyncSender(cfg, kind)
            await sender.open()
            try:
                await sender.send(
                    _batches(WARMUP, size) if size == 1 else _batches(WARMUP_BATCHES, size)
                )
                batches = _batches(n_batches, size)
                with Stopwatch() as w:
                    await sender.send(batches)
            finally:
                await sender.close()
            return n_batches * size / w.seconds

        return asyncio.run(main())

    return run


def _variant(
    scenario: str,
    name: str,
    fn: Callable[[Config], float],
    base: str | None = None,
    target: tuple[str, float] | None = None,
    *,
    rounds: int,
    note: str = "",
) -> Variant:
    def run(cfg: Config) -> list[Sample]:
        reset(cfg)
        return [Sample(scenario, name, "jobs/s", fn(cfg))]

    return Variant(scenario, name, run, base, note, target, rounds=rounds)


def variants(cfg: Config) -> list[Variant]:
    rounds = cfg.size(5, 2)
    n = cfg.size(1500, 200) // rounds
    floor = "our statement through a bare Session.execute"
    bare = "session.execute(insert(job).values(...)) of the same row"
    out = [
        _variant(SINGLE, "ceiling sync", _timed(ceiling_sync, n, 1), rounds=rounds),
        _variant(
            SINGLE,
            "SQLAlchemy floor sync",
            _timed(floor_sync, n, 1),
            "ceiling sync",
            rounds=rounds,
            note=floor,
        ),
        _variant(
            SINGLE,
            BARE_SYNC,
            _timed(bare_sync, n, 1),
            "ceiling sync",
            rounds=rounds,
            note=bare,
        ),
        _variant(
            SINGLE,
            "alkstore sync",
            _timed(alkstore_sync, n, 1),
            BARE_SYNC,
            (">=", BARE_TARGET),
            rounds=rounds,
        ),
        _variant(SINGLE, "ceiling async", _atimed("ceiling", n), rounds=rounds),
        _variant(
            SINGLE,
            "SQLAlchemy floor async",
            _atimed("floor", n),
            "ceiling async",
            rounds=rounds,
            note=floor,
        ),
        _variant(
            SINGLE,
            BARE_ASYNC,
            _atimed("bare", n),
            "ceiling async",
            rounds=rounds,
            note=bare,
        ),
        _variant(
            SINGLE,
            "alkstore async",
            _atimed("alkstore", n),
            BARE_ASYNC,
            (">=", BARE_TARGET),
            rounds=rounds,
        ),
    ]
    for size, full, quick in ((10, 5_000, 500), (100, 20_000, 2_000), (1000, 60_000, 6_000)):
        scenario = f"send_many {size}/tx"
        n_batches = max(1, cfg.size(full, quick) // size // rounds)
        target = (">=", 0.7) if size == 1000 else None
        out += [
            _variant(
                scenario, "ceiling sync", _timed(ceiling_sync, n_batches, size), rounds=rounds
            ),
            _variant(
                scenario,
                "SQLAlchemy floor sync",
                _timed(floor_sync, n_batches, size),
                "ceiling sync",
                rounds=rounds,
                note=floor,
            ),
            _variant(
                scenario,
                "alkstore sync",
                _timed(alkstore_sync, n_batches, size),
                "ceiling sync",
                target,
                rounds=rounds,
            ),
        ]
        if size == 1000:
            out.append(
                _variant(
                    scenario,
                    "alkstore async",
                    _atimed("alkstore", n_batches, size),
                    "alkstore sync",
                    (">=", 0.95),
                    rounds=rounds,
                )
            )
    return out
