"""Poison rows queued ahead of good jobs, under a live worker process.

Holds docs/concepts/guarantees.md on poison rows (see also docs/concepts/limits.md):
a row no worker of ours can activate or read fails on its own, with an output saying
why, and the jobs behind it run.
"""

from __future__ import annotations

import random
import string
import uuid
from pathlib import Path

import pytest
from chaos_app import create_tables
from chaos_support import Children, Deadline, rows, states
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos

GOOD = 20


def _insert(engine: Engine, schema: str, queue: str, policy: str, column: str, sql: str) -> str:
    """INSERT one job as a foreign client would, with ``column`` set to the SQL ``sql``."""
    [(job_id,)] = rows(
        engine,
        schema,
        f"INSERT INTO {{s}}.job (name, policy, priority, {column})"
        f" VALUES (:name, :policy, 10, {sql}) RETURNING id",
        name=queue,
        policy=policy,
        key="".join(random.choices(string.ascii_letters + string.digits, k=5_000)),
    )
    assert isinstance(job_id, uuid.UUID)
    return column


def test_poison_rows_queued_first_fail_on_their_own_and_good_jobs_all_complete(
    database_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    deadline = Deadline(60)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        svc.create_queue("single", policy="singleton", retry_limit=3)
        svc.create_queue("plain", retry_limit=3)
    # Higher priority and older than every good job: each fetch meets them first.
    poison = {
        ("single", _insert(engine, schema, "single", "singleton", "singleton_key", ":key")),
        (
            "plain",
            _insert(
                engine, schema, "plain", "standard", "start_after", "'0001-01-01T00:00:00+14:00'"
            ),
        ),
        (
            "plain",
            _insert(
                engine,
                schema,
                "plain",
                "standard",
                "data",
                "(repeat('[', 1500) || repeat(']', 1500))::jsonb",
            ),
        ),
    }
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        for queue in ("single", "plain"):
            # Keys of their own, so the singleton queue's good jobs can run side by side.
            jobs = [{"data": {"n": i}, "singleton_key": f"k{i}"} for i in range(GOOD)]
            assert all(svc.send_many(queue, jobs))  # type: ignore[arg-type]

    def settled() -> bool:
        return all(
            states(engine, schema, q).get("completed", 0) == GOOD for q in ("single", "plain")
        )

    with Children(database_url, schema, tmp_path, CHAOS_QUEUES="single,plain") as kids:
        worker = kids.start("w0")
        deadline.wait_for(
            "the good jobs to complete",
            settled,
            40,
            interval=0.2,
            show=lambda: {q: states(engine, schema, q) for q in ("single", "plain")},
        )
        output = kids.stop_gracefully(worker)

    failed = rows(
        engine,
        schema,
        "SELECT name, output FROM {s}.job WHERE state = 'failed' ORDER BY name",
    )
    found = {(r.name, field) for r in failed for field in r.output.get("reasons", {})}
    print(
        f"\npoison: {len(poison)} poison rows failed with reasons "
        f"{sorted(f for _, f in found)}; {2 * GOOD} good jobs completed behind them"
    )
    for r in failed:
        print(f"  {r.name}: {r.output['message'][:160]}")
    assert {q: states(engine, schema, q) for q in ("single", "plain")} == {
        "single": {"completed": GOOD, "failed": 1},
        "plain": {"completed": GOOD, "failed": 2},
    }
    assert found == poison
    assert all(r.output["name"] == "PoisonJob" for r in failed)
    attempts = rows(engine, schema, "SELECT count(*) FROM {s}.chaos_attempt")[0][0]
    assert attempts == 2 * GOOD  # the handler never saw a poison row
    assert output.count("failed without running") == len(poison)
