"""The attempt history as operations: a job's failed attempts, and the supervision
duty that removes the attempts of jobs that no longer exist (the "Attempt history"
page). The fails themselves record each attempt (:mod:`alkstore_sa.sql.common.failing`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Generator, Mapping
from typing import Any

from .. import options as opt
from ..limits import ATTEMPT_LOCK_WAIT_MS
from ..models.attempts import ATTEMPT
from ..names import queue_ref
from ..records import JobAttempt
from ..sql.common import attempts as sql
from ..sql.statements import Statements, statements_for
from ..sql.v46.fail import SplitFail
from ._core import Call, Conflict, Context, Op, failing
from .frame import PassPlan, Tally
from .queues import require_queue

log = logging.getLogger("alkstore_sa.ops.attempts")

SWEEP_BATCH = 5_000
"""Attempts one batch of the sweep looks at for jobs that no longer exist: the sweep walks
the table in id order, a batch at a time (each in a transaction of its own), and starts
again at the end. A pass takes one batch, and the next while a batch deleted any, up to
the end: a backlog of orphans goes in one pass, so a steady stream of them never grows
one."""


def get_job_attempts(ctx: Context, name: str, id: object) -> Op[list[JobAttempt]]:
    """The failed attempts recorded for job ``id`` of queue ``name``, oldest first
    (empty without the attempt history table, or for a job with none: a job failed
    only by Node pg-boss has none)."""
    queue_ref(name)
    job_id = opt.job_id(id)
    attempts: list[JobAttempt] = []
    if ctx.history:
        result = yield Call(sql.job_attempts(), {"qname": name, "id": job_id})
        attempts = [JobAttempt.from_row(r) for r in result.mappings().all()]
    if not attempts:
        yield from require_queue(ctx, name)  # "no such queue" is an error; "none" is not
    return attempts


def sweep(ctx: Context, after: int, limit: int) -> Op[tuple[int | None, int]]:
    """One batch of :func:`~alkstore_sa.sql.common.attempts.sweep_orphans`: the last id
    looked at (``None``: the end was reached) and how many attempts were deleted.

    The history never stands in supervision's way either: the batch waits at most
    :data:`~alkstore_sa.limits.ATTEMPT_LOCK_WAIT_MS` for a lock, and a role that may not
    delete from it, a lock held on it or a dropped table skips the batch (``(None,
    0)``), said once as a fail says it."""
    call = Call(
        sql.sweep_orphans(), {"after": after, "limit": limit}, savepoint=True, contained=True
    )
    try:
        row = (yield from _bounded(call)).one()
    except Conflict as conflict:
        assert conflict.error is not None
        yield from _troubled(ctx, conflict.error)
        return None, 0
    return (None if row.last is None else int(row.last)), int(row.deleted)


def sweep_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """The attempt history's duty: batches of :data:`SWEEP_BATCH` attempts, from where
    the last pass on this engine stopped, while they find orphans (up to the end of
    the table); nothing on a schema without the table."""
    if not ctx.history:
        return
    deleted, found = 0, True
    while found:
        after = ctx.sweeps.get(ctx.schema, 0)
        done = yield from tally.attempt(sweep(ctx, after, SWEEP_BATCH), "attempts")
        if done is None:
            break
        last, batch = done
        ctx.sweeps[ctx.schema] = 0 if last is None else last
        deleted += batch
        found = bool(batch) and last is not None
    if deleted:
        log.info(
            "deleted %d attempt(s) of jobs that no longer exist",
            deleted,
            extra={"action": "attempts_swept", "schema": ctx.schema, "count": deleted},
        )


# ------------------------------------------------------------------ recording fails

_PRIVILEGE, _MISSING, _LOCK, _ROW = "privilege", "missing", "lock", "row"

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def recording(
    ctx: Context,
    build: Callable[[Statements], Any],
    params: Mapping[str, Any],
    *,
    autocommit: bool = False,
) -> Op[list[Any]]:
    """Run the fail ``build`` makes of the schema's statements (a worker's or a client's
    fail, an expiry, a poison row's fail); its rows, as :func:`~._core.failing` answers.

    With the attempt history, the history never stands in the fail's way. In a
    transaction the fail that records attempts runs in a savepoint, waiting at most
    :data:`~alkstore_sa.limits.ATTEMPT_LOCK_WAIT_MS` for a lock (``SET LOCAL
    lock_timeout``, put back after it). ``autocommit`` (a worker: each statement commits
    on its own, where no ``lock_timeout`` bounds one statement and a session-wide one
    would outlive it behind a pooler): the table is looked at first, without waiting.
    When the history is what is in the way (a missing privilege, a lock another session
    holds or waits for, a dropped table), the same fail runs without it, and one WARNING
    says what is missing and how to mend it (``attempt_history_unavailable``).
    """
    if not ctx.history:
        return (yield from failing(build(ctx.sql), params))
    stmt = build(ctx.sql)
    if isinstance(stmt, SplitFail):
        return (yield from _split(ctx, stmt, params, autocommit=autocommit))
    trouble: BaseException | None = None
    call = Call(stmt, params, savepoint=True, contained=True)
    if autocommit:
        # No lock_timeout bounds one statement of its own: look first, without waiting.
        found = (yield Call(sql.history_usable(), {"t": _table(ctx.schema)})).one()
        what = _MISSING if not found.present else _PRIVILEGE if not found.writable else None
        what = what or (_LOCK if found.locked else None)
        if what is not None:
            yield from _warn(ctx, what, None)
            return (yield from _without_history(ctx, build, params))
        running = _plain(call)
    else:
        running = _bounded(call)
    try:
        rows = list((yield from running).all())
    except Conflict as conflict:
        trouble = conflict.error
    if trouble is None:
        _recovered(ctx.schema)
        return rows
    yield from _troubled(ctx, trouble)
    return (yield from _without_history(ctx, build, params))


def _without_history(
    ctx: Context, build: Callable[[Statements], Any], params: Mapping[str, Any]
) -> Op[list[Any]]:
    plain = build(statements_for(ctx.version, ctx.backend.flags, history=False))
    bare = {k: v for k, v in params.items() if k not in ("worker", "worker_id")}
    return (yield from failing(plain, bare))


def _plain(call: Call) -> Op[Any]:
    return (yield call)


def _table(schema: str) -> str:
    return f"{_quoted(schema)}.{ATTEMPT.name}"


def _bounded(call: Call) -> Op[Any]:
    """``call`` (in a savepoint that sends every error back) under
    :data:`~alkstore_sa.limits.ATTEMPT_LOCK_WAIT_MS` of ``lock_timeout`` (``SET LOCAL``:
    in the caller's transaction, never its session), the setting put back after it
    whatever it did."""
    old = (yield Call(sql.bound_lock_wait(), {"ms": ATTEMPT_LOCK_WAIT_MS, "local": True})).one()
    restore = Call(sql.restore_lock_wait(), {"old": old.old, "local": True})
    try:
        result = yield call
    except Conflict:
        yield restore
        raise
    yield restore
    return result


def _troubled(ctx: Context, error: BaseException) -> Op[None]:
    """Raise ``error`` unless it is the attempt history's; warn (once) when it is."""
    what = history_trouble(error)
    if what is None:
        raise error
    if what != _ROW:
        yield from _warn(ctx, what, error)


def _split(
    ctx: Context, stmt: SplitFail, params: Mapping[str, Any], *, autocommit: bool
) -> Op[list[Any]]:
    """:func:`~._core.failing` of a split fail, whose attempts are recorded by statements
    of their own: each in a savepoint under the lock's bound, and when the history is
    what the database refuses, the fail goes on without it."""

    def contained(record: Call, trim: Call) -> Generator[Call, Any, None]:
        record = dataclasses.replace(record, savepoint=True, contained=True)
        try:
            yield from (_plain(record) if autocommit else _bounded(record))
            yield dataclasses.replace(trim, savepoint=True, contained=True)
        except Conflict as conflict:
            assert conflict.error is not None
            yield from _troubled(ctx, conflict.error)
        else:
            _recovered(ctx.schema)

    return (yield from failing(stmt, params, recorder=contained))


def history_trouble(error: BaseException) -> str | None:
    """What ``error`` (from a fail recording attempts) says of the attempt history:
    ``privilege`` (the role may not write it), ``missing`` (the table is gone), ``lock``
    (another session holds a lock on it), ``row`` (the wait for a job's row lock ran out,
    nothing the history did), or None: an error of the fail itself."""
    orig = getattr(error, "orig", None)
    code = getattr(orig, "sqlstate", None)
    said = str(orig)
    if code == "42501" and ATTEMPT.name in said:
        return _PRIVILEGE
    if code == "42P01" and ATTEMPT.name in said:
        return _MISSING
    if code == "55P03":
        context = getattr(getattr(orig, "diag", None), "context", None) or ""
        return _ROW if "tuple" in context else _LOCK
    return None


def _recovered(schema: str) -> None:
    """A fail recorded its attempts: a later trouble is worth a WARNING again."""
    if _warned:
        with _warned_lock:
            for key in [k for k in _warned if k[0] == schema]:
                _warned.discard(key)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _warn(ctx: Context, what: str, error: BaseException | None) -> Op[None]:
    """One WARNING per schema and trouble, until a fail records its attempts again."""
    key = (ctx.schema, what)
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    table = _table(ctx.schema)
    said = "" if error is None else str(getattr(error, "orig", error)).strip().splitlines()[0]
    why = f" ({said})" if said else ""
    if what == _PRIVILEGE:
        role = (yield Call(sql.current_role())).scalar_one()
        grant = f"GRANT SELECT, INSERT, DELETE ON {table} TO {_quoted(role)};"
        message = (
            f"the attempt history is not kept: role {role!r} may not write {table}{why}; "
            f"fails and completions go on without it. Grant it with: {grant}"
        )
    elif what == _MISSING:
        grant = None
        message = (
            f"the attempt history is not kept: {table} is gone{why}; fails go on "
            "without it. `alkstore db upgrade` (or migrate.install_attempt_history) "
            "makes it again"
        )
    else:
        grant = None
        message = (
            f"a lock another session holds on {table}{why} kept a fail from recording "
            "its attempt (a fail waits for it at most "
            f"{ATTEMPT_LOCK_WAIT_MS} ms); fails are written without their attempts while "
            f"it is held (its holder: SELECT pid FROM pg_locks WHERE relation = "
            f"'{table}'::regclass)"
        )
    log.warning(
        "%s",
        message,
        extra={
            "action": "attempt_history_unavailable",
            "schema": ctx.schema,
            "reason": what,
            "grant": grant,
            "error": said or None,
        },
    )
