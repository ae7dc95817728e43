"""The one driver: a unique violation or a deadlock inside a savepoint is a conflict sent
back into the operation; any other error is raised, and the transaction stays usable.

Run on each kind of target the entry points use: the services' Session and AsyncSession,
supervision's Connection and AsyncConnection, and the workers' Connection and
AsyncConnection in autocommit (no savepoint there: a conflict ends its statement only).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from alkstore_sa.ops import Call, Conflict, Op
from alkstore_sa.ops.driver import arun, run


def raising(sqlstate: str) -> Call:
    """A statement PostgreSQL fails with ``sqlstate``, in a savepoint."""
    statement = text(
        f"DO $$ BEGIN RAISE EXCEPTION 'raised on purpose' USING ERRCODE = '{sqlstate}'; END $$"
    )
    return Call(statement, savepoint=True)


def outcome_of(sqlstate: str) -> Op[str]:
    try:
        yield raising(sqlstate)
    except Conflict:
        after = yield Call(text("SELECT 'conflict'"))
        return str(after.scalar_one())
    return "no error"


UNIQUE_VIOLATION, DEADLOCK, CHECK_VIOLATION, FOREIGN_KEY = "23505", "40P01", "23514", "23503"


@contextmanager
def sync_target(engine: Engine, kind: str) -> Iterator[Any]:
    if kind == "session":
        with Session(engine) as session, session.begin():
            yield session
    elif kind == "autocommit":
        with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
            yield conn
    else:
        with engine.begin() as conn:
            yield conn


@asynccontextmanager
async def async_target(database_url: str, kind: str) -> AsyncIterator[Any]:
    engine = create_async_engine(database_url)
    try:
        if kind == "session":
            async with AsyncSession(engine) as session, session.begin():
                yield session
        elif kind == "autocommit":
            autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
            async with autocommit.connect() as conn:
                yield conn
        else:
            async with engine.begin() as conn:
                yield conn
    finally:
        await engine.dispose()


KINDS = ["session", "connection", "autocommit"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sqlstate", [UNIQUE_VIOLATION, DEADLOCK])
def test_unique_violation_and_deadlock_are_conflicts(
    engine: Engine, kind: str, sqlstate: str
) -> None:
    with sync_target(engine, kind) as target:
        assert run(target, outcome_of(sqlstate), {}, autocommit=kind == "autocommit") == (
            "conflict"
        )


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("sqlstate", [UNIQUE_VIOLATION, DEADLOCK])
async def test_unique_violation_and_deadlock_are_conflicts_async(
    database_url: str, kind: str, sqlstate: str
) -> None:
    async with async_target(database_url, kind) as target:
        auto = kind == "autocommit"
        assert await arun(target, outcome_of(sqlstate), {}, autocommit=auto) == "conflict"


RAISED: list[tuple[str, type[Exception]]] = [
    (CHECK_VIOLATION, IntegrityError),
    (FOREIGN_KEY, IntegrityError),
    ("40001", OperationalError),  # serialization_failure: the caller retries, not us
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("sqlstate", "error"), RAISED)
def test_other_errors_are_raised_and_the_transaction_stays_usable(
    engine: Engine, kind: str, sqlstate: str, error: type[Exception]
) -> None:
    with sync_target(engine, kind) as target:
        with pytest.raises(error, match="raised on purpose"):
            run(target, outcome_of(sqlstate), {}, autocommit=kind == "autocommit")
        assert target.execute(text("SELECT 42")).scalar_one() == 42


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("sqlstate", "error"), RAISED)
async def test_other_errors_are_raised_and_the_transaction_stays_usable_async(
    database_url: str, kind: str, sqlstate: str, error: type[Exception]
) -> None:
    async with async_target(database_url, kind) as target:
        with pytest.raises(error, match="raised on purpose"):
            await arun(target, outcome_of(sqlstate), {}, autocommit=kind == "autocommit")
        assert (await target.execute(text("SELECT 42"))).scalar_one() == 42


def test_every_entry_point_runs_operations_through_the_one_driver() -> None:
    # The services and supervision hold no driving loop of their own: a second copy
    # is how the conflict rule drifted apart before.
    from pathlib import Path

    import alkstore_sa

    package = Path(alkstore_sa.__file__).parent
    drivers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if "begin_nested()" in path.read_text() and "op.throw(" in path.read_text()
    )
    assert drivers == ["ops/driver.py"]


def test_autocommit_runs_a_savepoint_statement_without_a_savepoint(engine: Engine) -> None:
    # In autocommit there is no transaction to hold a SAVEPOINT (PostgreSQL would
    # refuse one); each statement commits on its own.
    def op() -> Op[tuple[int, str]]:
        yield Call(text("CREATE TEMP TABLE kept (x int PRIMARY KEY)"))
        yield Call(text("INSERT INTO kept VALUES (1)"), savepoint=True)
        outcome = "no error"
        try:
            yield Call(text("INSERT INTO kept VALUES (1)"), savepoint=True)
        except Conflict:
            outcome = "conflict"
        count = yield Call(text("SELECT count(*) FROM kept"))
        return int(count.scalar_one()), outcome

    with engine.execution_options(isolation_level="AUTOCOMMIT").connect() as conn:
        assert run(conn, op(), {}, autocommit=True) == (1, "conflict")
