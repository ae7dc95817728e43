"""RFC 5545 recurrence rules, as pg-boss 12.38 stores them in ``rrule`` schedules.

pg-boss 12.38 accepts two shapes: a bare rule value (``FREQ=DAILY;BYHOUR=9``)
and the ``DTSTART``, ``RRULE``, ``RDATE`` and ``EXDATE`` lines of a calendar
entry. A rule with no ``DTSTART`` recurs from midnight of 1970-01-01 in the
schedule's time zone (so the phase of ``INTERVAL=2`` is the same in every
process); a ``DTSTART`` without ``Z`` or ``TZID`` is read in the schedule's
zone too. Evaluation is by `python-dateutil <https://pypi.org/project/python-dateutil/>`_
(``dateutil.rrule``), which implements RFC 5545's recurrence rules, read as Node's
evaluator (rrule-temporal) reads them where the two differ around daylight-saving
changes: hourly and finer rules recur in elapsed time, a wall time the spring change
skips is no occurrence (RFC 5545 says to ignore it), and an hourly rule sends the hour
the autumn change repeats once.

Times in and out are aware datetimes. An expression that cannot be evaluated
raises :class:`~alkstore_sa.errors.InvalidOptionsError` naming ``cron`` (the
schedule column the expression is stored in), and so does one whose evaluation
takes more than :data:`~alkstore_sa.limits.MAX_RRULE_STEPS` steps or
:data:`~alkstore_sa.limits.MAX_RRULE_SECONDS` seconds (each public method, and
:func:`parse` and :func:`validate`, is one evaluation with a budget of its own).
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from dateutil import rrule as du

from . import limits
from .cron import timezone
from .errors import InvalidOptionsError, shown

T = TypeVar("T")

# An iCalendar property at the head of a line, or a FREQ= part: what pg-boss
# reads as a recurrence rule rather than a cron expression (no cron field
# contains "=", ":" or ";").
_SHAPE = re.compile(r"^[ \t]*[a-z][a-z0-9-]*[;:]|(?:^|[\s;])FREQ=", re.IGNORECASE | re.MULTILINE)
_PROPERTY = re.compile(r"^([a-z][a-z0-9-]*)[;:]", re.IGNORECASE)
_PROPERTIES = ("DTSTART", "RRULE", "RDATE", "EXDATE")
_PARTS = frozenset(
    [
        "FREQ",
        "UNTIL",
        "COUNT",
        "INTERVAL",
        "BYSECOND",
        "BYMINUTE",
        "BYHOUR",
        "BYDAY",
        "BYMONTHDAY",
        "BYYEARDAY",
        "BYWEEKNO",
        "BYMONTH",
        "BYSETPOS",
        "WKST",
    ]
)
_EPOCH = dt.datetime(1970, 1, 1)
# Frequencies whose rules may recur from a later DTSTART of the same phase
# (one period is a fixed span of wall time), and that span.
_PERIODS = {
    "SECONDLY": dt.timedelta(seconds=1),
    "MINUTELY": dt.timedelta(minutes=1),
    "HOURLY": dt.timedelta(hours=1),
    "DAILY": dt.timedelta(days=1),
    "WEEKLY": dt.timedelta(weeks=1),
}
_MAX_STEP_PERIODS = 50_000  # occurrences one backward step of latest() may walk
_FIRST_STEP = dt.timedelta(hours=1)
_MAX_SEARCH_PERIODS = 50_000  # periods sends_after() reads of an hourly or finer rule


_WALL_LIMITS = frozenset({"BYHOUR", "BYMINUTE", "BYDAY", "BYMONTHDAY", "BYMONTH", "BYYEARDAY"})
_WEEKDAYS = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
_REPEAT = dt.timedelta(hours=2)  # longer than any hour a clock repeats


def _exists(instant: dt.datetime) -> bool:
    """Does ``instant``'s wall time exist in its zone? A time a spring change skips
    is no occurrence (RFC 5545 3.3.10: such instances are ignored)."""
    there = instant.astimezone(dt.UTC).astimezone(instant.tzinfo)
    return there.replace(tzinfo=None) == instant.replace(tzinfo=None)


def is_rrule(expression: str) -> bool:
    """Would pg-boss read ``expression`` as an RFC 5545 recurrence rule (``kind = 'rrule'``)?"""
    return bool(_SHAPE.search(expression))


def _bad(message: str) -> InvalidOptionsError:
    # A lone surrogate in the expression is shown escaped: the message must be
    # printable and storable (it is logged, and written into the warning table).
    text = message.encode("utf-8", "backslashreplace").decode("utf-8")
    return InvalidOptionsError("cron", f"rrule expression: {text}")


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _evaluating(work: Callable[[_Budget], T]) -> T:
    """``work`` with a budget of its own; any failure of the evaluator (python-dateutil
    raises ``OverflowError``, ``IndexError``, ``ValueError`` on values it cannot
    take) comes out as :class:`~alkstore_sa.errors.InvalidOptionsError`."""
    try:
        return work(_Budget())
    except InvalidOptionsError:
        raise
    except Exception as exc:  # every failure of one rule is that rule's
        raise _bad(f"cannot be evaluated: {_reason(exc)}") from None


class _Budget:
    """What one evaluation may still spend: steps (:data:`~alkstore_sa.limits.MAX_RRULE_STEPS`)
    and CPU time of the evaluating thread (:data:`~alkstore_sa.limits.MAX_RRULE_SECONDS`)."""

    __slots__ = ("deadline", "look_at", "steps")

    def __init__(self) -> None:
        self.steps = 0
        self.look_at = 256  # the time is read every 256 steps
        # The thread's CPU time, not the wall clock: a loaded machine (other
        # processes, other threads) must not refuse a rule that is fine.
        self.deadline = time.thread_time() + limits.MAX_RRULE_SECONDS

    def tick(self, steps: int = 1) -> None:
        self.steps += steps
        if self.steps > limits.MAX_RRULE_STEPS:
            raise _bad(
                f"takes more than {limits.MAX_RRULE_STEPS:,} steps to evaluate (a COUNT far"
                " from its DTSTART, or parts that few or no dates satisfy)"
            )
        if self.steps >= self.look_at:
            self.look_at = self.steps + 256
            if time.thread_time() > self.deadline:
                raise _bad(
                    f"takes more than {limits.MAX_RRULE_SECONDS:g} s to evaluate (a COUNT far"
                    " from its DTSTART, or parts that few or no dates satisfy)"
                )


def _counted_iter() -> Any:
    """python-dateutil's rule iterator, charging the rule's budget a step for each
    day of each period it walks (a rule no date satisfies walks periods to the
    year 9999 without yielding one). A copy of the iterator whose period helper is ours; ``None``
    when the installed python-dateutil is not shaped so (then only the
    occurrences read are counted)."""
    base: Any = getattr(du.rrule, "_iter", None)
    info: Any = getattr(du, "_iterinfo", None)
    sets = ("ydayset", "mdayset", "wdayset", "ddayset")
    if base is None or info is None or "_iterinfo" not in base.__code__.co_names:
        return None
    if not all(callable(getattr(info, name, None)) for name in sets):
        return None

    def counting(name: str) -> Any:
        inner = getattr(info, name)

        def counted(self: Any, year: int, month: int, day: int) -> Any:
            days, first, last = inner(self, year, month, day)
            self.rrule._alkstore_budget.tick(max(1, last - first))
            return days, first, last

        return counted

    counted_info = type("_CountedInfo", (info,), {n: counting(n) for n in sets})
    scope = {**vars(du), "_iterinfo": counted_info}
    return types.FunctionType(
        base.__code__, scope, base.__name__, base.__defaults__, base.__closure__
    )


_COUNTED_ITER = _counted_iter()


def _walk(
    rules: Iterable[dt.datetime], budget: _Budget, since: dt.datetime, until: dt.datetime | None
) -> list[dt.datetime]:
    """The occurrences of ``rules`` in ``[since, until]`` (to the end when ``until``
    is None), one step of ``budget`` each read."""
    found = []
    for when in rules:
        budget.tick()
        if until is not None and when > until:
            break
        if when >= since:
            found.append(when)
    return found


def _instant(value: str, params: dict[str, str], zone: dt.tzinfo, what: str) -> dt.datetime:
    """An iCalendar DATE or DATE-TIME as an aware datetime (floating: in ``zone``)."""
    text = value.strip()
    try:
        if "T" in text.upper():
            utc = text.upper().endswith("Z")
            naive = dt.datetime.strptime(text.upper().rstrip("Z"), "%Y%m%dT%H%M%S")
        else:
            utc = False
            naive = dt.datetime.strptime(text, "%Y%m%d")
    except ValueError:
        raise _bad(f"{what} {shown(value)} is not an iCalendar date or date-time") from None
    if utc:
        return naive.replace(tzinfo=dt.UTC)
    if "TZID" in params:
        return naive.replace(tzinfo=timezone(params["TZID"]))
    return naive.replace(tzinfo=zone)


@dataclass(frozen=True, slots=True)
class Rule:
    """A parsed recurrence: rule parts, its start, and its extra and excluded dates."""

    parts: tuple[tuple[str, str], ...]
    start: dt.datetime
    rdates: tuple[dt.datetime, ...]
    exdates: tuple[dt.datetime, ...]

    def _value(self, name: str) -> str | None:
        return next((v for k, v in self.parts if k == name), None)

    @property
    def _exact(self) -> bool:
        # Hours, minutes and seconds recur in elapsed time, as rrule-temporal
        # (Node's evaluator) reads them: INTERVAL=2 keeps its phase across a
        # daylight-saving change. The parts that name wall-clock fields then
        # filter each instant read in the rule's zone. Rules this cannot express
        # recur in wall time.
        return (
            self._value("FREQ") in ("SECONDLY", "MINUTELY", "HOURLY")
            and self._value("COUNT") is None
            and self._value("BYSETPOS") is None
            and self._value("BYWEEKNO") is None
        )

    @property
    def _limits(self) -> frozenset[str]:
        # Hourly, BYMINUTE spreads each hour's occurrence over minutes (the same
        # minutes in UTC as on the wall); otherwise it only filters, as the rest.
        if self._value("FREQ") == "HOURLY":
            return _WALL_LIMITS - {"BYMINUTE"}
        return _WALL_LIMITS

    def _wall_match(self, instant: dt.datetime) -> bool:
        """Do the parts naming wall-clock fields hold for ``instant`` in the rule's zone?"""
        local = instant.astimezone(self.start.tzinfo)
        limits = self._limits
        for key, value in self.parts:
            if key not in limits:
                continue
            if key == "BYDAY":
                days = {v.strip()[-2:].upper() for v in value.split(",")}
                if _WEEKDAYS[local.weekday()] not in days:
                    return False
                continue
            wanted = {int(v) for v in value.split(",")}
            if key == "BYMONTHDAY":
                last = calendar.monthrange(local.year, local.month)[1]
                wanted = {d if d > 0 else last + 1 + d for d in wanted}
            elif key == "BYYEARDAY":
                last = 366 if calendar.isleap(local.year) else 365
                wanted = {d if d > 0 else last + 1 + d for d in wanted}
            field = {
                "BYHOUR": local.hour,
                "BYMINUTE": local.minute,
                "BYMONTH": local.month,
                "BYMONTHDAY": local.day,
                "BYYEARDAY": local.timetuple().tm_yday,
            }[key]
            if field not in wanted:
                return False
        return True

    @property
    def _plain_count(self) -> bool:
        # A COUNT rule of one fixed span and no BY... part has one occurrence per
        # period, each in turn: its n-th occurrence is known without walking to it.
        return (
            self._value("COUNT") is not None
            and self._value("FREQ") in _PERIODS
            and all(k in ("FREQ", "INTERVAL", "COUNT", "WKST") for k, _ in self.parts)
        )

    def _span(self) -> dt.timedelta:
        return _PERIODS[self._value("FREQ") or ""] * int(self._value("INTERVAL") or "1")

    def _build(self, near: dt.datetime | None, budget: _Budget) -> du.rruleset:
        start = self.start
        parts = self.parts
        if self._exact:
            # Elapsed time, on the start's own UTC offset: minutes and seconds
            # still name the wall clock's in a zone offset by a fraction of an hour.
            start = start.astimezone(dt.timezone(start.utcoffset() or dt.timedelta()))
            parts = tuple((k, v) for k, v in parts if k not in self._limits)
        period = _PERIODS.get(self._value("FREQ") or "")
        count = self._value("COUNT")
        if near is not None and period is not None and (count is None or self._plain_count):
            # Recur from the last start of the same phase before ``near``: the
            # occurrences after it are the same, without walking from 1970 (or,
            # for a plain COUNT, from DTSTART: the periods skipped are counted off).
            span = self._span()
            zone = start.tzinfo
            wall = start.replace(tzinfo=None)
            steps = (near.astimezone(zone).replace(tzinfo=None) - wall) // span - 1
            if count is not None:
                steps = min(steps, int(count) - 1)
                parts = tuple(
                    (k, str(int(count) - max(steps, 0)) if k == "COUNT" else v) for k, v in parts
                )
            if steps > 0:
                start = (wall + span * steps).replace(tzinfo=zone)
        body = ";".join(f"{k}={v}" for k, v in parts)
        try:
            rule: Any = du.rrulestr(body, dtstart=start)
        except Exception as exc:  # dateutil: ValueError, OverflowError, IndexError...
            raise _bad(f"{shown(body)} cannot be evaluated: {_reason(exc)}") from None
        if _COUNTED_ITER is not None:
            rule._alkstore_budget = budget
            rule._iter = types.MethodType(_COUNTED_ITER, rule)
        rules = du.rruleset()
        rules.rrule(rule)
        for when in self.rdates:
            rules.rdate(when)
        for when in self.exdates:
            rules.exdate(when)
        return rules

    def between(self, after: dt.datetime, until: dt.datetime) -> list[dt.datetime]:
        """Every occurrence in ``(after, until]``, in order."""
        return _evaluating(lambda budget: self._between(after, until, budget))

    def _between(
        self, after: dt.datetime, until: dt.datetime, budget: _Budget
    ) -> list[dt.datetime]:
        exact = self._exact
        hourly = exact and self._value("FREQ") == "HOURLY"
        # Hourly, an hour the clock repeats is not sent twice: an instant whose
        # wall time an earlier occurrence had is left out (rrule-temporal's
        # reading), so the window is read from far enough back to know.
        since = after - _REPEAT if hourly else after
        found = [
            o
            for o in _walk(self._build(since, budget), budget, since, until)
            if o > since and _exists(o) and (not exact or o in self.rdates or self._wall_match(o))
        ]
        if hourly:
            seen: set[dt.datetime] = set()
            kept = []
            for o in found:
                wall = o.astimezone(self.start.tzinfo).replace(tzinfo=None)
                if wall not in seen:
                    kept.append(o)
                seen.add(wall)
            found = kept
        return [o for o in found if o > after]

    def sends_after(self, after: dt.datetime) -> bool:
        """Has the rule an occurrence after ``after``? ``False`` for a spent
        ``COUNT``, a passed ``UNTIL``, or parts no date satisfies.

        Reads forward in windows that grow fourfold from an hour, up to the
        rule's own end (or 400 years on, for a rule that never ends). Hourly and
        finer rules, whose wall-clock parts are a filter, are read for at most
        :data:`_MAX_SEARCH_PERIODS` periods: past that the answer is ``True``
        (the timekeeper reports a row it cannot fire).
        """
        found, cut = _evaluating(lambda budget: self._first_after(after, budget))
        return found is not None or cut

    def next_after(self, after: dt.datetime) -> dt.datetime | None:
        """The first occurrence after ``after``, or ``None`` when there is none
        (or none within the search :meth:`sends_after` describes)."""
        return _evaluating(lambda budget: self._first_after(after, budget))[0]

    def _first_after(self, after: dt.datetime, budget: _Budget) -> tuple[dt.datetime | None, bool]:
        """The first occurrence after ``after``, and whether the search was cut
        short by its budget (see :meth:`sends_after`)."""
        horizon = after + dt.timedelta(days=366 * 400)
        end = self._end(budget)
        if end is not None:
            horizon = min(horizon, end)
        later = [d for d in self.rdates if d > after]
        horizon = max([horizon, *later])
        period = _PERIODS.get(self._value("FREQ") or "")
        cut = False
        if self._exact and period is not None:
            farthest = after + period * int(self._value("INTERVAL") or "1") * _MAX_SEARCH_PERIODS
            if farthest < horizon:
                horizon, cut = farthest, True
        width, lower = _FIRST_STEP, after
        while lower < horizon:
            upper = min(horizon, lower + width)
            found = self._between(lower, upper, budget)
            if found:
                return found[0], False
            lower = upper
            width *= 4
        if cut and later:
            return min(later), False
        return None, cut

    def _end(self, budget: _Budget) -> dt.datetime | None:
        """The last instant the rule part can recur at (``UNTIL``, or the
        ``COUNT``-th occurrence), or ``None`` for a rule that never ends."""
        until = self._value("UNTIL")
        if until is not None:
            params: dict[str, str] = {}
            return _instant(until, params, dt.UTC, "UNTIL")
        count = self._value("COUNT")
        if count is not None and self._plain_count:
            # One occurrence a period: the last is the count-th, in wall time.
            wall = self.start.replace(tzinfo=None)
            try:
                return (wall + self._span() * (int(count) - 1)).replace(tzinfo=self.start.tzinfo)
            except OverflowError:
                return None  # past the year 9999: as good as never ending
        if count is not None:
            found = _walk(self._build(None, budget), budget, self.start, None)
            return found[-1] if found else None
        return None

    def latest(self, after: dt.datetime, until: dt.datetime) -> dt.datetime | None:
        """The most recent occurrence in ``(after, until]``, or ``None``.

        Read backwards from ``until`` in steps that grow fourfold from an hour
        (capped so that one step walks a bounded number of periods), so a long
        gap costs what it takes to find the occurrence, not the gap's length.
        """
        return _evaluating(lambda budget: self._latest(after, until, budget))

    def _latest(
        self, after: dt.datetime, until: dt.datetime, budget: _Budget
    ) -> dt.datetime | None:
        period = _PERIODS.get(self._value("FREQ") or "")
        cap = None
        if period is not None:
            cap = period * int(self._value("INTERVAL") or "1") * _MAX_STEP_PERIODS
        width, upper = _FIRST_STEP, until
        while upper > after:
            lower = max(after, upper - width)
            found = self._between(lower, upper, budget)
            if found:
                return found[-1]
            upper = lower
            width = width * 4 if cap is None else min(width * 4, max(cap, _FIRST_STEP))
        return None


