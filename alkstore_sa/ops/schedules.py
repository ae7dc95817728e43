"""Cron schedule storage (firing belongs to the supervisor)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .. import limits
from .. import options as opt
from ..errors import InvalidOptionsError
from ..names import validate_queue
from ..records import ScheduleInfo
from ..sql import queues as queue_sql
from ..sql.v46 import cron as cron46_sql
from ._core import Call, Context, Op
from .queues import require_queue


def validate_cron(cron: object, tz: object) -> tuple[str, str]:
    from ..cron import validate

    return validate(cron, tz)


def schedule(
    ctx: Context, name: str, cron: str, data: Any, key: str, tz: str, options: Mapping[str, Any]
) -> Op[None]:
    validate_queue(name)
    opt.check_text("key", key, max_bytes=limits.MAX_SCHEDULE_KEY_BYTES)
    cron, tz = validate_cron(cron, tz)
    # pg-boss 12.38's catch-up policy lives only in the stored options; it is
    # no send option, so it comes out before those are checked.
    options = dict(options)
    missed = options.pop("missed", None)
    if missed not in (None, "skip", "once"):
        raise InvalidOptionsError("missed", f"must be 'skip' or 'once', not {missed!r}")
    # Validate the send options now, so that a schedule never fires bad jobs.
    opt.send_options(options, version=ctx.version)
    encoded = opt.encode_json("data", data)
    yield from require_queue(ctx, name)
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
    if ctx.version == 46:
        # At 46 the row names its kind; we accept cron expressions only.
        yield Call(cron46_sql.upsert_schedule(), {**params, "kind": "cron"})
        return
    yield Call(queue_sql.upsert_schedule(), params)


def unschedule(ctx: Context, name: str, key: str) -> Op[bool]:
    validate_queue(name)
    opt.check_text("key", key)
    result = yield Call(queue_sql.delete_schedule(), {"qname": name, "key": key})
    return bool(getattr(result, "rowcount", 0))


def get_schedules(ctx: Context, name: str | None, key: str | None) -> Op[list[ScheduleInfo]]:
    params: dict[str, Any] = {}
    if name is not None:
        params["qname"] = validate_queue(name)
    if key is not None:
        params["key"] = opt.check_text("key", key)
    result = yield Call(
        queue_sql.get_schedules(by_name=name is not None, by_key=key is not None), params
    )
    return [ScheduleInfo(**r) for r in result.mappings().all()]
