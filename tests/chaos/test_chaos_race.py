"""Four worker processes racing on one queue: every job runs exactly once.

Holds docs/concepts/guarantees.md on concurrent workers: a claim is exclusive
(``FOR UPDATE SKIP LOCKED``), so without failures no job is attempted twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from chaos_app import create_tables
from chaos_support import Children, Deadline, rows, states
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos

JOBS = 4_000
PROCESSES = 4


def test_four_processes_racing_on_4000_jobs_complete_each_exactly_once(
    database_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    deadline = Deadline(120)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        svc.create_queue("chaos", retry_limit=0)
        assert all(svc.send_many("chaos", [{"data": {"n": i}} for i in range(JOBS)]))
    with Children(database_url, schema, tmp_path, CHAOS_CONCURRENCY="8") as kids:
        workers = [kids.start(f"w{i}") for i in range(PROCESSES)]
        deadline.wait_for(
            "every job to complete",
            lambda: states(engine, schema, "chaos") == {"completed": JOBS},
            100,
            interval=0.25,
            show=lambda: states(engine, schema, "chaos"),
        )
        for w in workers:
            kids.stop_gracefully(w)

    attempts = rows(engine, schema, "SELECT job_id, label FROM {s}.chaos_attempt")
    per_job = Counter(a.job_id for a in attempts)
    per_process = Counter(a.label for a in attempts)
    duplicates = {i: n for i, n in per_job.items() if n > 1}
    effects = rows(engine, schema, "SELECT count(*), count(DISTINCT job_id) FROM {s}.chaos_effect")
    print(
        f"\nrace: {PROCESSES} processes, {JOBS} jobs, {len(attempts)} attempts on "
        f"{len(per_job)} jobs, {len(duplicates)} duplicates; per process {dict(per_process)}"
    )
    assert len(per_job) == JOBS
    assert duplicates == {}
    assert len(attempts) == JOBS
    assert tuple(effects[0]) == (JOBS, JOBS)
    assert len(per_process) == PROCESSES, "not every process took part: no race happened"


def test_four_processes_claiming_without_skip_locked_or_notify_complete_each_job_once(
    database_url: str, engine: Engine, schema46: str, tmp_path: Path
) -> None:
    """The runtime of a distributed backend (``noSkipLocked``: claims recheck the state
    instead of skipping locked rows; ``noListenNotify``: workers poll), forced on stock
    PostgreSQL (docs/how-to/backends.md)."""
    jobs, schema = 2_000, schema46
    deadline = Deadline(120)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        svc.create_queue("chaos", retry_limit=0)
        assert all(svc.send_many("chaos", [{"data": {"n": i}} for i in range(jobs)]))
    with Children(
        database_url,
        schema,
        tmp_path,
        CHAOS_CONCURRENCY="8",
        CHAOS_POLL="0.2",
        CHAOS_BACKEND_FLAGS="noSkipLocked,noListenNotify",
    ) as kids:
        workers = [kids.start(f"w{i}") for i in range(PROCESSES)]
        deadline.wait_for(
            "every job to complete",
            lambda: states(engine, schema, "chaos") == {"completed": jobs},
            100,
            interval=0.25,
            show=lambda: states(engine, schema, "chaos"),
        )
        for w in workers:
            kids.stop_gracefully(w)
    attempts = rows(engine, schema, "SELECT job_id, label FROM {s}.chaos_attempt")
    per_job = Counter(a.job_id for a in attempts)
    assert len(per_job) == jobs and len(attempts) == jobs  # each job once, none twice
    assert len({a.label for a in attempts}) == PROCESSES, "no race happened"