def _check_ranges(parts: list[tuple[str, str]]) -> None:
    """Every numeric part's values in range, named in the error (pg-boss refuses
    a value its evaluator would drop)."""
    for key, value in parts:
        bounds = _RANGES.get(key)
        if bounds is None:
            continue
        low, high, signed = bounds
        for item in value.split(","):
            text = item.strip()
            number = text[1:] if signed and text[:1] in "+-" else text
            if not number.isdigit() or not low <= int(number) <= high:
                raise _bad(f"{key}={value}: {shown(text)} is out of range")


def parse(expression: str, tz: str) -> Rule:
    """Read ``expression`` (a rule value or calendar lines) in the zone ``tz``."""
    return _evaluating(lambda budget: _parse(expression, tz, budget))


def _parse(expression: str, tz: str, budget: _Budget) -> Rule:
    zone = timezone(tz)
    unfolded = re.sub(r"\r?\n[ \t]", "", expression)
    start: dt.datetime | None = None
    rule: str | None = None
    rdates: list[dt.datetime] = []
    exdates: list[dt.datetime] = []
    for line in unfolded.splitlines():
        params: dict[str, str] = {}
        text = line.strip()
        if not text:
            continue
        match = _PROPERTY.match(text)
        if match is None:
            name, value = "RRULE", text
        else:
            head, _, value = text.partition(":")
            name, *raw = head.split(";")
            name = name.upper()
            for item in raw:
                key, _, val = item.partition("=")
                params[key.upper()] = val
        if name not in _PROPERTIES:
            raise _bad(f"unsupported property {shown(name)} (supported: {', '.join(_PROPERTIES)})")
        if name == "DTSTART":
            if start is not None:
                raise _bad("more than one DTSTART")
            start = _instant(value, params, zone, "DTSTART")
        elif name == "RRULE":
            if rule is not None:
                raise _bad("more than one RRULE")
            rule = value
        else:
            if params.get("VALUE", "").upper() == "PERIOD":
                raise _bad(f"{name} periods are not supported")
            into = rdates if name == "RDATE" else exdates
            into += [_instant(v, params, zone, name) for v in value.split(",") if v.strip()]
    if rule is None:
        raise _bad("no RRULE to recur on")
    parts: list[tuple[str, str]] = []
    for part in rule.split(";"):
        if not part:
            continue
        key, _, value = part.partition("=")
        key = key.upper()
        if not value:
            raise _bad(f"part {shown(part)} has no value")
        if key.startswith("X-"):
            continue  # extensions: no evaluator reads them
        if key not in _PARTS:
            raise _bad(f"unsupported part {shown(part)}")
        if any(k == key for k, _ in parts):
            raise _bad(f"more than one {key} part")
        if key == "UNTIL" and not value.upper().endswith("Z"):
            # A floating UNTIL is wall time in the rule's zone; dateutil wants UTC.
            until = _instant(value, {}, (start or _EPOCH.replace(tzinfo=zone)).tzinfo or zone, key)
            value = until.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        parts.append((key, value))
    if start is None:
        if any(k == "COUNT" for k, _ in parts):
            raise _bad("COUNT counts occurrences from DTSTART, so it needs a DTSTART of its own")
        start = _EPOCH.replace(tzinfo=zone)
    _check_ranges(parts)
    for key, value in parts:
        # A zero or negative step would never advance (python-dateutil loops on
        # INTERVAL=0): refused here, so a row written by raw SQL is reported as
        # invalid when fired instead of stalling the timekeeper.
        if key in ("INTERVAL", "COUNT") and (not value.isdigit() or int(value) < 1):
            raise _bad(f"{key}={value} must be a positive whole number")
    parsed = Rule(tuple(parts), start, tuple(rdates), tuple(exdates))
    parsed._build(None, budget)  # the rule parts themselves, checked now
    return parsed


