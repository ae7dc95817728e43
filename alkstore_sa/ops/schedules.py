"""Schedule storage: cron expressions, and at schema 46 RFC 5545 recurrence
rules (firing belongs to the supervisor)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select

from .. import limits
from .. import options as opt
from ..errors import InvalidOptionsError, shown
from ..models.enums import QueuePolicy
from ..names import queue_ref
from ..records import ScheduleInfo
from ..sql.v26 import queues as queue_sql
from ._core import Call, Context, Op
from .queues import require_queue


def validate_cron(cron: object, tz: object) -> tuple[str, str]:
    from ..cron import validate

    return validate(cron, tz)


def _clock() -> Any:
    """The database's clock (its wall time, not the transaction's start)."""
    return select(func.clock_timestamp())


def schedule(
    ctx: Context, name: str, cron: str, data: Any, key: str, tz: str, options: Mapping[str, Any]
) -> Op[None]:
    from .. import rrule

    queue_ref(name)
    opt.check_text("key", key, max_bytes=limits.MAX_SCHEDULE_KEY_BYTES)
    # Text PostgreSQL can store (no lone surrogate, no NUL), checked before the
    # expression is read, so that what is refused is named as given.
    if isinstance(cron, str):
        opt.check_text("cron", cron)
    if isinstance(tz, str):
        opt.check_text("tz", tz)
    # As pg-boss 12.38: the expression's shape decides its kind, once, here.
    kind = "rrule" if isinstance(cron, str) and rrule.is_rrule(cron) else "cron"
    if kind == "rrule":
        ctx.require("an rrule schedule")
        cron, tz = rrule.validate(cron, tz)
    else:
        cron, tz = validate_cron(cron, tz)
    # pg-boss 12.38's catch-up policy lives only in the stored options; it is
    # no send option, so it comes out before those are checked.
    options = dict(options)
    missed = options.pop("missed", None)
    if missed not in (None, "skip", "once"):
        raise InvalidOptionsError("missed", f"must be 'skip' or 'once', not {shown(missed)}")
    # Validate the send options now, so that a schedule never fires bad jobs.
    opt.send_options(options, version=ctx.version)
    encoded = opt.encode_json("data", data)
    if kind == "rrule":
        # A rule with nothing left to send (a passed UNTIL, a spent COUNT) would
        # sit in the table and never send a job: refused, as pg-boss refuses it,
        # judged at the database's clock (the one the timekeeper reads).
        clock = (yield Call(_clock(), {})).scalar_one()
        if not rrule.parse(cron, tz).sends_after(clock):
            raise InvalidOptionsError(
                "cron", "rrule expression has no occurrence left, so it would never send a job"
            )
    queue = yield from require_queue(ctx, name)
    if queue.policy == QueuePolicy.KEY_STRICT_FIFO and options.get("singleton_key") is None:
        # Each firing sends the queue a job with the schedule's options; this
        # policy refuses a job without a key, so every firing would fail.
        raise InvalidOptionsError(
            "singleton_key",
            f"queue {shown(name)} has policy key_strict_fifo: a schedule on it needs a"
            " singleton_key in its options (every job it sends needs a key)",
        )
    stored = {**opt.to_pgboss_send_options(options), "tz": tz, "key": key}
    if missed is not None:
        stored["missed"] = missed
    params = {
        "qname": name,
        "key": key,
        "cron": cron,
        "timezone": tz,
        "data": encoded,
        "options": opt.encode_json("options", stored),
    }
    # From 46 on the row names its kind (a statement of 26 leaves ``kind`` unbound).
    yield Call(ctx.sql.upsert_schedule(), {**params, "kind": kind})


def unschedule(ctx: Context, name: str, key: str) -> Op[bool]:
    queue_ref(name)
    opt.check_text("key", key)
    result = yield Call(queue_sql.delete_schedule(), {"qname": name, "key": key})
    return bool(getattr(result, "rowcount", 0))


def get_schedules(ctx: Context, name: str | None, key: str | None) -> Op[list[ScheduleInfo]]:
    params: dict[str, Any] = {}
    if name is not None:
        params["qname"] = queue_ref(name)
    if key is not None:
        params["key"] = opt.check_text("key", key)
    stmt = ctx.sql.get_schedules(by_name=name is not None, by_key=key is not None)
    result = yield Call(stmt, params)
    return [ScheduleInfo.from_row(r) for r in result.mappings().all()]


class ScheduleReports:
    """What the cron turn reported of each unusable schedule, so that one is logged (and
    at schema 46 written to the warning table) once per change of its row or of its
    problem, not on every pass. A supervisor keeps one across its passes
    (:attr:`~alkstore_sa.ops.frame.PassPlan.reports`); a pass without one reports every
    problem it meets. Each pass's report lists them all either way."""

    def __init__(self) -> None:
        # (queue, key) -> (the row's fingerprint, the problems said of it)
        self._said: dict[tuple[str, str], tuple[int, set[str]]] = {}

    def read(self, rows: Iterable[Any]) -> None:
        """The turn read ``rows`` (every schedule): forget what was said of a schedule
        that is gone or was changed since, so that it is said again should it fail."""
        now = {(r.name, r.key): _fingerprint(r) for r in rows}
        self._said = {k: v for k, v in self._said.items() if now.get(k) == v[0]}

    def first(self, row: Any, problem: str) -> bool:
        """Whether ``problem`` of schedule ``row`` is to be reported (not yet said of the
        row as it is); it counts as said from now on."""
        key, fingerprint = (row.name, row.key), _fingerprint(row)
        said = self._said.get(key)
        if said is None or said[0] != fingerprint:
            said = self._said[key] = (fingerprint, set())
        if problem in said[1]:
            return False
        said[1].add(problem)
        return True


def _fingerprint(row: Any) -> int:
    """What a schedule row says, as one number: another means the row was changed."""
    return hash(
        (row.cron, row.timezone, getattr(row, "kind", None), str(row.data), str(row.options))
    )
