"""``kill -9`` (and SIGSTOP) of a worker at default settings, schema 26: its jobs are
back within a minute, not after the queue's lease (``expire_seconds``, 900 s).

Schema 26 has no heartbeats: our workers record their claims in ``alkstore_claim``
and renew their own liveness row; a live worker's sweep fails for retry the active
jobs whose claimer stopped renewing (docs/concepts/guarantees.md, "A crashed worker's
jobs"). The same runs as ``test_chaos_rescue.py`` (schema 46).
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from chaos_app import application_name, create_tables
from chaos_support import Deadline, freeze_between_transactions, in_flight, rows, states
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from test_chaos_rescue import RESCUE_WITHIN, DefaultChildren, db_now, send, warm

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos


def live(engine: Engine, schema: str, label: str) -> bool:
    """The worker ``label`` has a connection open (it is up; 26 has no instance rows)."""
    found = rows(
        engine,
        schema,
        "SELECT 1 FROM pg_stat_activity WHERE application_name = :a",
        a=application_name(schema, label),
    )
    return bool(found)


def test_kill_9_at_defaults_brings_running_and_buffered_jobs_back_within_a_minute_at_26(
    database_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    deadline = Deadline(150)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        QueueService(s, schema=schema).create_queue("chaos")  # defaults: 900 s lease
    with DefaultChildren(database_url, schema, tmp_path) as kids:
        victim = kids.start("victim")
        deadline.wait_for("the victim to start", lambda: live(engine, schema, "victim"), 30)
        warm(deadline, engine, schema)
        running = send(engine, schema, [{"sleep": 600, "only_in": "victim"}] * 4)
        buffered = send(engine, schema, [{"sleep": 0}] * 8)
        ours = set(running) | set(buffered)

        def held() -> bool:
            [(active,)] = rows(
                engine, schema, "SELECT count(*) FROM {s}.job WHERE state = 'active'"
            )
            return in_flight(engine, schema, "victim") == set(running) and active == 12

        deadline.wait_for("the victim to hold 4 running and 8 buffered jobs", held, 20)
        rescuer = kids.start("rescuer")
        deadline.wait_for("the rescuer to start", lambda: live(engine, schema, "rescuer"), 30)
        victim.signal(signal.SIGKILL)
        victim.proc.wait(5)
        killed_at = db_now(engine, schema)
        deadline.wait_for(
            "every job to complete",
            lambda: states(engine, schema, "chaos") == {"completed": 15},
            RESCUE_WITHIN + 15,
            interval=0.25,
            show=lambda: states(engine, schema, "chaos"),
        )
        kids.stop_gracefully(rescuer)
    jobs = {
        r.id: r
        for r in rows(engine, schema, "SELECT id, retry_count, completed_on, output FROM {s}.job")
        if r.id in ours
    }
    attempts = rows(engine, schema, "SELECT job_id, label FROM {s}.chaos_attempt")
    per_job = Counter(a.job_id for a in attempts if a.job_id in ours)
    last = max(j.completed_on for j in jobs.values())
    rescue = (last - killed_at).total_seconds()
    print(
        f"\nkill -9 at defaults (26): the last of 12 jobs completed {rescue:.1f} s after the kill"
    )
    assert rescue <= RESCUE_WITHIN
    assert all(j.output == {"label": "rescuer"} for j in jobs.values())
    assert {i: per_job[i] for i in running} == {i: 2 for i in running}
    assert {i: per_job[i] for i in buffered} == {i: 1 for i in buffered}
    assert all(j.retry_count == 1 for i, j in jobs.items() if i in running)
    # Failed through the normal fail path, recorded as a heartbeat loss.
    causes = rows(engine, schema, "SELECT job_id, cause FROM {s}.alkstore_job_attempt")
    assert {c.job_id for c in causes if c.cause == "heartbeat"} >= set(running)


def test_a_worker_frozen_past_its_liveness_cannot_settle_the_job_another_completed_at_26(
    database_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    deadline = Deadline(120)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        QueueService(s, schema=schema).create_queue("chaos")
    with DefaultChildren(database_url, schema, tmp_path, CHAOS_TRANSACTIONAL="1") as kids:
        frozen = kids.start("frozen")
        deadline.wait_for("the worker to start", lambda: live(engine, schema, "frozen"), 30)
        [job_id] = send(engine, schema, [{"sleep": 3, "only_in": "frozen"}])
        deadline.wait_for("the first attempt", lambda: in_flight(engine, schema, "frozen"), 20)
        freeze_between_transactions(engine, schema, frozen)
        other = kids.start("other")
        deadline.wait_for(
            "the other worker to complete the job",
            lambda: states(engine, schema, "chaos") == {"completed": 1},
            RESCUE_WITHIN + 15,
            interval=0.25,
            show=lambda: states(engine, schema, "chaos"),
        )
        frozen.signal(signal.SIGCONT)
        deadline.wait_for(
            "the thawed worker to find its attempt lost",
            lambda: "no longer owns it" in frozen.output(),
            30,
            show=lambda: frozen.output()[-2000:],
        )
        kids.stop_gracefully(other)
        kids.stop_gracefully(frozen)
    [job] = rows(engine, schema, "SELECT retry_count, output FROM {s}.job WHERE id = :i", i=job_id)
    labels = [
        r.label for r in rows(engine, schema, "SELECT label FROM {s}.chaos_attempt ORDER BY at")
    ]
    effects: list[Any] = rows(engine, schema, "SELECT label FROM {s}.chaos_effect")
    assert labels == ["frozen", "other"]
    assert (job.retry_count, job.output) == (1, {"label": "other"})
    assert [e.label for e in effects] == ["other"]  # the frozen attempt's writes rolled back
