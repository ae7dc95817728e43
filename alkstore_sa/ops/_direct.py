"""Statements run on the DBAPI connection itself: the driver's fast path for ``Call.direct``.

SQLAlchemy's execute costs tens of microseconds per statement above the driver
(cache lookup, parameter and result processing, the execution context), more with
``AsyncSession``, whose every call crosses a greenlet. For a statement the hot
paths run at every call (the insert behind ``send``, a worker's claim and its
completions), the driver instead compiles
the statement once per dialect, statement and ``schema_translate_map`` (the
schema's name rendered into the text) and runs that text on the psycopg
connection SQLAlchemy hands out for the caller's transaction
(``Connection.connection.driver_connection``). The statement is the same one,
built by the same Core builder; it runs in the same transaction, so the job
exists if and only if that transaction commits.

What the fast path keeps from SQLAlchemy's execute: the bind processors of the
statement's types, and the errors (a psycopg error is raised as the
:class:`sqlalchemy.exc.DBAPIError` subclass SQLAlchemy would raise, and a lost
connection is invalidated). What it does not run: cursor-execute and
``handle_error`` events, SQL logging (``echo`` or the ``sqlalchemy.engine`` logger
at INFO) and a Session's ``do_orm_execute`` listeners; when any of them is present,
or the driver is not psycopg, the statement runs through SQLAlchemy's execute as
any other. Only public SQLAlchemy API is used.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq
from sqlalchemy import Connection, Executable, Result, Select, UpdateBase
from sqlalchemy.engine import Dialect, IteratorResult
from sqlalchemy.engine.result import SimpleResultMetaData
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.orm import Session
from sqlalchemy.util import greenlet_spawn

_ENGINE_LOG = logging.getLogger("sqlalchemy.engine.Engine")

_OPTIONS = frozenset({"schema_translate_map"})
"""The execution options a direct statement may carry (rendered into its text)."""

_PLANS_PER_DIALECT = 512
"""Compiled texts kept per dialect (statement shapes x schemas); past that the
cache starts over, as SQLAlchemy's own statement cache is bounded."""


