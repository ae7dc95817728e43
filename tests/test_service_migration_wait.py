"""A service met mid-migration: a version between 26 and 46 while pg-boss's migration
lock is held is waited out, not refused (docs/concepts/compatibility.md, "Live
upgrades"); the version read keeps no lock in the caller's transaction; a migration
that waits for the caller's own locks ends the wait at once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, SchemaVersionChangedError, SchemaVersionError
from alkstore_sa._engine_cache import engine_state

KEY = (
    "('x' || encode(sha224((current_database() || '.pgboss.' || :s)::bytea), 'hex'))"
    "::bit(64)::bigint"
)


@pytest.fixture
def fresh_engine(database_url: str) -> Iterator[Engine]:
    """An engine of its own, so no other test's cached version is in the way."""
    eng = create_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def migrator(engine: Engine) -> Iterator[Connection]:
    """An autocommit connection standing in for a migration (holding pg-boss's lock)."""
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        yield conn
        conn.execute(text("SELECT pg_advisory_unlock_all()"))


def set_version(conn: Connection, schema: str, version: int) -> None:
    conn.execute(text(f'UPDATE "{schema}".version SET version = :v'), {"v": version})


def take_migration_lock(conn: Connection, schema: str) -> None:
    conn.execute(text(f"SELECT pg_advisory_lock({KEY})"), {"s": schema})


def release_migration_lock(conn: Connection, schema: str) -> None:
    conn.execute(text(f"SELECT pg_advisory_unlock({KEY})"), {"s": schema})


def make_queue(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema).create_queue("mid")


def test_a_send_waits_for_a_migration_passing_through_and_succeeds(
    fresh_engine: Engine, schema46: str, migrator: Connection
) -> None:
    make_queue(fresh_engine, schema46)
    engine_state(fresh_engine).expire(schema46)
    take_migration_lock(migrator, schema46)
    set_version(migrator, schema46, 43)

    def finish() -> None:
        time.sleep(1.5)
        set_version(migrator, schema46, 46)
        release_migration_lock(migrator, schema46)

    finisher = threading.Thread(target=finish)
    finisher.start()
    try:
        with Session(fresh_engine) as session, session.begin():
            job_id = QueueService(session, schema=schema46).send("mid", {"n": 1})
    finally:
        finisher.join()
    assert job_id is not None
    with fresh_engine.connect() as conn:
        found = conn.execute(
            text(f'SELECT count(*) FROM "{schema46}".job WHERE id = :i'), {"i": job_id}
        ).scalar_one()
    assert found == 1


def test_an_intermediate_version_without_a_migration_is_refused_at_once(
    fresh_engine: Engine, schema46: str, migrator: Connection
) -> None:
    make_queue(fresh_engine, schema46)
    engine_state(fresh_engine).expire(schema46)
    set_version(migrator, schema46, 43)
    with Session(fresh_engine) as session, session.begin():
        with pytest.raises(SchemaVersionError, match="version 43"):
            QueueService(session, schema=schema46).send("mid", {"n": 1})
        # Refused before anything was written, and the transaction is still usable.
        assert session.execute(text("SELECT 1")).scalar_one() == 1
    set_version(migrator, schema46, 46)


def test_the_version_read_keeps_no_lock_in_the_callers_transaction(
    fresh_engine: Engine, schema46: str
) -> None:
    make_queue(fresh_engine, schema46)
    engine_state(fresh_engine).expire(schema46)
    with Session(fresh_engine) as session, session.begin():
        service = QueueService(session, schema=schema46)
        service.get_queue("mid")
        held = session.execute(
            text(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE l.pid = pg_backend_pid() AND n.nspname = :s AND c.relname = 'version'"
            ),
            {"s": schema46},
        ).scalar_one()
    assert held == 0


def test_a_migration_waiting_for_the_callers_locks_is_not_waited_for(
    fresh_engine: Engine, schema46: str, migrator: Connection, engine: Engine
) -> None:
    make_queue(fresh_engine, schema46)
    engine_state(fresh_engine).expire(schema46)
    take_migration_lock(migrator, schema46)
    blocked: list[BaseException] = []

    def alter() -> None:
        # The migration's next step needs the job table the caller has written to.
        try:
            migrator.execute(text("BEGIN"))
            migrator.execute(text(f'LOCK TABLE "{schema46}".job IN ACCESS EXCLUSIVE MODE'))
            migrator.execute(text("COMMIT"))
        except BaseException as exc:  # reported below
            blocked.append(exc)

    with Session(fresh_engine) as session, session.begin():
        service = QueueService(session, schema=schema46)
        assert service.send("mid", {"n": 1}) is not None  # now holds a lock on job
        with engine.connect() as other:
            set_version(other.execution_options(isolation_level="AUTOCOMMIT"), schema46, 43)
        locker = threading.Thread(target=alter)
        locker.start()
        deadline = time.monotonic() + 10
        with engine.connect() as probe:
            while time.monotonic() < deadline:
                waiting = probe.execute(
                    text(
                        "SELECT count(*) FROM pg_locks "
                        "WHERE NOT granted AND relation = CAST(:r AS regclass)"
                    ),
                    {"r": f'"{schema46}".job'},
                ).scalar_one()
                if waiting:
                    break
                time.sleep(0.05)
        assert waiting, "the stand-in migration never waited for the caller"
        engine_state(fresh_engine).expire(schema46)
        with pytest.raises(SchemaVersionChangedError, match="roll the transaction back"):
            service.send("mid", {"n": 2})
        session.rollback()
    locker.join(10)
    assert not locker.is_alive() and not blocked
    set_version(migrator, schema46, 46)


def test_a_service_on_an_autocommit_session_reads_the_version_without_a_savepoint(
    database_url: str, schema46: str
) -> None:
    # An AUTOCOMMIT session has no transaction to put a savepoint in (and keeps no lock).
    auto = create_engine(database_url, isolation_level="AUTOCOMMIT")
    try:
        with Session(auto) as session:
            service = QueueService(session, schema=schema46)
            service.create_queue("auto")
            engine_state(auto).expire(schema46)
            job_id = service.send("auto", {"n": 1})
            assert job_id is not None
            assert service.get_job("auto", job_id) is not None
    finally:
        auto.dispose()
