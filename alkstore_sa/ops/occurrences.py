"""The cron turn at schema 46, as pg-boss 12.38's timekeeper takes it.

Every schedule is read and evaluated first, holding no lock (:func:`evaluate46`);
then whoever wins ``version.cron_on`` files what is due (:func:`file46`). A
schedule is read by its ``kind``: a cron
expression (cronsim, :mod:`alkstore_sa.cron`) or an RFC 5545 recurrence rule
(:mod:`alkstore_sa.rrule`). What is due:

- a cron schedule: its latest fire time in the 60 seconds ending now;
- a recurrence rule: every occurrence in those 60 seconds;
- with ``missed: 'once'``, also the latest occurrence between the last pass
  (``max(prior cron_on, created_on)``) and the window's start.

Each occurrence goes to ``__pgboss__send-it`` under :func:`occurrence_key` and
the 60-second slot it falls in (:func:`slot_of`), written into ``singleton_on``,
so Node's timekeeper and ours file one job per slot between them. An
expression that cannot be read as its stored kind but reads as the other is
fired as that and relabelled afterwards, as Node does; one that reads as
neither is reported (``invalid_schedule``) and skipped.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import options as opt
from .. import rrule
from ..cron import previous_fire
from ..errors import InvalidOptionsError
from ..names import SEND_IT_QUEUE
from ..sql.v46 import cron as cron_sql
from ..sql.v46 import supervision as sup_sql
from . import frame
from ._core import Call, Context, Op
from .duties26 import (
    SLOT_SECONDS,
    CronOutcome,
    decode_stored,
    ensure_send_it,
    file_occurrences,
    row_problem,
)
from .frame import PassPlan

logger = logging.getLogger(__name__)

is_rrule = rrule.is_rrule


def occurrence_key(name: str, key: str) -> str:
    """pg-boss 12.38's send-it key: the name's ``_`` escaped as ``\\_``, ``__``, the key."""
    return name.replace("_", "\\_") + "__" + key


def slot_of(instant: dt.datetime) -> dt.datetime:
    """The 60-second slot ``instant`` falls in, as naive UTC wall time (``singleton_on``)."""
    epoch = int(instant.timestamp()) // SLOT_SECONDS * SLOT_SECONDS
    return dt.datetime.fromtimestamp(epoch, dt.UTC).replace(tzinfo=None)


def _due(expr: str, kind: str, tz: str, window: dt.datetime, at: dt.datetime) -> list[dt.datetime]:
    if kind == "rrule":
        return rrule.parse(expr, tz).between(window, at)
    fired = previous_fire(expr, tz, at)
    return [fired] if fired is not None and fired > window else []


def _latest(
    expr: str, kind: str, tz: str, after: dt.datetime, until: dt.datetime
) -> dt.datetime | None:
    if kind == "rrule":
        return rrule.parse(expr, tz).latest(after, until)
    fired = previous_fire(expr, tz, until)
    return fired if fired is not None and fired > after else None


def _read(expr: str, kind: str, tz: str, window: dt.datetime, at: dt.datetime) -> tuple[str, Any]:
    """``(kind read as, due occurrences)``: the stored kind, or the other one
    when the expression only reads that way (Node's fallback)."""
    try:
        return kind, _due(expr, kind, tz, window, at)
    except InvalidOptionsError:
        detected = "rrule" if is_rrule(expr) else "cron"
        if detected == kind:
            raise
        return detected, _due(expr, detected, tz, window, at)


def _invalid(ctx: Context, plan: PassPlan, row: Any, message: str) -> Op[None]:
    if plan.reports is not None and not plan.reports.first(row, message):
        return  # said (and written) already, of the row as it is: once per change
    logger.warning(message, extra={"action": "invalid_schedule", "queue": row.name})
    if plan.settings.persist_warnings:
        data = {"queue": row.name, "key": row.key, "cron": row.cron, "timezone": row.timezone}
        params = {"type": "invalid_schedule", "message": message, "data": json.dumps(data)}
        yield Call(sup_sql.insert_warning(), {**params, "now": plan.now})


@dataclass(frozen=True, slots=True)
class CronEvaluation:
    """What the cron turn files, worked out before it is claimed (:func:`evaluate46`).

    :ivar prior_cron_on: the turn's stamp when read: where a ``missed: 'once'``
        catch-up started.
    :ivar filed: per schedule due, ``(row, send-it job datas, slots)``.
    :ivar relabel: ``(name, key, kind, expression)`` of rows read as the other kind.
    :ivar invalid: ``(row, problem, message)`` of rows that could not be evaluated
        or sent: reported by the winner of the turn.
    """

    prior_cron_on: dt.datetime | None
    filed: list[tuple[Any, list[str | None], list[dt.datetime]]]
    relabel: list[tuple[str, str, str, str]]
    invalid: list[tuple[Any, str, str]]


def evaluate46(ctx: Context, plan: PassPlan) -> Op[CronEvaluation | None]:
    """Read and evaluate every schedule, holding no lock: ``None`` when the cron
    turn is not due (then nothing is read).

    Evaluating rules takes up to :data:`~alkstore_sa.limits.MAX_RRULE_SECONDS` a
    row; done here, before the claim, it never holds the ``version`` row that
    every turn of every supervisor (Node's too) is claimed on. Each row is read on
    its own: one whose expression, data or options cannot be read or evaluated is
    listed in ``invalid``, and the rest still fire.
    """
    interval = frame.interval(plan, plan.settings.cron_monitor_interval)
    state = (yield Call(cron_sql.cron_turn_state(), {"now": plan.now})).one()
    if state.elapsed < interval:
        return None
    schedules = (yield Call(cron_sql.timekeeper_schedules())).all()
    if plan.reports is not None:
        plan.reports.read(schedules)
    at = plan.cron_now or plan.now
    if at is None:
        at = (yield Call(sup_sql.database_time(), {"now": plan.now})).scalar_one()
    window = at - dt.timedelta(seconds=SLOT_SECONDS)
    out = CronEvaluation(state.prior_cron_on, [], [], [])
    for row in schedules:
        tz = row.timezone or "UTC"
        name = f"schedule {row.name}__{row.key}"
        try:
            data, options = decode_stored(row.data), decode_stored(row.options)
            kind, due = _read(row.cron, row.kind or "cron", tz, window, at)
        except Exception as exc:  # one row's failure, whatever it is, is that row's
            reason = row_problem(exc)
            out.invalid.append(
                (row, f"{name}: {reason}", f"{name} could not be evaluated: {reason}")
            )
            continue
        wanted = {slot_of(o) for o in due}
        settings = options if isinstance(options, Mapping) else {}
        if settings.get("missed") == "once" and state.prior_cron_on is not None:
            start = max(state.prior_cron_on, row.created_on)
            if start < window:
                try:
                    missed = _latest(row.cron, kind, tz, start, window)
                except Exception as exc:
                    reason = row_problem(exc)
                    message = f"{name} could not be caught up: {reason}"
                    out.invalid.append((row, f"{name}: {reason}", message))
                    missed = None
                if missed is not None:
                    wanted.add(slot_of(missed))
        if kind != (row.kind or "cron"):
            out.relabel.append((row.name, row.key, kind, row.cron))
        try:
            datas = []
            for slot in sorted(wanted):
                payload = {"name": row.name, "key": row.key, "data": data, "options": options}
                payload["slot"] = slot.isoformat(sep=" ")
                datas.append(opt.encode_json("data", payload))
        except Exception as exc:
            reason = row_problem(exc)
            out.invalid.append((row, f"{name}: {reason}", f"{name} could not be sent: {reason}"))
            continue
        if datas:
            out.filed.append((row, datas, sorted(wanted)))
    return out


def file46(ctx: Context, plan: PassPlan, evaluation: CronEvaluation) -> Op[CronOutcome]:
    """Win the cron turn and file what :func:`evaluate46` found due (see the module):
    the ``version`` row is held from the claim to the end of this short unit only.

    The occurrences go in in one statement; should it fail, one row at a time, each
    in a savepoint, and a row the database refuses is reported as invalid. Two
    timekeepers that both evaluated file one job per occurrence between them (the
    slot's unique index); only the one that wins the claim files at all.
    """
    interval = frame.interval(plan, plan.settings.cron_monitor_interval)
    claim = (yield Call(cron_sql.claim_cron(), {"interval": interval, "now": plan.now})).one()
    if not claim.claimed:
        return CronOutcome(False)
    problems: list[str] = []
    for row, problem, message in evaluation.invalid:
        problems.append(problem)
        yield from _invalid(ctx, plan, row, message)
    yield from ensure_send_it(ctx)
    fired = yield from _file(ctx, plan, evaluation.filed, problems)
    if evaluation.relabel:
        names, rkeys, kinds, exprs = (list(col) for col in zip(*evaluation.relabel, strict=True))
        params = {"names": names, "keys": rkeys, "kinds": kinds, "crons": exprs}
        yield Call(cron_sql.set_schedule_kinds(), params)
    return CronOutcome(True, fired, tuple(problems))


def _file(
    ctx: Context,
    plan: PassPlan,
    filed: list[tuple[Any, list[str | None], list[dt.datetime]]],
    problems: list[str],
) -> Op[tuple[str, ...]]:
    """Insert the occurrences of every row in ``filed`` (:func:`file_occurrences`: a
    row the database refuses is reported and skipped). The keys of the jobs inserted."""

    def insert(batch: list[tuple[Any, list[str | None], list[dt.datetime]]]) -> Op[list[str]]:
        params = {
            "queue": SEND_IT_QUEUE,
            "datas": [d for _, datas, _ in batch for d in datas],
            "keys": [occurrence_key(r.name, r.key) for r, datas, _ in batch for _ in datas],
            "slots": [s for _, _, slots in batch for s in slots],
            "now": plan.now,
        }
        inserted = (yield Call(cron_sql.insert_occurrences(), params)).all()
        return [r.singleton_key for r in inserted]

    def refused(item: tuple[Any, list[str | None], list[dt.datetime]], reason: str) -> Op[None]:
        row = item[0]
        name = f"schedule {row.name}__{row.key}"
        problems.append(f"{name}: {reason}")
        yield from _invalid(ctx, plan, row, f"{name} could not be sent: {reason}")

    return tuple((yield from file_occurrences(filed, insert, refused)))


__all__ = ["CronEvaluation", "evaluate46", "file46", "is_rrule", "occurrence_key", "slot_of"]
