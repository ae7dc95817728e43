"""Worker processes behind PgBouncer in transaction pooling, racing and losing connections.

Holds docs/how-to/pgbouncer.md: with a plain engine pointing at PgBouncer (and a direct
URL to listen on), several processes claim every job exactly once, and server connections
terminated under them lose no job.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
from chaos_app import create_tables
from chaos_support import Children, Deadline, Sender, race, rows, states, terminate
from sqlalchemy import Engine, make_url
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

pytestmark = pytest.mark.chaos

JOBS = 2_000
PROCESSES = 4
ROUNDS = 3


def _psycopg(url: str) -> str:
    return make_url(url).set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def _problems(output: str) -> list[str]:
    return [line for line in output.splitlines() if " ERROR " in line or "Traceback" in line]


def test_four_processes_through_transaction_pooling_complete_each_job_exactly_once(
    database_url: str, transaction_pooled_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    pooled = _psycopg(transaction_pooled_url)
    seen = race(
        pooled,
        engine,
        schema,
        tmp_path,
        jobs=JOBS,
        processes=PROCESSES,
        sending_url=pooled,
        CHAOS_CONCURRENCY="8",
        ALKSTORE_LISTEN_URL=database_url,
    )
    seen.check_each_job_ran_once(JOBS, PROCESSES)
    for out in seen.outputs:
        # Each process found PgBouncer and said so, once, and nothing went wrong.
        assert out.count("connection pooler") == 1
        assert _problems(out) == []


def _completed_more_than(engine: Engine, schema: str, n: int) -> bool:
    return states(engine, schema, "chaos").get("completed", 0) > n


def _completed_after(engine: Engine, schema: str, at: float) -> bool:
    found = rows(
        engine,
        schema,
        "SELECT count(*) FROM {s}.job WHERE state = 'completed'"
        " AND extract(epoch FROM created_on) > :at",
        at=at,
    )
    return int(found[0][0]) > 0


def test_server_connections_terminated_behind_pgbouncer_lose_no_job(
    database_url: str, transaction_pooled_url: str, engine: Engine, schema: str, tmp_path: Path
) -> None:
    deadline = Deadline(90)
    create_tables(engine, schema)
    with Session(engine) as s, s.begin():
        QueueService(s, schema=schema).create_queue(
            "chaos", retry_limit=100, retry_delay=0, expire_seconds=3
        )
    pooled = _psycopg(transaction_pooled_url)
    sender = Sender(pooled, schema)
    terminated: list[int] = []
    try:
        with Children(
            pooled,
            schema,
            tmp_path,
            CHAOS_SLEEP="0.02",
            CHAOS_POLL="0.5",
            ALKSTORE_LISTEN_URL=database_url,
        ) as kids:
            workers = [kids.start("w0"), kids.start("w1")]
            sender.thread.start()
            for round_ in range(ROUNDS):
                deadline.wait_for(
                    "work in progress",
                    partial(_completed_more_than, engine, schema, 20 * (round_ + 1)),
                    30,
                    show=lambda: (states(engine, schema, "chaos"), len(sender.sent)),
                )
                at = float(rows(engine, schema, "SELECT extract(epoch FROM now())")[0][0])
                # The server connections PgBouncer lent the workers and the sender (they
                # carry their clients' application_name) and the direct listeners.
                terminated.append(terminate(engine, schema, f"chaos-{schema}-", listener=True))
                deadline.wait_for(
                    "a job sent after the kill to complete",
                    partial(_completed_after, engine, schema, at),
                    30,
                    interval=0.05,
                )
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
        f"\npgbouncer connections: {ROUNDS} rounds, {sum(terminated)} backends terminated "
        f"({terminated}), {len(sender.sent)} jobs sent ({sender.errors} sends failed and "
        f"were repeated), {len(lost)} lost"
    )
    assert len(sender.sent) > 60 and lost == []
    assert all(t >= 3 for t in terminated)  # server connections of both workers, listeners
    assert all("listener connection lost" in out for out in outputs)
