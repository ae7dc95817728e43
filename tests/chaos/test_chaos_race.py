"""Four worker processes racing on one queue: every job runs exactly once.

Holds docs/concepts/guarantees.md on concurrent workers: a claim is exclusive
(``FOR UPDATE SKIP LOCKED``), so without failures no job is attempted twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from chaos_support import race, rows
from sqlalchemy import Engine
from support.schemas import random_schema, throwaway

from alkstore_sa import migrate

pytestmark = pytest.mark.chaos

JOBS = 4_000
PROCESSES = 4


def test_four_processes_racing_on_4000_jobs_complete_each_exactly_once(
    database_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    seen = race(
        database_url,
        engine,
        schema,
        tmp_path,
        jobs=JOBS,
        processes=PROCESSES,
        CHAOS_CONCURRENCY="8",
    )
    per_process = Counter(a.label for a in seen.attempts)
    print(
        f"\nrace: {PROCESSES} processes, {JOBS} jobs, {len(seen.attempts)} attempts; "
        f"per process {dict(per_process)}"
    )
    seen.check_each_job_ran_once(JOBS, PROCESSES)
    effects = rows(engine, schema, "SELECT count(*), count(DISTINCT job_id) FROM {s}.chaos_effect")
    assert tuple(effects[0]) == (JOBS, JOBS)


def test_four_processes_under_the_cockroachdb_profile_complete_each_job_once(
    database_url: str, engine: Engine, tmp_path: Path
) -> None:
    """The ``cockroachdb`` profile on stock PostgreSQL, every flag of pg-boss's at once, on
    a schema built for it (docs/how-to/backends.md): one plain job table, claims that
    recheck the state instead of skipping locked rows (``noSkipLocked``), workers that
    poll (``noListenNotify``), and four processes supervising every half second with no
    advisory lock between them (``noAdvisoryLocks``), so their expiry and maintenance
    overlap."""
    schema = random_schema("crdb_")
    migrate.upgrade(engine, schema, backend="cockroachdb")
    with throwaway(engine, schema):
        _race_under_cockroachdb(database_url, engine, schema, tmp_path)


def _race_under_cockroachdb(database_url: str, engine: Engine, schema: str, tmp_path: Path) -> None:
    seen = race(
        database_url,
        engine,
        schema,
        tmp_path,
        backend="cockroachdb",
        jobs=2_000,
        processes=PROCESSES,
        # Fewer connections than the race above: the two may run at once on a server
        # with 100 connections.
        CHAOS_CONCURRENCY="4",
        CHAOS_POLL="0.2",
        CHAOS_BACKEND="cockroachdb",
    )
    seen.check_each_job_ran_once(2_000, PROCESSES)
