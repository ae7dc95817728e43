"""Behind PgBouncer in transaction pooling: every statement works when each transaction
may land on a different server connection (docs/how-to/pgbouncer.md)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support.schemas import random_schema, schema_exists, throwaway
from support.worker import wait_for

from alkstore_sa import (
    AsyncQueueService,
    AsyncWorker,
    InvalidOptionsError,
    PooledConnectionError,
    QueueService,
    Worker,
    migrate,
)
from alkstore_sa._pooler import is_pooled
from alkstore_sa.cli import main
from alkstore_sa.clock import FakeClock
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.schema_record import lock_key_sql
from alkstore_sa.supervision import Supervisor
from alkstore_sa.testing.pgbouncer import PgBouncerUnavailableError, run_pgbouncer
from alkstore_sa.worker import _base


def test_senders_and_a_worker_through_transaction_pooling(
    transaction_pooled_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(transaction_pooled_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema).create_queue("q")
        handled: list[int] = []
        lock = threading.Lock()
        worker = Worker(engine, schema=schema, shutdown_timeout=5)

        @worker.handler("q", concurrency=4)
        def handle(job: object) -> None:
            with lock:
                handled.append(job.data["n"])  # type: ignore[attr-defined]

        errors: list[BaseException] = []

        def sender(base: int) -> None:
            try:
                for n in range(base, base + 200):
                    with Session(engine) as session, session.begin():
                        QueueService(session, schema=schema).send("q", {"n": n})
            except BaseException as exc:
                errors.append(exc)

        caplog.set_level(logging.WARNING, logger="alkstore_sa")
        worker.start()
        try:
            threads = [threading.Thread(target=sender, args=(i * 200,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            wait_for(lambda: len(handled) >= 800, timeout=30)
        finally:
            worker.stop()
        assert sorted(handled) == list(range(800))
        with engine.connect() as conn:
            states = conn.execute(
                text(f'select state, count(*) from "{schema}".job group by state')
            ).all()
        assert dict(states) == {"completed": 800}
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_an_async_worker_through_pgbouncer(
    mode: str,
    request: pytest.FixtureRequest,
    schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = request.getfixturevalue(f"{mode}_pooled_url")
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    async_engine = create_async_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    handled: list[int] = []

    async def main() -> None:
        worker = AsyncWorker(async_engine, schema=schema, shutdown_timeout=5)

        @worker.handler("q", concurrency=4)
        async def handle(job: object) -> None:
            handled.append(job.data["n"])  # type: ignore[attr-defined]

        await worker.start()
        try:
            for n in range(300):
                async with AsyncSession(async_engine) as session, session.begin():
                    await AsyncQueueService(session, schema=schema).send("q", {"n": n})
            deadline = asyncio.get_running_loop().time() + 30
            while len(handled) < 300 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()

    try:
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema).create_queue("q")
        caplog.set_level(logging.WARNING, logger="alkstore_sa")
        asyncio.run(main())
        assert sorted(handled) == list(range(300))
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        asyncio.run(async_engine.dispose())
        engine.dispose()


# ------------------------------------------------ the engine a user has, and wake-ups


def _sqlalchemy(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://")


@pytest.fixture
def pooled(transaction_pooled_url: str) -> Iterator[Engine]:
    """A plain engine through PgBouncer in transaction mode, as a user makes one."""
    engine = create_engine(_sqlalchemy(transaction_pooled_url))
    yield engine
    engine.dispose()


def _send(engine: Engine, schema: str, queue: str, count: int) -> None:
    for n in range(count):
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema).send(queue, {"n": n})


def test_the_first_checkout_of_a_pooled_engine_turns_prepared_statements_off_once(
    pooled: Engine, schema46: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "alkstore_sa")
    for _ in range(3):
        with Session(pooled) as session, session.begin():
            QueueService(session, schema=schema46).get_queues()
    with pooled.connect() as conn:
        assert conn.connection.dbapi_connection.prepare_threshold is None  # type: ignore[union-attr]
    told = [r for r in caplog.records if getattr(r, "action", None) == "pooler_detected"]
    assert len(told) == 1 and "Behind PgBouncer" in told[0].getMessage()


def test_a_pooled_connection_is_told_from_a_direct_one(pooled: Engine, engine: Engine) -> None:
    with pooled.connect() as conn:
        assert is_pooled(conn.connection.dbapi_connection) is True
    with engine.connect() as conn:
        assert is_pooled(conn.connection.dbapi_connection) is False


def test_a_prepare_threshold_the_application_chose_is_kept(
    transaction_pooled_url: str, schema46: str
) -> None:
    chosen = create_engine(
        _sqlalchemy(transaction_pooled_url), connect_args={"prepare_threshold": 2}
    )
    try:
        with Session(chosen) as session, session.begin():
            QueueService(session, schema=schema46).get_queues()
        with chosen.connect() as conn:
            assert conn.connection.dbapi_connection.prepare_threshold == 2  # type: ignore[union-attr]
    finally:
        chosen.dispose()


def test_a_worker_listening_through_transaction_pooling_warns_once_that_wakeups_miss(
    pooled: Engine, schema46: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_base, "WAKEUP_PROBE_SECONDS", 1.0)
    caplog.set_level(logging.WARNING, "alkstore_sa")
    with Session(pooled) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    worker = Worker(pooled, schema=schema46, supervise=False, poll_interval=0.5)
    worker.register("q", lambda job: None)
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not _warned(caplog) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        worker.stop()
    [warning] = [r for r in caplog.records if getattr(r, "action", None) == "wakeups_missing"]
    assert "listen_dsn" in warning.getMessage() and "--listen-url" in warning.getMessage()


def _warned(caplog: pytest.LogCaptureFixture) -> bool:
    return any(getattr(r, "action", None) == "wakeups_missing" for r in caplog.records)


@pytest.mark.parametrize("listen", ["direct", "session pooling"])
def test_a_worker_listening_elsewhere_wakes_at_once(
    listen: str,
    pooled: Engine,
    session_pooled_url: str,
    database_url: str,
    schema46: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_base, "WAKEUP_PROBE_SECONDS", 1.0)
    caplog.set_level(logging.WARNING, "alkstore_sa")
    url = database_url if listen == "direct" else session_pooled_url
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    with Session(pooled) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    ran = threading.Event()
    worker = Worker(pooled, schema=schema46, supervise=False, poll_interval=60, listen_dsn=dsn)
    worker.register("q", lambda job: ran.set())
    worker.start()
    try:
        time.sleep(1.5)  # past the first (empty) fetch and the wake-up probe
        _send(pooled, schema46, "q", 1)
        # Polls are a minute apart: only the notification can have woken it.
        assert ran.wait(5)
    finally:
        worker.stop()
    assert not _warned(caplog)


@pytest.mark.slow  # supervision, cron and the dashboard behind PgBouncer: a few seconds
@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_supervision_cron_and_the_dashboard_work_through_pgbouncer(
    mode: str, request: pytest.FixtureRequest, schema46: str
) -> None:
    from starlette.testclient import TestClient

    from alkstore_sa.dashboard import create_app

    through = create_engine(_sqlalchemy(request.getfixturevalue(f"{mode}_pooled_url")))
    try:
        with Session(through) as session, session.begin():
            jobs = QueueService(session, schema=schema46)
            jobs.create_queue("q")
            jobs.schedule("q", "* * * * *", {"n": 1})
            sent = jobs.send("q", {"n": 2})
        # Three minutes of cron in nine passes, on a clock of the test's own that starts
        # at the database's time.
        with through.connect() as conn:
            start = conn.execute(text("SELECT now()")).scalar_one()
        clock = FakeClock(start)
        supervisor = Supervisor(through, schema=schema46, clock=clock)
        minutes: set[dt.datetime] = set()
        for _ in range(9):
            minutes.add(clock.now().replace(second=0, microsecond=0))
            report = supervisor.run_once(force=True)
            assert not report.errors, report.errors
            clock.advance(20)
        with through.connect() as conn:
            slots = conn.execute(
                text(f'SELECT singleton_on FROM "{schema46}".job WHERE name = :q'),
                {"q": SEND_IT_QUEUE},
            ).scalars()
            fired = {slot.replace(tzinfo=dt.UTC) for slot in slots}
        # The schedule fired once in each minute the passes saw (filed for the minute of
        # the fake clock); the first minute's job, due at the database's time, was sent.
        assert fired == minutes
        with Session(through) as session, session.begin():
            found = QueueService(session, schema=schema46).find_jobs("q")
        assert sorted(j.data["n"] for j in found.jobs) == [1, 2]
        app = create_app(through, schemas=[schema46])
        with TestClient(app, base_url="http://127.0.0.1:8765") as client:
            assert client.get("/").status_code == 200
            queue_page = client.get(f"/s/{schema46}/queues/q")
            assert queue_page.status_code == 200 and "* * * * *" in queue_page.text
            job_page = client.get(f"/s/{schema46}/jobs/{sent}", params={"queue": "q"})
            assert job_page.status_code == 200 and str(sent) in job_page.text
    finally:
        through.dispose()


# ------------------------------------------------------------- schema upgrades refuse


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_an_upgrade_through_a_pooler_is_refused_before_anything_is_written(
    mode: str, request: pytest.FixtureRequest, engine: Engine
) -> None:
    url = request.getfixturevalue(f"{mode}_pooled_url")
    through = create_engine(_sqlalchemy(url))
    name = random_schema()
    try:
        with throwaway(engine, name), pytest.raises(PooledConnectionError) as refused:
            migrate.upgrade(through, name)
        assert refused.value.schema == name
        assert "directly" in str(refused.value) and "Behind PgBouncer" in str(refused.value)
        assert not schema_exists(engine, name)
        # No server session was left holding pg-boss's migration lock on the schema.
        with engine.connect() as conn:
            free = conn.execute(text(f"SELECT pg_try_advisory_xact_lock({lock_key_sql(name)})"))
            assert free.scalar_one() is True
    finally:
        through.dispose()


def test_alkstore_db_upgrade_through_a_pooler_says_so_in_one_line(
    transaction_pooled_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        code = main(["db", "upgrade", "--database-url", transaction_pooled_url, "--schema", name])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 1
        assert len(err) == 1 and err[0].startswith("alkstore: error: schema ")
        assert "connection pooler" in err[0]
        assert not schema_exists(engine, name)


# ------------------------------------------------------- the testing helper's own errors


def test_run_pgbouncer_refuses_an_unknown_pool_mode_before_starting_anything(
    database_url: str,
) -> None:
    with (
        pytest.raises(InvalidOptionsError, match=r"pool_mode.*'statement'"),
        run_pgbouncer(database_url, "statement"),
    ):
        pass  # pragma: no cover


def test_run_pgbouncer_without_the_program_says_it_is_not_installed(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(shutil, "which", lambda *args, **kwargs: None)
    with (
        pytest.raises(PgBouncerUnavailableError, match="not installed"),
        run_pgbouncer(database_url),
    ):
        pass  # pragma: no cover


def test_the_cli_sends_lists_and_shows_through_transaction_pooling(
    transaction_pooled_url: str, schema46: str, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--database-url", transaction_pooled_url, "--schema", schema46]
    # More calls than psycopg's prepare threshold (5): each a new process in real life,
    # and each on whichever server connection PgBouncer lends.
    assert main(["queue", "ensure", "q", *where]) == 0
    for n in range(7):
        assert main(["send", "q", "--data", f'{{"n": {n}}}', "--json", *where]) == 0
    capsys.readouterr()
    assert main(["jobs", "list", "q", "--json", *where]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted(job["data"]["n"] for job in listed) == list(range(7))
    assert main(["queue", "show", "q", *where]) == 0
    shown = capsys.readouterr()
    assert "created" in shown.out and shown.err == ""
