"""Supervision as operations: monitor, expire, delete, cron and the rest
(as pg-boss's maintenance, failJobs and cron timekeeper do them).

A supervision pass is a generator of *units*. A unit is an ordinary operation
(it yields :class:`Call` objects) meant to run in one transaction of its own.
:class:`~alkstore_sa.supervision.Supervisor` gives each unit a short
transaction with pg-boss's lock timeouts and throws a unit's error back into
the pass, which records it and goes on with the next step.
:meth:`QueueService.supervise <alkstore_sa.QueueService.supervise>` runs every
unit inline in the caller's transaction instead (:func:`supervise_once`): each
statement in a savepoint, advisory locks only tried, never waited for, so the
caller's transaction stays usable whatever happens.

What a pass does is the list of duties of the installed schema version
(:data:`DUTIES`, chosen by :func:`duties_for`), run by the one frame
:func:`alkstore_sa.ops.frame.run_duties`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from .. import options as opt
from ..errors import InvalidOptionsError
from ..records import QueueWarning as QueueWarning  # re-exported: the supervisors report it
from ..records import SupervisionReport as SupervisionReport
from ..sql.v26 import supervision as sql
from ._core import Call, Context, Op, restated
from .duties26 import DUTIES26
from .duties26 import database_epoch as database_epoch  # re-exported: the supervisors use it
from .duties46 import DUTIES46
from .frame import Busy, Duty, Pass, run_duties
from .frame import PassPlan as PassPlan  # re-exported: the supervisors plan passes
from .frame import Settings as Settings

T = TypeVar("T")

DUTIES: dict[int, tuple[Duty, ...]] = {26: DUTIES26, 46: DUTIES46}
"""The duties of a pass, by the schema version that introduced the list; a version
takes the newest list registered at or below it (:func:`duties_for`)."""


def duties_for(version: int) -> tuple[Duty, ...]:
    """The duties of a pass at schema ``version``: the newest list registered at
    or below it, so a version that adds no duty inherits the one before."""
    known = [v for v in DUTIES if v <= version]
    if not known:
        raise LookupError(f"no supervision duties for pg-boss schema version {version}")
    return DUTIES[max(known)]


def supervise_pass(ctx: Context, plan: PassPlan) -> Pass:
    """One pass: the duties of the installed version (:func:`duties_for`) in their
    order - per table and chunk of 100 queues monitor then maintain; cron; send-it;
    and at 46 the others of pg-boss 12.38 (:mod:`alkstore_sa.ops.duties46`)."""
    plan.settings.check_version(ctx.version)
    return (yield from run_duties(ctx, plan, duties_for(ctx.version)))


def with_lock_timeouts(unit: Op[T]) -> Op[T]:
    """``unit`` in a transaction of its own, with pg-boss's lock and idle timeouts
    (``SET LOCAL``), so that a supervision step never waits long on a lock."""
    yield Call(sql.local_timeouts())
    return (yield from unit)


# ------------------------------------------------------------------ inline


def _savepointed(op: Op[T]) -> Op[T]:
    # Every statement in a savepoint: if one fails, the caller's transaction is
    # rolled back to just before it and stays usable while the error propagates.
    return restated(op, lambda call: dataclasses.replace(call, savepoint=True))


def run_inline(steps: Pass) -> Op[SupervisionReport]:
    """Run a pass as one operation in the caller's transaction.

    Only a skipped lock (:class:`Busy`) is handed back to the pass; any other
    error propagates to the caller, as every other service method does.
    """
    try:
        unit = next(steps)
        while True:
            try:
                result = yield from _savepointed(unit)
            except Busy as exc:
                unit = steps.throw(exc)
                continue
            unit = steps.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


NOW_WINDOW = dt.timedelta(hours=1)
"""How far ``supervise(now=...)`` may move the clock, either way."""


def supervise_once(
    ctx: Context, queues: str | Sequence[str] | None, *, force: bool, options: Mapping[str, Any]
) -> Op[SupervisionReport]:
    """The operation behind ``QueueService.supervise`` (``now`` is one of ``options``)."""
    options = dict(options)
    now = options.pop("now", None)
    settings = Settings.from_options({**options, "queues": queues})
    opt.check_bool("force", force)
    if now is not None:
        now = opt.in_utc("now", now)
        if abs(now - dt.datetime.now(dt.UTC)) > NOW_WINDOW:
            # A clock for tests of expiry and deletion, not a way to expire or delete
            # everything: supervise(now=9999-12-31) would delete every queued job.
            raise InvalidOptionsError(
                "now", f"must be within {NOW_WINDOW} of the current time, not {now.isoformat()}"
            )
    plan = PassPlan(
        settings,
        monitor=settings.supervise,
        cron=settings.schedule,
        send_it=settings.schedule,
        now=now,
        force=force,
        wait_for_locks=False,
        flows=settings.supervise and settings.flows,
    )
    return (yield from run_inline(supervise_pass(ctx, plan)))
