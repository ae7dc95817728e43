"""Failing jobs at schema 46: what the ``noMultiMutationCte`` flag of a distributed backend
costs on PostgreSQL itself (the "Database backends" page).

A fail is one statement on PostgreSQL: the rows are deleted, inserted again as ``retry`` or
``failed`` and copied to their dead letter queues at once. Under the flag it runs as five
statements in one transaction (``alkstore_sa.sql.v46.fail.SplitFail``). Each round claims a
batch and fails it for good in one transaction, until every job has failed once, with the
service as an application calls it; the split variant is compared with the one-statement
one.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from alkstore_sa import Backend, QueueService, Settlement
from alkstore_sa._engine_cache import engine_state
from alkstore_sa.migrations import attempts

from ..common import QUEUE, Config, Sample, Stopwatch, preload, reset
from . import Variant

SPLIT = Backend("postgres", frozenset({"noMultiMutationCte"}))
JOBS = 3_000
QUICK_JOBS = 600


def _fail_all(cfg: Config, n: int, batch: int, backend: Backend | None) -> float:
    """Jobs/s of claiming and failing ``n`` ready jobs, ``batch`` per transaction."""
    failed = 0
    with Stopwatch() as w:
        while True:
            with Session(cfg.engine) as session, session.begin():
                service = QueueService(session, schema=cfg.schema, backend=backend)
                jobs = service.fetch(QUEUE, batch)
                if not jobs:
                    break
                result = service.fail_many(QUEUE, [Settlement(job.id) for job in jobs])
                failed += len(result.affected)
    if failed != n:
        raise AssertionError(f"{failed} of {n} jobs failed")
    return n / w.seconds


def _variant(scenario: str, name: str, n: int, batch: int, **kw: Any) -> Variant:
    backend: Backend | None = kw.pop("backend", None)

    def run(cfg: Config) -> list[Sample]:
        reset(cfg)
        preload(cfg, QUEUE, n)
        # Failed for good at once (no retry left): each job is claimed and failed once.
        cfg.exec("UPDATE {s}.job SET retry_limit = 0")
        return [Sample(scenario, name, "jobs/s", _fail_all(cfg, n, batch, backend))]

    return Variant(scenario, name, run, kw.get("base"), kw.get("note", ""), rounds=3)


def _without_history(scenario: str, n: int, batch: int) -> Variant:
    """The one-statement fail on the same schema with the attempt history table removed
    for the run (put back after it): what recording each failed attempt costs."""

    def run(cfg: Config) -> list[Sample]:
        reset(cfg)
        preload(cfg, QUEUE, n)
        cfg.exec("UPDATE {s}.job SET retry_limit = 0")
        with cfg.engine.begin() as conn:
            attempts.remove(conn, cfg.schema)
        engine_state(cfg.engine).forget(cfg.schema)  # read the schema again: no table
        try:
            rate = _fail_all(cfg, n, batch, None)
        finally:
            with cfg.engine.begin() as conn:
                attempts.install(conn, cfg.schema)
            engine_state(cfg.engine).forget(cfg.schema)
        return [Sample(scenario, "QueueService fail_many, no attempt history", "jobs/s", rate)]

    return Variant(
        scenario,
        "QueueService fail_many, no attempt history",
        run,
        "QueueService fail_many",
        "the attempt history table removed: the ratio is what recording each attempt costs",
        rounds=3,
    )


def variants(cfg: Config) -> list[Variant]:
    """``fail b=1`` and ``fail b=100`` at 46: one statement, split, and without the
    attempt history."""
    if cfg.schema_version < 46:
        return []
    n = QUICK_JOBS if cfg.quick else JOBS
    out: list[Variant] = []
    for batch in (1, 100):
        scenario = f"fail b={batch}"
        count = n // 10 if batch == 1 else n
        out += [
            _variant(scenario, "QueueService fail_many", count, batch),
            _variant(
                scenario,
                "QueueService fail_many noMultiMutationCte",
                count,
                batch,
                backend=SPLIT,
                base="QueueService fail_many",
                note="the noMultiMutationCte flag forced on: five statements per fail",
            ),
            _without_history(scenario, count, batch),
        ]
    return out