@dataclass(frozen=True, slots=True)
class Plan:
    """A statement compiled for one dialect and schema map, ready for psycopg."""

    sql: str
    fixed: Mapping[str, Any]
    """The statement's literal parameters (rendered as binds by SQLAlchemy)."""
    processors: Mapping[str, Callable[[Any], Any]]
    """Bind processors of the statement's types, by parameter name."""
    metadata: SimpleResultMetaData

    def parameters(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        out = dict(self.fixed)
        if params:
            out.update(params)
        for name, process in self.processors.items():
            if name in out:
                out[name] = process(out[name])
        return out

    def result(self, rows: list[Any]) -> Result[Any]:
        return IteratorResult(self.metadata, iter(rows))


_plans: weakref.WeakKeyDictionary[Dialect, dict[tuple[Any, ...], Plan | None]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def _compile(dialect: Dialect, statement: Any, translate: Any) -> Plan | None:
    compiled: Any = statement.compile(
        dialect=dialect,
        schema_translate_map=translate or None,
        render_schema_translate=bool(translate),
    )
    if (
        compiled.positional
        or compiled.literal_execute_params
        or compiled.post_compile_params
        or getattr(compiled, "escaped_bind_names", None)
    ):
        return None  # a statement this path does not render: SQLAlchemy runs it
    binds = compiled.bind_names.items()
    fixed = {name: bind.effective_value for bind, name in binds if not bind.required}
    # Each bound type's processor for this dialect, as SQLAlchemy's execute applies it.
    processors = {}
    for bind, name in binds:
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors[name] = process
    keys = list(statement.exported_columns.keys())
    return Plan(compiled.string, fixed, processors, SimpleResultMetaData(keys))


def _logs_sql(connection: Connection) -> bool:
    """Whether SQLAlchemy would log this connection's statements (``echo``, or its
    engine logger enabled at INFO)."""
    return bool(connection.engine.echo) or _ENGINE_LOG.isEnabledFor(logging.INFO)


def _failed(connection: Connection, exc: Any, sql: str, bound: Mapping[str, Any]) -> StatementError:
    """The error SQLAlchemy's execute raises for the driver's ``exc``: a
    :class:`~sqlalchemy.exc.DBAPIError` of the matching class, the connection
    invalidated first when ``exc`` says it is gone (public API only; an engine
    with ``handle_error`` listeners never takes this path, see :func:`plan_for`)."""
    dialect = connection.dialect
    gone = dialect.is_disconnect(exc, connection.connection.dbapi_connection, None)
    if gone:
        connection.invalidate(exc)
    error: StatementError = DBAPIError.instance(
        sql,
        dict(bound),
        exc,
        dialect.loaded_dbapi.Error,
        connection_invalidated=gone,
        dialect=dialect,
    )
    return error


def _returns_rows(statement: Executable) -> bool:
    """A SELECT, or an INSERT, UPDATE or DELETE with RETURNING: statements whose rows
    the plan reads back (its result's keys are the statement's exported columns)."""
    if isinstance(statement, Select):
        return True
    return isinstance(statement, UpdateBase) and bool(statement.exported_columns)


def plan_for(
    connection: Connection, statement: Executable, options: Mapping[str, Any]
) -> Plan | None:
    """The compiled text of ``statement`` for ``connection``, or ``None`` when it must
    run through SQLAlchemy's execute (see the module's docstring)."""
    dialect = connection.dialect
    if (
        dialect.driver != "psycopg"
        or not options.keys() <= _OPTIONS
        or _logs_sql(connection)
        or connection.dispatch.before_cursor_execute
        or connection.dispatch.after_cursor_execute
        or connection.dialect.dispatch.handle_error
        or not _returns_rows(statement)
    ):
        return None
    translate = options.get("schema_translate_map")
    key = (statement, tuple(translate.items()) if translate else ())
    plans = _plans.get(dialect)
    if plans is None:
        with _lock:
            plans = _plans.setdefault(dialect, {})
    try:
        return plans[key]
    except KeyError:
        pass
    plan = _compile(dialect, statement, translate)
    with _lock:
        if len(plans) >= _PLANS_PER_DIALECT:
            plans.clear()
        plans[key] = plan
    return plan


@dataclass(frozen=True, slots=True)
class Prepared:
    """Where and what to run: the caller's Connection (in its transaction), the
    compiled statement, and the psycopg connection under it."""

    connection: Connection
    plan: Plan
    driver_connection: Any


def prepare(
    target: Session | Connection,
    statement: Executable,
    options: Mapping[str, Any],
    *,
    awaited: bool,
) -> Prepared | None:
    """The caller's Connection for ``statement`` (a Session's begun if need be) and its
    :class:`Plan`, or ``None`` when the statement must run through SQLAlchemy: a
    Session with ``do_orm_execute`` listeners, a Connection not in a transaction (it
    would begin one SQLAlchemy does not know of), a driver connection of the other
    kind (``awaited``: the caller awaits psycopg's ``AsyncConnection``; a sync
    service run by ``AsyncSession.run_sync`` gets SQLAlchemy's execute), or
    :func:`plan_for`'s reasons.

    May do I/O (a Session's first connection): the async driver calls it in a greenlet.
    """
    if isinstance(target, Session):
        if target.dispatch.do_orm_execute:
            return None
        connection = target.connection(bind_arguments={"clause": statement})
    elif target.in_transaction():
        connection = target
    else:
        return None
    if bool(connection.dialect.is_async) is not awaited:
        return None
    plan = plan_for(connection, statement, options)
    if plan is None:
        return None
    return Prepared(connection, plan, connection.connection.driver_connection)


_FAILED = pq.TransactionStatus.INERROR
_SAVEPOINT = "SAVEPOINT alkstore_direct"
_RELEASE = "RELEASE SAVEPOINT alkstore_direct"
_ROLLBACK = "ROLLBACK TO SAVEPOINT alkstore_direct"


def _rows(driver_connection: Any, sql: str, bound: Mapping[str, Any]) -> list[Any]:
    with driver_connection.cursor() as cursor:
        cursor.execute(sql, bound)
        rows: list[Any] = cursor.fetchall()
        return rows


def _rows_in_savepoint(driver_connection: Any, sql: str, bound: Mapping[str, Any]) -> list[Any]:
    """The statement's rows, run in a savepoint that its failure rolls back (one round
    trip: savepoint, statement and release sent together in pipeline mode)."""
    if driver_connection.autocommit:
        # Each statement is its own transaction: a failure ends only this one.
        return _rows(driver_connection, sql, bound)
    try:
        if not psycopg.Pipeline.is_supported():
            driver_connection.execute(_SAVEPOINT)
            rows = _rows(driver_connection, sql, bound)
            driver_connection.execute(_RELEASE)
            return rows
        with driver_connection.cursor() as cursor:
            with driver_connection.pipeline():
                driver_connection.execute(_SAVEPOINT)
                cursor.execute(sql, bound)
                driver_connection.execute(_RELEASE)
            # The pipeline's sync has brought the statement's rows.
            fetched: list[Any] = cursor.fetchall()
        return fetched
    except psycopg.Error:
        if driver_connection.info.transaction_status == _FAILED:
            # Not if the transaction had failed before (then there is no savepoint,
            # and the error to raise is the one SAVEPOINT met).
            with contextlib.suppress(psycopg.Error):
                driver_connection.execute(_ROLLBACK)
                driver_connection.execute(_RELEASE)
        raise


def execute(
    prepared: Prepared, params: Mapping[str, Any] | None, *, savepoint: bool = False
) -> Result[Any]:
    """Run the plan on the psycopg connection, in the caller's transaction; with
    ``savepoint``, in a savepoint that a failure rolls back before it is raised (so
    the caller's transaction stays usable)."""
    connection, plan, driver_connection = (
        prepared.connection,
        prepared.plan,
        prepared.driver_connection,
    )
    bound = plan.parameters(params)
    try:
        if savepoint:
            rows = _rows_in_savepoint(driver_connection, plan.sql, bound)
        else:
            rows = _rows(driver_connection, plan.sql, bound)
    except connection.dialect.loaded_dbapi.Error as exc:
        raise _failed(connection, exc, plan.sql, bound) from exc
    return plan.result(rows)


async def _arows(driver_connection: Any, sql: str, bound: Mapping[str, Any]) -> list[Any]:
    async with driver_connection.cursor() as cursor:
        await cursor.execute(sql, bound)
        rows: list[Any] = await cursor.fetchall()
        return rows


async def _arows_in_savepoint(
    driver_connection: Any, sql: str, bound: Mapping[str, Any]
) -> list[Any]:
    """:func:`_rows_in_savepoint` on a psycopg ``AsyncConnection``."""
    if driver_connection.autocommit:
        return await _arows(driver_connection, sql, bound)
    try:
        if not psycopg.AsyncPipeline.is_supported():
            await driver_connection.execute(_SAVEPOINT)
            rows = await _arows(driver_connection, sql, bound)
            await driver_connection.execute(_RELEASE)
            return rows
        async with driver_connection.cursor() as cursor:
            async with driver_connection.pipeline():
                await driver_connection.execute(_SAVEPOINT)
                await cursor.execute(sql, bound)
                await driver_connection.execute(_RELEASE)
            fetched: list[Any] = await cursor.fetchall()
        return fetched
    except psycopg.Error:
        if driver_connection.info.transaction_status == _FAILED:
            with contextlib.suppress(psycopg.Error):
                await driver_connection.execute(_ROLLBACK)
                await driver_connection.execute(_RELEASE)
        raise


async def aexecute(
    prepared: Prepared, params: Mapping[str, Any] | None, *, savepoint: bool = False
) -> Result[Any]:
    """:func:`execute` on a psycopg ``AsyncConnection``, awaited on the event loop
    itself (no greenlet in between)."""
    sync, plan, driver_connection = prepared.connection, prepared.plan, prepared.driver_connection
    bound = plan.parameters(params)
    try:
        if savepoint:
            rows = await _arows_in_savepoint(driver_connection, plan.sql, bound)
        else:
            rows = await _arows(driver_connection, plan.sql, bound)
    except sync.dialect.loaded_dbapi.Error as exc:
        # Invalidating a lost connection closes it, which awaits: in a greenlet, where
        # SQLAlchemy does its own.
        error = await greenlet_spawn(_failed, sync, exc, plan.sql, bound)
        raise error from exc
    return plan.result(rows)
