"""``kill -9`` (and SIGSTOP) of a worker at default settings, schema 46: its jobs are
back within a minute, not after the queue's lease (``expire_seconds``, 900 s).

The victim holds jobs that run (they would sleep for ten minutes there) and jobs it
claimed ahead into its buffer; a second worker is live. Holds docs/concepts/guarantees.md
("A worker is killed"): every job completes within 60 s of the kill, each job that was
running in the victim runs once more and only once, a buffered one runs once (never in
the victim), and a transactional handler's effect is applied exactly once. A frozen
worker that resumes after another finished its job settles nothing (fencing).
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from chaos_app import create_tables
from chaos_support import (
    HERE,
    ROOT,
    Child,
    Children,
    Deadline,
    freeze_between_transactions,
    in_flight,
    rows,
    states,
)
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos

RESCUE_WITHIN = 60.0
"""Seconds from a worker's death to the completion of the last of its jobs."""


class DefaultChildren(Children):
    """Chaos workers at default settings (``chaos_rescue_app``)."""

    def start(self, label: str, **env: str) -> Child:
        log = self.workdir / f"{label}.log"
        environ = {
            **os.environ,
            "CHAOS_DATABASE_URL": self.database_url,
            "CHAOS_SCHEMA": self.schema,
            "CHAOS_LABEL": label,
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **self.env,
            **env,
        }
        cmd = [sys.executable, "-m", "alkstore_sa.cli", "worker", "--app"]
        cmd += ["chaos_rescue_app:build", "--log-level", "INFO"]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=HERE, env=environ, stdout=out, stderr=out)
        child = Child(label, proc, log)
        self.started.append(child)
        return child


def send(engine: Engine, schema: str, jobs: list[dict[str, Any]]) -> list[Any]:
    with Session(engine) as s, s.begin():
        ids = QueueService(s, schema=schema).send_many("chaos", [{"data": d} for d in jobs])
    assert all(ids)
    return list(ids)


def db_now(engine: Engine, schema: str) -> dt.datetime:
    [(now,)] = rows(engine, schema, "SELECT now()")
    assert isinstance(now, dt.datetime)
    return now


def live(engine: Engine, schema: str, label: str) -> bool:
    """The worker ``label`` registered its instance row (it is up and claiming)."""
    found = rows(
        engine,
        schema,
        "SELECT 1 FROM {s}.instance WHERE name = :n AND stopped_on IS NULL",
        n=label,
    )
    return bool(found)


def warm(deadline: Deadline, engine: Engine, schema: str) -> None:
    """Three fast jobs, so the victim knows its handlers are fast and claims ahead."""
    for _ in range(3):
        [job_id] = send(engine, schema, [{"sleep": 0}])

        def done(job_id: Any = job_id) -> list[Any]:
            statement = "SELECT 1 FROM {s}.job WHERE id = :i AND state = 'completed'"
            return rows(engine, schema, statement, i=job_id)

        deadline.wait_for("a warm-up job", done, 20)


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_kill_9_at_defaults_brings_running_and_buffered_jobs_back_within_a_minute(
    database_url: str, engine: Engine, schema46: str, tmp_path: Path, transactional: bool
) -> None:
    schema = schema46
    deadline = Deadline(150)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        QueueService(s, schema=schema).create_queue("chaos")  # defaults: 900 s lease
    settings = {"CHAOS_TRANSACTIONAL": "1" if transactional else "0"}
    with DefaultChildren(database_url, schema, tmp_path, **settings) as kids:
        victim = kids.start("victim")
        deadline.wait_for("the victim to start", lambda: live(engine, schema, "victim"), 30)
        warm(deadline, engine, schema)
        # Four jobs that would run ten minutes in the victim (and at once elsewhere),
        # then eight that its handlers cannot start before the four end: buffered.
        running = send(engine, schema, [{"sleep": 600, "only_in": "victim"}] * 4)
        buffered = send(engine, schema, [{"sleep": 0}] * 8)
        ours = set(running) | set(buffered)

        def held() -> bool:
            active = rows(engine, schema, "SELECT count(*) FROM {s}.job WHERE state = 'active'")[0][
                0
            ]
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
    effects = Counter(r.job_id for r in rows(engine, schema, "SELECT job_id FROM {s}.chaos_effect"))
    per_job = Counter(a.job_id for a in attempts if a.job_id in ours)
    last = max(j.completed_on for j in jobs.values())
    rescue = (last - killed_at).total_seconds()
    print(f"\nkill -9 at defaults: the last of 12 jobs completed {rescue:.1f} s after the kill")
    assert rescue <= RESCUE_WITHIN
    assert all(j.output == {"label": "rescuer"} for j in jobs.values())
    # Each running job ran once more (in the rescuer), and only once.
    assert {i: per_job[i] for i in running} == {i: 2 for i in running}
    # A buffered job never started in the victim: it ran once, in the rescuer.
    assert {i: per_job[i] for i in buffered} == {i: 1 for i in buffered}
    assert all(a.label == "rescuer" for a in attempts if a.job_id in buffered)
    # The victim never got past the sleep: one effect per job (exactly once).
    assert {i: effects[i] for i in ours} == {i: 1 for i in ours}
    # Node's heartbeat-timeout wording, from our worker's sweep (the victim never answered).
    assert all(j.retry_count == 1 for i, j in jobs.items() if i in running)


def test_a_worker_frozen_past_its_heartbeat_cannot_settle_the_job_another_completed(
    database_url: str, engine: Engine, schema46: str, tmp_path: Path
) -> None:
    schema = schema46
    deadline = Deadline(120)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        QueueService(s, schema=schema).create_queue("chaos")
    with DefaultChildren(database_url, schema, tmp_path, CHAOS_TRANSACTIONAL="1") as kids:
        frozen = kids.start("frozen")
        deadline.wait_for("the worker to start", lambda: live(engine, schema, "frozen"), 30)
        # Long enough in the frozen worker that it is still in its handler when thawed.
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
    effects = rows(engine, schema, "SELECT label FROM {s}.chaos_effect")
    assert labels == ["frozen", "other"]
    assert (job.retry_count, job.output) == (1, {"label": "other"})
    assert [e.label for e in effects] == ["other"]  # the frozen attempt's writes rolled back
