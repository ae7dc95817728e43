"""A worker frozen (SIGSTOP) past its job's lease, then thawed after another finished it.

Holds docs/concepts/guarantees.md on fencing: the job expires, another worker runs and
completes it, and the late settlement of the frozen worker changes nothing; its
handler's effect does not commit (transactional) or is a duplicate of a stale attempt
(plain).
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
from chaos_app import create_tables
from chaos_support import Children, Deadline, freeze_between_transactions, in_flight, rows, states
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos

JOB_ROW = "SELECT id, state, retry_count, started_on, completed_on, output FROM {s}.job"


@pytest.mark.parametrize("transactional", [False, True], ids=["plain", "transactional"])
def test_frozen_worker_past_its_lease_cannot_settle_the_job_another_worker_completed(
    database_url: str, engine: Engine, schema: str, tmp_path: Path, transactional: bool
) -> None:
    deadline = Deadline(60)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        svc = QueueService(s, schema=schema)
        svc.create_queue("chaos", retry_limit=3, retry_delay=0, expire_seconds=2)
        job_id = svc.send("chaos", {"n": 1})
    settings = {
        "CHAOS_FIRST_SLEEP": "2.0",  # the frozen attempt is still in its handler when thawed
        "CHAOS_TRANSACTIONAL": "1" if transactional else "0",
    }

    def attempts() -> list[Any]:
        return rows(
            engine,
            schema,
            "SELECT label, retry_count, started_on FROM {s}.chaos_attempt ORDER BY at",
        )

    with Children(database_url, schema, tmp_path, **settings) as kids:
        frozen = kids.start("frozen")
        deadline.wait_for("the first attempt", attempts, 20)
        tries = freeze_between_transactions(engine, schema, frozen)
        assert in_flight(engine, schema, "frozen") == {job_id}  # frozen in its handler
        other = kids.start("other")
        deadline.wait_for(
            "the other worker to complete the job",
            lambda: states(engine, schema, "chaos") == {"completed": 1},
            20,
            show=lambda: states(engine, schema, "chaos"),
        )
        [before] = rows(engine, schema, JOB_ROW)
        frozen.signal(signal.SIGCONT)
        deadline.wait_for(
            "the frozen worker to find its attempt lost",
            lambda: "no longer owns it" in frozen.output(),
            20,
            show=frozen.output,
        )
        frozen_log = kids.stop_gracefully(frozen)
        kids.stop_gracefully(other)

    [after] = rows(engine, schema, JOB_ROW)
    tried = attempts()
    effects = rows(engine, schema, "SELECT label FROM {s}.chaos_effect ORDER BY at")
    print(
        f"\nfrozen worker ({'transactional' if transactional else 'plain'}): attempts "
        f"{[(a.label, a.retry_count) for a in tried]}, output {after.output}, "
        f"retry_count {after.retry_count}, effects {[e.label for e in effects]} "
        f"(frozen between transactions at try {tries})"
    )
    assert after == before, "the thawed worker's late settlement changed the job"
    assert after.id == job_id and after.state == "completed"
    assert after.output["label"] == "other"
    assert after.retry_count == 1  # one expiry, one retry
    assert [(a.label, a.retry_count) for a in tried] == [("frozen", 0), ("other", 1)]
    assert tried[0].started_on != after.started_on  # the frozen attempt is the stale one
    assert "'lost': 1" in frozen_log  # its stats when it stopped
    if transactional:
        assert [e.label for e in effects] == ["other"]
    else:
        # The plain handler's effect ran twice; the extra one is the stale attempt's.
        assert sorted(e.label for e in effects) == ["frozen", "other"]
