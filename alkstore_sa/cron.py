"""Cron expressions: validation and fire times, with time zones from zoneinfo.

Parsing is done by `cronsim <https://pypi.org/project/cronsim/>`_: maintained,
typed, zoneinfo-aware, with Debian cron's daylight-saving rules, and able to
iterate backwards (which the timekeeper needs for "the last fire time").

Daylight saving, as pg-boss 12.38.1's timekeeper reads it:

- when the clocks go back, a local time that happens twice fires at its first
  instant only, unless the hour field names all 24 hours (``0 * * * *``,
  ``0 0-23 * * *``): that fires at both, every real hour, 25 times that day;
- when the clocks go forward, an expression naming all 24 hours fires every
  real hour (23 times that day); a five-field expression for a set time in the
  skipped hour (``30 2 * * *``) fires once, at the first minute after the gap,
  as Debian cron does. pg-boss 12.38.1's timekeeper sends nothing for it (its
  ``previewSchedule()`` names the time shifted by the gap, 03:30).
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


_MAX_PASSED_OVER = 3600  # second instants a fire time may step back over


def repeats_local_time(instant: dt.datetime, zone: dt.tzinfo) -> bool:
    """Whether ``instant`` shows a local time in ``zone`` that was already shown
    once, before the clocks went back (the second of an ambiguous pair)."""
    local = instant.astimezone(zone)
    return local.fold == 1 and local.replace(fold=0).utcoffset() != local.utcoffset()


def _went_back(now: dt.datetime, zone: dt.tzinfo) -> dt.datetime:
    """The instant the clocks last went back, for a ``now`` in the repeated stretch."""
    local = now.astimezone(zone)
    before, after = local.replace(fold=0).utcoffset(), local.utcoffset()
    if before is None or after is None:
        return now.astimezone(dt.UTC)
    low, high = now.astimezone(dt.UTC) - (before - after), now.astimezone(dt.UTC)
    while high - low > dt.timedelta(seconds=1):
        middle = low + (high - low) / 2
        if middle.astimezone(zone).utcoffset() == after:
            high = middle
        else:
            low = middle
    return high.replace(microsecond=0)


def _latest(expr: str, start: dt.datetime, zone: dt.tzinfo) -> dt.datetime | None:
    """cronsim's latest fire time at or before ``start`` (aware), or ``None``."""
    after = start.astimezone(dt.UTC) + dt.timedelta(microseconds=1)  # real time, not local
    sim = _sim(expr, after.astimezone(zone), reverse=True)
    try:
        return next(sim).astimezone(dt.UTC)
    except StopIteration:
        return None


def previous_fire(expr: str, tz: str, now: dt.datetime) -> dt.datetime | None:
    """The latest fire time at or before ``now`` (aware), in UTC, by the
    daylight-saving rules of the module.

    cronsim, walking backwards, never answers the second instant of a repeated
    local time; an expression naming every hour is owed it, so it is also looked
    for at the fixed UTC offset in force at ``now`` (the repeated hour starts a
    stretch of one offset, so that finds it). Any other expression passes over
    a second instant, should cronsim ever answer one.

    :raises InvalidOptionsError: ``expr`` is not a cron expression (a row
        written past :func:`validate`, by another client).
    """
    zone = timezone(tz)
    local = now.astimezone(zone)
    try:
        every_hour = len(_sim(expr, local).hours) == 24
        fired = _latest(expr, now, zone)
        if repeats_local_time(now, zone):
            # cronsim compares local times, and an hour ago it was later than now.
            before = _latest(expr, _went_back(now, zone) - dt.timedelta(seconds=1), zone)
            if before is not None and (fired is None or before > fired):
                fired = before
        for _ in range(_MAX_PASSED_OVER):
            if fired is None or every_hour or not repeats_local_time(fired, zone):
                break
            fired = _latest(expr, fired - dt.timedelta(seconds=1), zone)
        offset = local.utcoffset()
        if every_hour and offset is not None:
            fixed = _latest(expr, now, dt.timezone(offset))
            if fixed is not None and fixed.astimezone(zone).utcoffset() == offset:
                fired = fixed if fired is None or fixed > fired else fired
    except (CronSimError, ValueError) as exc:
        raise InvalidOptionsError(
            "cron", f"{shown(expr)} is not a valid cron expression: {exc}"
        ) from None
    return None if fired is None else fired.astimezone(dt.UTC)
