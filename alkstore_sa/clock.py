"""Clocks for the supervisor: the real one, and one that tests move by hand.

The supervisor reads time in two places: its own timers (when is the next cron
check due?) and the SQL it runs (has this job's lease run out?). A clock answers
both: :meth:`Clock.now` is the local time, :meth:`Clock.database_now` the time
the supervisor's statements should take as "now" instead of the database's
``now()`` (``None`` = let the database decide, which is what production does).

>>> clock = FakeClock(dt.datetime(2025, 3, 30, 0, 59, 30, tzinfo=dt.UTC))
>>> supervisor = Supervisor(engine, clock=clock)           # doctest: +SKIP
>>> _ = clock.advance(3600)   # an hour passes, in no time at all
>>> clock.now().isoformat()
'2025-03-30T01:59:30+00:00'
"""

from __future__ import annotations

import datetime as dt
import threading
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """What the supervisor needs to know about time."""

    def now(self) -> dt.datetime:
        """The current local time, timezone-aware."""
        ...

    def database_now(self) -> dt.datetime | None:
        """The time statements use instead of the database's ``now()``, or ``None``."""
        ...


class SystemClock:
    """Wall-clock time; statements use the database clock."""

    def now(self) -> dt.datetime:
        """The current time, in UTC."""
        return dt.datetime.now(dt.UTC)

    def database_now(self) -> dt.datetime | None:
        """``None``: statements use the database's own ``now()``."""
        return None


class FakeClock:
    """A clock that only moves when told to, for tests.

    :param start: the initial time (aware); default: the current time.
    :param drives_database: when true (the default) the supervisor's statements
        use this clock's time instead of the database's ``now()``, so expiry,
        retention, throttles and cron all follow it. When false it only plays a
        local clock that is off from the database (to exercise skew correction).
    """

    def __init__(self, start: dt.datetime | None = None, *, drives_database: bool = True) -> None:
        if start is not None and start.tzinfo is None:
            raise ValueError("FakeClock needs a timezone-aware start time")
        self._now = (start or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
        self._lock = threading.Lock()
        self.drives_database = drives_database

    def now(self) -> dt.datetime:
        """The clock's time, as set and advanced."""
        with self._lock:
            return self._now

    def database_now(self) -> dt.datetime | None:
        """The clock's time when it ``drives_database``, else ``None``."""
        return self.now() if self.drives_database else None

    def advance(self, seconds: float | dt.timedelta) -> dt.datetime:
        """Move the clock forward (or back, with a negative amount); returns the new time."""
        step = seconds if isinstance(seconds, dt.timedelta) else dt.timedelta(seconds=seconds)
        with self._lock:
            self._now += step
            return self._now

    def set(self, when: dt.datetime) -> None:
        """Jump to ``when`` (aware)."""
        if when.tzinfo is None:
            raise ValueError("FakeClock.set needs a timezone-aware time")
        with self._lock:
            self._now = when.astimezone(dt.UTC)
