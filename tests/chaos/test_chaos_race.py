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

from alkstore_sa.backends import FOLLOWED_FLAGS

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


def test_four_processes_under_every_followed_runtime_flag_complete_each_job_once(
    database_url: str, engine: Engine, schema46: str, tmp_path: Path
) -> None:
    """The runtime of a distributed backend forced on stock PostgreSQL, every flag
    alkstore_sa follows at once (docs/how-to/backends.md): claims recheck the state
    instead of skipping locked rows (``noSkipLocked``), workers poll
    (``noListenNotify``), and the four processes supervise every half second with no
    advisory lock between them (``noAdvisoryLocks``), so their expiry and maintenance
    overlap."""
    seen = race(
        database_url,
        engine,
        schema46,
        tmp_path,
        jobs=2_000,
        processes=PROCESSES,
        # Fewer connections than the race above: the two may run at once on a server
        # with 100 connections.
        CHAOS_CONCURRENCY="4",
        CHAOS_POLL="0.2",
        CHAOS_BACKEND_FLAGS=",".join(FOLLOWED_FLAGS),
    )
    seen.check_each_job_ran_once(2_000, PROCESSES)
