"""Shared plumbing: configuration, schema set-up, measurements and statistics."""

from __future__ import annotations

import json
import math
import statistics
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import sql
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, migrate

T = TypeVar("T")

DEFAULT_URL = "postgresql://postgres@127.0.0.1/test"
QUEUE = "bench"
OTHER_QUEUE = "bench_other"


def sa_url(url: str, driver: str = "psycopg") -> str:
    """The SQLAlchemy spelling of a libpq URL (``postgresql+psycopg://``)."""
    scheme, rest = url.split("://", 1)
    if "+" in scheme:
        scheme = scheme.split("+", 1)[0]
    return f"postgresql+{driver}://{rest}"


def libpq_url(url: str) -> str:
    """The libpq spelling of a SQLAlchemy URL (no ``+driver``)."""
    scheme, rest = url.split("://", 1)
    return f"postgresql://{rest}" if scheme.startswith("postgres") else url


@dataclass
class Config:
    """What every scenario needs: where to connect, how big, and the shared engines."""

    url: str
    schema: str
    quick: bool
    reps: int
    mixed_rate: float = 500.0
    mixed_async: bool = False
    schema_version: int = 26
    scale_max: int = 1_000_000
    engine: Engine = field(init=False)

    def __post_init__(self) -> None:
        # Enough connections for 10 workers, their listener and a few senders.
        self.engine = create_engine(sa_url(self.url), pool_size=24, max_overflow=8)

    def async_engine(self) -> AsyncEngine:
        """A new async engine: create it inside the event loop that will use it."""
        return create_async_engine(sa_url(self.url), pool_size=24, max_overflow=8)

    def size(self, full: T, quick: T) -> T:
        """``full`` normally, ``quick`` with ``--quick``."""
        return quick if self.quick else full

    def raw(self, *, autocommit: bool = False) -> psycopg.Connection[Any]:
        return psycopg.connect(libpq_url(self.url), autocommit=autocommit)

    async def araw(self, *, autocommit: bool = False) -> psycopg.AsyncConnection[Any]:
        return await psycopg.AsyncConnection.connect(libpq_url(self.url), autocommit=autocommit)

    def exec(self, statement: str, params: Sequence[Any] | dict[str, Any] | None = None) -> None:
        """Run maintenance SQL (``{s}`` = the quoted schema) in its own transaction."""
        with self.raw(autocommit=True) as conn:
            conn.execute(self.q(statement), params)

    def q(self, statement: str) -> sql.Composed:
        """``statement`` with ``{s}`` replaced by the quoted schema identifier."""
        return sql.SQL(statement).format(s=sql.Identifier(self.schema))

    def close(self) -> None:
        self.engine.dispose()


def install(cfg: Config) -> None:
    """A fresh schema at ``cfg.schema_version`` (26 or 46) and the benchmark queues."""
    drop(cfg)
    migrate.upgrade(cfg.engine, cfg.schema, schema_version=cfg.schema_version)
    with Session(cfg.engine) as session, session.begin():
        service = QueueService(session, schema=cfg.schema)
        service.create_queue(QUEUE)
        service.create_queue(OTHER_QUEUE)


def drop(cfg: Config) -> None:
    with cfg.raw(autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(cfg.schema)))


def reset(cfg: Config) -> None:
    """Empty the job table so every measured segment starts from the same state."""
    cfg.exec("TRUNCATE {s}.job")
    cfg.exec("VACUUM ANALYZE {s}.job_common")


def preload(cfg: Config, queue: str, count: int, *, deferred: bool = False) -> None:
    """Insert ``count`` no-op jobs quickly (one statement per 10,000), ready or far deferred."""
    start = "now() + interval '10 years'" if deferred else "now() - interval '1 second'"
    statement = (
        "INSERT INTO {s}.job (id, name, data, start_after, keep_until, policy) "
        f"SELECT gen_random_uuid(), %(q)s, jsonb_build_object('n', g), {start}, "
        f"{start} + interval '14 days', 'standard' FROM generate_series(1, %(n)s) g"
    )
    with cfg.raw() as conn:
        left = count
        while left > 0:
            n = min(left, 10_000)
            conn.execute(cfg.q(statement), {"q": queue, "n": n})
            left -= n
        conn.commit()
    cfg.exec("ANALYZE {s}.job_common")


def count_jobs(cfg: Config, queue: str, state: str) -> int:
    with cfg.raw(autocommit=True) as conn:
        row = conn.execute(
            cfg.q("SELECT count(*) FROM {s}.job WHERE name = %s AND state = %s::{s}.job_state"),
            (queue, state),
        ).fetchone()
    return int(row[0]) if row else 0


def new_schema() -> str:
    return "bench_" + uuid.uuid4().hex[:8]


# ------------------------------------------------------------------ statistics


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def spread(values: Sequence[float]) -> float:
    """(max - min) / median, in percent: how much the repetitions disagree."""
    if len(values) < 2:
        return 0.0
    m = median(values)
    return 100 * (max(values) - min(values)) / m if m else math.nan


class Stopwatch:
    """``with Stopwatch() as w: ...``; ``w.seconds`` afterwards."""

    def __enter__(self) -> Stopwatch:
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self.start


@dataclass
class Sample:
    """One measured run of one variant of one scenario."""

    scenario: str
    variant: str
    metric: str  # "jobs/s" (higher is better) or "ms" (lower is better)
    value: float
    extra: dict[str, float] = field(default_factory=dict)
    round: int = 0  # which interleaved round produced it (set by the runner)

    def to_json(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "variant": self.variant,
            "metric": self.metric,
            "value": self.value,
            "extra": self.extra,
            "round": self.round,
        }


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, default=str)
