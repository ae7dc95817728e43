"""``kill -9`` of worker processes mid-batch, round after round.

Holds the guarantees of docs/concepts/guarantees.md for a worker killed outright: no job
is lost (its jobs come back when their lease expires), only the attempts in flight in a
killed process run again, and a transactional handler's effect is applied once.
"""

from __future__ import annotations

import signal
import time
from collections import Counter, defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from chaos_app import create_tables
from chaos_support import Children, Deadline, in_flight, rows, states, stopped
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos

JOBS = 400
ROUNDS = 4


def _send(engine: Engine, schema: str, n: int) -> None:
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        # Short leases bring a killed worker's jobs back quickly; many retries let a job
        # survive being in flight in several killed processes.
        svc.create_queue("chaos", retry_limit=100, retry_delay=0, expire_seconds=2)
        ids = svc.send_many("chaos", [{"data": {"n": i}} for i in range(n)])
    assert all(ids)


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_kill_9_mid_batch_loses_no_job_and_repeats_only_attempts_in_flight(
    database_url: str, engine: Engine, schema: str, tmp_path: Path, transactional: bool
) -> None:
    deadline = Deadline(90)
    create_tables(engine, schema)
    _send(engine, schema, JOBS)
    held: dict[str, set[Any]] = {}  # label of a killed process -> jobs in flight there
    settings = {"CHAOS_SLEEP": "0.05", "CHAOS_TRANSACTIONAL": "1" if transactional else "0"}
    with Children(database_url, schema, tmp_path, **settings) as kids:
        live = [kids.start("w0"), kids.start("w1")]
        for round_ in range(ROUNDS):
            victim = live[0]
            label = victim.label
            deadline.wait_for(f"{label} to run jobs", partial(in_flight, engine, schema, label), 30)
            with stopped(victim):
                time.sleep(0.1)  # statements the process had sent finish on the server
                held[label] = in_flight(engine, schema, label)
                victim.signal(signal.SIGKILL)
            victim.proc.wait(5)
            assert victim.proc.returncode == -signal.SIGKILL
            live = [*live[1:], kids.start(f"w{round_ + 2}")]
        deadline.wait_for(
            "every job to complete",
            lambda: states(engine, schema, "chaos") == {"completed": JOBS},
            60,
            interval=0.2,
        )
        for child in live:
            kids.stop_gracefully(child)

    jobs = {
        r.id: r for r in rows(engine, schema, "SELECT id, state, started_on, output FROM {s}.job")
    }
    attempts = rows(engine, schema, "SELECT job_id, label, started_on FROM {s}.chaos_attempt")
    effects = rows(engine, schema, "SELECT job_id, label FROM {s}.chaos_effect")
    lost = [i for i, j in jobs.items() if j.state != "completed"]
    per_job = Counter(a.job_id for a in attempts)
    repeated = {job_id: n for job_id, n in per_job.items() if n > 1}
    # Every attempt that did not complete its job ran in a killed process, on a job that
    # was in flight there when it was killed.
    stale = [a for a in attempts if a.started_on != jobs[a.job_id].started_on]
    unexplained = [a for a in stale if a.job_id not in held.get(a.label, set())]
    finishing = {a.job_id: a.label for a in attempts if a.started_on == jobs[a.job_id].started_on}
    wrong_output = [i for i, j in jobs.items() if j.output.get("label") != finishing.get(i)]
    effects_per_job: dict[Any, list[str]] = defaultdict(list)
    for e in effects:
        effects_per_job[e.job_id].append(e.label)
    extra_effects = {i: labels for i, labels in effects_per_job.items() if len(labels) > 1}
    in_flight_total = sum(len(v) for v in held.values())
    print(
        f"\nkill -9 ({'transactional' if transactional else 'plain'}): "
        f"{ROUNDS} kills survived, {JOBS} jobs, {len(lost)} lost, "
        f"{in_flight_total} in flight at the kills, {len(repeated)} jobs attempted again "
        f"({len(stale)} stale attempts, {len(unexplained)} not in flight at a kill), "
        f"{len(extra_effects)} duplicate effects"
    )
    assert lost == []
    assert len(jobs) == JOBS and set(per_job) == set(jobs)
    assert unexplained == []
    assert len(stale) == sum(n - 1 for n in per_job.values())
    assert wrong_output == []
    assert set(effects_per_job) == set(jobs)
    if transactional:
        assert extra_effects == {}, "a transactional handler's effect was applied twice"
    else:
        # A plain handler's effect repeats only for a job in flight in a killed process.
        killed_jobs = set().union(*held.values())
        assert set(extra_effects) <= killed_jobs
    assert in_flight_total > 0, "no kill hit a job in flight: the test proved nothing"
