"""Quiet during outages: while the database (or the pooler in front of it) is down,
supervision backs off between passes and logs one traceback per outage, then a line
per retry at most; an unusable schedule is reported once per change, not per pass."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session
from support.pgbouncer import pgbouncer

from alkstore_sa import QueueService
from alkstore_sa.supervision import AsyncSupervisor, Supervisor

OUTAGE_SECONDS = 2.5


def _supervision_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("alkstore_sa")]


def _said_during_outage(records: list[logging.LogRecord]) -> tuple[int, int]:
    """(records, records with a traceback)."""
    return len(records), sum(1 for r in records if r.exc_info)


def test_supervisor_backs_off_and_logs_one_traceback_while_the_pooler_is_down(
    engine: Engine, schema: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="alkstore_sa")
    with pgbouncer(database_url, "session") as url:
        pooled = create_engine(url, pool_pre_ping=True)
        supervisor = Supervisor(pooled, schema=schema, supervise_interval=0.2)
        supervisor.start()
        time.sleep(0.3)
    # The pooler is gone: every connection is refused from here on.
    pooled.dispose()
    caplog.clear()
    try:
        time.sleep(OUTAGE_SECONDS)
    finally:
        assert supervisor.stop(5)
        pooled.dispose()
    failed = [r for r in _supervision_records(caplog) if r.levelno >= logging.WARNING]
    said, tracebacks = _said_during_outage(failed)
    assert 1 <= said <= 8, [r.getMessage() for r in failed][:10]
    assert tracebacks == 1
    # The pass the outage began in may say which of its steps failed; after the
    # traceback, one line per retry and nothing else.
    first = next(i for i, r in enumerate(failed) if r.exc_info)
    retries = failed[first + 1 :]
    assert retries, "no retry within the outage"
    assert all("failed again" in r.getMessage() for r in retries), retries


def test_async_supervisor_backs_off_and_logs_one_traceback_while_the_pooler_is_down(
    engine: Engine, schema: str, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="alkstore_sa")

    async def scenario() -> None:
        with pgbouncer(database_url, "session") as url:
            pooled = create_async_engine(url.replace("+psycopg:", "+psycopg_async:"))
            supervisor = AsyncSupervisor(pooled, schema=schema, supervise_interval=0.2)
            await supervisor.start()
            await asyncio.sleep(0.3)
        await pooled.dispose()
        caplog.clear()
        try:
            await asyncio.sleep(OUTAGE_SECONDS)
        finally:
            assert await supervisor.stop(5)
            await pooled.dispose()

    asyncio.run(scenario())
    failed = [r for r in _supervision_records(caplog) if r.levelno >= logging.WARNING]
    said, tracebacks = _said_during_outage(failed)
    assert 1 <= said <= 8, [r.getMessage() for r in failed][:10]
    assert tracebacks == 1


# ------------------------------------------------------------------ unusable schedules


def _sql(engine: Engine, statement: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(statement))


def _reported(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if getattr(r, "action", None) == "invalid_schedule" and r.levelno >= logging.WARNING
    ]


def _cron_passes(supervisor: Supervisor, n: int) -> None:
    for _ in range(n):
        report = supervisor.run_once(force=True)
        assert report.cron_checked and all("q__bad" in e for e in report.errors), report


@pytest.mark.parametrize("version", [26, 46])
def test_an_unusable_schedule_is_reported_once_per_change_not_per_pass(
    engine: Engine,
    schema_pool: Any,
    spoken46: None,
    version: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    schema = schema_pool.take(version)
    try:
        caplog.set_level(logging.WARNING, logger="alkstore_sa")
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema).create_queue("q")
        _sql(
            engine,
            f'INSERT INTO "{schema}".schedule (name, key, cron, timezone, options) '
            "VALUES ('q', 'bad', 'not a cron', 'UTC', '{}')",
        )
        supervisor = Supervisor(engine, schema=schema, supervise=False)
        _cron_passes(supervisor, 4)
        said = _reported(caplog)
        assert len(said) == 1 and "q__bad" in said[0], said
        # Each pass's report still lists it.
        assert any("q__bad" in e for e in supervisor.run_once(force=True).errors)
        # Changed, and still unusable: said again, once.
        caplog.clear()
        _sql(engine, f"UPDATE \"{schema}\".schedule SET cron = 'still not a cron'")
        _cron_passes(supervisor, 3)
        assert len(_reported(caplog)) == 1
        # Fixed, then broken again as it first was: said again.
        caplog.clear()
        _sql(engine, f"UPDATE \"{schema}\".schedule SET cron = '0 0 1 1 *'")
        _cron_passes(supervisor, 2)
        assert _reported(caplog) == []
        _sql(engine, f"UPDATE \"{schema}\".schedule SET cron = 'not a cron'")
        _cron_passes(supervisor, 3)
        assert len(_reported(caplog)) == 1
        # Deleted and written again: said again.
        caplog.clear()
        _sql(engine, f'DELETE FROM "{schema}".schedule')
        _cron_passes(supervisor, 1)
        _sql(
            engine,
            f'INSERT INTO "{schema}".schedule (name, key, cron, timezone, options) '
            "VALUES ('q', 'bad', 'not a cron', 'UTC', '{}')",
        )
        _cron_passes(supervisor, 2)
        assert len(_reported(caplog)) == 1
    finally:
        schema_pool.give_back(schema)


# ------------------------------------------------------------------ the orphan sweep


def test_one_pass_sweeps_every_orphaned_attempt_however_many_there_are(
    engine: Engine, schema46: str
) -> None:
    # Failed attempts of jobs retention deleted since the last pass: more than one
    # batch of the sweep. They go in one pass, so that a steady stream of them is
    # never left behind.
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    orphans = 12_345
    _sql(
        engine,
        f'INSERT INTO "{schema46}".alkstore_job_attempt (name, job_id, attempt, cause, failed_on)'
        f" SELECT 'q', gen_random_uuid(), 1, 'failed', now() FROM generate_series(1, {orphans})",
    )
    report = Supervisor(engine, schema=schema46, schedule=False).run_once(force=True)
    assert report.errors == ()
    with engine.connect() as conn:
        left = conn.execute(
            text(f'SELECT count(*) FROM "{schema46}".alkstore_job_attempt')
        ).scalar_one()
    assert left == 0
