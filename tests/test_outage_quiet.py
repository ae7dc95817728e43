"""Quiet during outages: while the database (or the pooler in front of it) is down,
supervision backs off between passes and logs one traceback per outage, then a line
per retry at most; an unusable schedule is reported once per change, not per pass."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from support.pgbouncer import pgbouncer

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
