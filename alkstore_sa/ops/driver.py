"""Running an operation: the one place that executes its statements.

Every entry point (the services, supervision, maintenance, the CLI) runs operations
through :func:`run` or :func:`arun`, so what counts as a conflict inside a savepoint
is decided once, by :func:`~alkstore_sa.ops.is_conflict`: a unique violation or a
deadlock (or a violation of a constraint the call names as refused) is sent back
into the operation as :class:`~alkstore_sa.ops.Conflict`;
any other error is raised, and the caller's transaction is left as the error left it.

With ``autocommit=True`` the target is a Connection in autocommit (the workers'
claims and settlements: one statement, one round trip, no BEGIN/COMMIT). Each
statement then commits on its own, so a statement marked for a savepoint needs
none: a conflict ends only that statement, and is sent back as in a transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from sqlalchemy import Connection, CursorResult, Result
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.util import greenlet_spawn

from . import _direct as _direct_path
from ._core import Call, Op, sent_back

T = TypeVar("T")

Target = Session | Connection
"""What a synchronous operation runs on: the caller's Session, or a Connection."""

AsyncTarget = AsyncSession | AsyncConnection
"""What an asynchronous operation runs on."""


def run(target: Target, op: Op[T], options: Mapping[str, Any], *, autocommit: bool = False) -> T:
    """Run ``op`` on ``target``, each statement with the execution ``options``.

    ``autocommit``: ``target`` is a Connection in autocommit (see above).
    """
    result: Result[Any]
    try:
        call = next(op)
        while True:
            if call.savepoint and autocommit:
                try:
                    result = _execute(target, call, options)
                except DBAPIError as exc:
                    conflict = sent_back(call, exc)
                    if conflict is None:
                        raise
                    call = op.throw(conflict)
                    continue
            elif call.savepoint:
                try:
                    if call.direct:
                        result = _direct(target, call, options)
                    else:
                        with target.begin_nested():
                            result = _settled(_execute(target, call, options))
                except DBAPIError as exc:
                    conflict = sent_back(call, exc)
                    if conflict is None:
                        raise
                    call = op.throw(conflict)
                    continue
            elif call.direct:
                result = _direct(target, call, options)
            else:
                result = _execute(target, call, options)
            call = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def arun(
    target: AsyncTarget, op: Op[T], options: Mapping[str, Any], *, autocommit: bool = False
) -> T:
    """:func:`run` for an :class:`AsyncSession` or :class:`AsyncConnection`."""
    result: Result[Any]
    try:
        call = next(op)
        while True:
            if call.savepoint and autocommit:
                try:
                    result = await _aexecute(target, call, options)
                except DBAPIError as exc:
                    conflict = sent_back(call, exc)
                    if conflict is None:
                        raise
                    call = op.throw(conflict)
                    continue
            elif call.savepoint:
                try:
                    if call.direct:
                        result = await _adirect(target, call, options)
                    else:
                        async with target.begin_nested():
                            executed = await _aexecute(target, call, options)
                            result = _settled(executed)
                except DBAPIError as exc:
                    conflict = sent_back(call, exc)
                    if conflict is None:
                        raise
                    call = op.throw(conflict)
                    continue
            elif call.direct:
                result = await _adirect(target, call, options)
            else:
                result = await _aexecute(target, call, options)
            call = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _settled(result: Result[Any]) -> Result[Any]:
    # Rows are read before the savepoint is released, so the operation can still read
    # them after; a statement without rows (an UPDATE with no RETURNING) has none to
    # keep, and freezing it would raise.
    if isinstance(result, CursorResult) and not result.returns_rows:
        return result
    return result.freeze()()


def _execute(target: Target, call: Call, options: Mapping[str, Any]) -> Result[Any]:
    return target.execute(call.statement, call.params, execution_options=options)


async def _aexecute(target: AsyncTarget, call: Call, options: Mapping[str, Any]) -> Result[Any]:
    return await target.execute(call.statement, call.params, execution_options=options)


def _direct(target: Target, call: Call, options: Mapping[str, Any]) -> Result[Any]:
    """A ``direct`` call: on the psycopg connection of the caller's transaction when
    :mod:`alkstore_sa.ops._direct` can, else as any other (in a savepoint if it has
    ``savepoint``: its failure is rolled back to it before it is raised)."""
    prepared = _direct_path.prepare(target, call.statement, options, awaited=False)
    if prepared is not None:
        return _direct_path.execute(prepared, call.params, savepoint=call.savepoint)
    if not call.savepoint:
        return _execute(target, call, options)
    with target.begin_nested():
        return _settled(_execute(target, call, options))


async def _adirect(target: AsyncTarget, call: Call, options: Mapping[str, Any]) -> Result[Any]:
    # One greenlet hop for the Session's connection (which may connect) and the plan.
    sync_target = (
        target.sync_session if isinstance(target, AsyncSession) else target.sync_connection
    )
    prepared = (
        None
        if sync_target is None
        else await greenlet_spawn(
            _direct_path.prepare, sync_target, call.statement, options, awaited=True
        )
    )
    if prepared is not None:
        return await _direct_path.aexecute(prepared, call.params, savepoint=call.savepoint)
    if not call.savepoint:
        return await _aexecute(target, call, options)
    async with target.begin_nested():
        return _settled(await _aexecute(target, call, options))
