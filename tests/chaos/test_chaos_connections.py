"""``pg_terminate_backend`` under live workers and senders, the LISTEN connection included.

Holds docs/concepts/guarantees.md on connection loss: nothing is lost, and work resumes
within a poll interval plus the reconnection backoff.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest
from chaos_app import create_tables
from chaos_support import Children, Deadline, Sender, listeners, rows, states, terminate
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos

ROUNDS = 3
POLL = 0.5
BOUND = POLL + 2.5
"""Seconds from a kill to the completion of a job sent after it: one poll interval, the
first reconnection backoffs (0.1 s, 0.2 s, jittered) and a margin for a busy 2-core machine."""


def _first_completion_after(engine: Engine, schema: str, at: float) -> float | None:
    """Seconds from ``at`` (database epoch) to the first completion of a job sent after it."""
    found = rows(
        engine,
        schema,
        "SELECT min(extract(epoch FROM completed_on)) FROM {s}.job"
        " WHERE state = 'completed' AND extract(epoch FROM created_on) > :at",
        at=at,
    )
    first = found[0][0]
    return None if first is None else float(first) - at


def _gone(engine: Engine, schema: str, pids: set[int]) -> bool:
    return not pids & set(listeners(engine, schema))


def test_terminated_connections_lose_no_job_and_work_resumes_within_a_bound(
    database_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    deadline = Deadline(90)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        QueueService(s, schema=schema).create_queue(
            "chaos", retry_limit=100, retry_delay=0, expire_seconds=3
        )
    sender = Sender(database_url, schema)
    recoveries: list[float] = []
    relisten: list[float] = []
    terminated: list[int] = []
    try:
        with Children(
            database_url, schema, tmp_path, CHAOS_SLEEP="0.02", CHAOS_POLL=str(POLL)
        ) as kids:
            workers = [kids.start("w0"), kids.start("w1")]
            deadline.wait_for("two listeners", lambda: len(listeners(engine, schema)) == 2, 20)
            sender.thread.start()
            for _ in range(ROUNDS):
                deadline.wait_for(
                    "work in progress",
                    lambda: states(engine, schema, "chaos").get("completed", 0) > 20,
                    20,
                    show=lambda: (states(engine, schema, "chaos"), len(sender.sent)),
                )
                time.sleep(0.5)
                at = float(rows(engine, schema, "SELECT extract(epoch FROM now())")[0][0])
                before = set(listeners(engine, schema))
                terminated.append(terminate(engine, schema, f"chaos-{schema}-", listener=True))
                began = time.monotonic()
                assert len(before) == 2
                # pg_terminate_backend signals the backends; they exit a moment later.
                deadline.wait_for(
                    "the listeners to be gone",
                    partial(_gone, engine, schema, before),
                    5,
                    interval=0.01,
                )
                recoveries.append(
                    deadline.wait_for(
                        "a job sent after the kill to complete",
                        partial(_first_completion_after, engine, schema, at),
                        30,
                        interval=0.02,
                    )
                )
                deadline.wait_for(
                    "both listeners back", lambda: len(listeners(engine, schema)) == 2, 20
                )
                relisten.append(time.monotonic() - began)
            sender.stop.set()
            sender.thread.join(10)
            deadline.wait_for(
                "every job to complete",
                lambda: set(states(engine, schema, "chaos")) == {"completed"},
                40,
                interval=0.2,
            )
            outputs = [kids.stop_gracefully(w) for w in workers]
    finally:
        sender.close()

    done = {r.id for r in rows(engine, schema, "SELECT id FROM {s}.job WHERE state = 'completed'")}
    lost = [i for i in sender.sent if i not in done]
    print(
        f"\nconnections: {ROUNDS} rounds, {sum(terminated)} backends terminated "
        f"({terminated}), {len(sender.sent)} jobs sent ({sender.errors} sends failed and "
        f"were repeated), {len(lost)} lost; recovery to the next completed job "
        f"{', '.join(f'{r:.2f}' for r in recoveries)} s (bound {BOUND} s); "
        f"listeners back after {', '.join(f'{r:.2f}' for r in relisten)} s"
    )
    assert lost == []
    assert all(t >= 4 for t in terminated)  # at least two pools and two listeners each round
    assert max(recoveries) < BOUND
    assert all("listener connection lost" in out for out in outputs)