# Numeric parts: lowest and highest value, and whether a negative one counts from the end.
_RANGES = {
    "BYSECOND": (0, 60, False),
    "BYMINUTE": (0, 59, False),
    "BYHOUR": (0, 23, False),
    "BYMONTH": (1, 12, False),
    "BYMONTHDAY": (1, 31, True),
    "BYYEARDAY": (1, 366, True),
    "BYWEEKNO": (1, 53, True),
    "BYSETPOS": (1, 366, True),
}
# A numbered BYDAY (1MO, -1FR): RFC 5545 3.3.10 allows it only monthly or yearly,
# and pg-boss 12.38 refuses it otherwise (its evaluator's strict mode).
_ORDINAL_DAY = re.compile(r"^[+-]?\d+[A-Z]{2}$")
# How many of one weekday a month or a year has at most (RFC 5545: 1 to 53).
_MAX_ORDINAL = {"MONTHLY": 5, "YEARLY": 53}


def validate(expression: object, tz: object) -> tuple[str, str]:
    """Check a recurrence rule and its time zone as pg-boss 12.38's ``schedule()``
    does, before a schedule stores it: every part readable with a value in range,
    no combination RFC 5545 forbids, and a known IANA zone.

    Answers ``(expression, tz)``; the expression is stored as given, as pg-boss
    stores it.

    :raises InvalidOptionsError: naming ``cron`` (the rule) or ``tz``.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidOptionsError("cron", f"must be a non-empty string, not {shown(expression)}")
    # The rule first, in a zone known to be usable, so a caller who got both
    # wrong hears about the rule (pg-boss judges the two in that order).
    parsed = parse(expression, "UTC")
    freq = parsed._value("FREQ")
    if freq is None:
        raise _bad("no FREQ part (every RRULE needs one)")
    interval = parsed._value("INTERVAL")
    if interval is not None and (not interval.isdigit() or int(interval) < 1):
        raise _bad(f"INTERVAL={interval} must be a positive whole number")
    count = parsed._value("COUNT")
    if count is not None and (not count.isdigit() or int(count) < 1):
        raise _bad(f"COUNT={count} must be a positive whole number")
    if freq == "WEEKLY" and parsed._value("BYMONTHDAY") is not None:
        raise _bad("BYMONTHDAY cannot be used with FREQ=WEEKLY (RFC 5545)")
    byday = parsed._value("BYDAY")
    numbered = byday is not None and any(
        _ORDINAL_DAY.match(d.strip().upper()) for d in byday.split(",")
    )
    if numbered and freq not in ("MONTHLY", "YEARLY"):
        raise _bad(f"BYDAY={byday}: a numbered day needs FREQ=MONTHLY or FREQ=YEARLY")
    for day in (d.strip().upper() for d in (byday or "").split(",")):
        if _ORDINAL_DAY.match(day) and not 1 <= abs(int(day[:-2])) <= _MAX_ORDINAL.get(freq, 53):
            raise _bad(f"BYDAY={byday}: {shown(day)} numbers a weekday out of range")
    # Every part at its wall-clock reading too (the elapsed-time reading of
    # hourly and finer rules leaves the wall-clock parts to a filter).
    body = ";".join(f"{k}={v}" for k, v in parsed.parts)
    try:
        du.rrulestr(body, dtstart=parsed.start)
    except Exception as exc:  # dateutil: ValueError, OverflowError...
        raise _bad(f"{shown(body)}: {exc or 'a value out of range'}") from None
    timezone(tz)
    return expression, str(tz)


__all__ = ["Rule", "is_rrule", "parse", "validate"]
