"""Cron expressions: validation and fire times, with time zones from zoneinfo.

Parsing is done by `cronsim <https://pypi.org/project/cronsim/>`_: maintained,
typed, zoneinfo-aware, with Debian cron's daylight-saving rules, and able to
iterate backwards (which the timekeeper needs for "the last fire time").
"""

from __future__ import annotations

import datetime as dt
import zoneinfo

from cronsim import CronSim, CronSimError

from .errors import InvalidOptionsError, shown


def timezone(tz: object) -> zoneinfo.ZoneInfo:
    """The ``ZoneInfo`` for ``tz``, or :class:`InvalidOptionsError`."""
    if not isinstance(tz, str) or not tz:
        raise InvalidOptionsError("tz", f"must be an IANA time zone name, not {shown(tz)}")
    try:
        return zoneinfo.ZoneInfo(tz)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidOptionsError("tz", f"unknown time zone {shown(tz)}") from exc


def validate(cron: object, tz: object) -> tuple[str, str]:
    """Check a cron expression (5 fields, or 6 with seconds first) and a time zone."""
    zone = timezone(tz)
    if not isinstance(cron, str) or not cron.strip():
        raise InvalidOptionsError("cron", f"must be a cron expression, not {shown(cron)}")
    expr = " ".join(cron.split())
    try:
        _sim(expr, dt.datetime.now(zone))
    except (CronSimError, ValueError) as exc:
        raise InvalidOptionsError(
            "cron", f"{shown(cron)} is not a valid cron expression: {exc}"
        ) from None
    return expr, str(tz)


def _sim(expr: str, start: dt.datetime, *, reverse: bool = False) -> CronSim:
    # Six fields put seconds first, in cronsim as in cron-parser (pg-boss).
    return CronSim(expr, start, reverse=reverse)


def previous_fire(expr: str, tz: str, now: dt.datetime) -> dt.datetime | None:
    """The latest fire time at or before ``now`` (aware), in UTC.

    :raises InvalidOptionsError: ``expr`` is not a cron expression (a row
        written past :func:`validate`, by another client).
    """
    zone = timezone(tz)
    local = now.astimezone(zone)
    try:
        fired = next(_sim(expr, local + dt.timedelta(microseconds=1), reverse=True))
    except StopIteration:
        return None
    except (CronSimError, ValueError) as exc:
        raise InvalidOptionsError(
            "cron", f"{shown(expr)} is not a valid cron expression: {exc}"
        ) from None
    return fired.astimezone(dt.UTC)
