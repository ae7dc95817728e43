"""Cron and rrule schedules across the nights the clocks change, in a zone of each
hemisphere (pg-boss 12.38.1's daylight-saving rule, Python supervising).

A :class:`FakeClock` carries a cron-only supervisor across each night, a pass
every 30 seconds; the statements use its time, so the send-it slot each
occurrence took is the (fake) minute it fired in. What is checked:

- fall-back: a local time that happens twice fires at its first instant only;
  an expression naming all 24 hours fires at both, 25 times that day;
- spring-forward: an expression naming all 24 hours fires every real hour, 23
  times that day; a set time in the skipped hour (``30 2 * * *``) fires once, at
  the first minute after the gap; a rule's skipped instance is dropped (RFC 5545).
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine
from support.direct import in_tx, rows

from alkstore_sa import cron
from alkstore_sa.clock import FakeClock
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.supervision import Supervisor

UTC = dt.UTC
YEAR = dt.datetime.now(UTC).year + 1  # fake times ahead of the database clock
ONLY_CRON: dict[str, Any] = {
    "supervise": False,
    "bam": False,
    "cron_monitor_interval": 1,
    "cron_worker_interval": 1,
}
HOUR = dt.timedelta(hours=1)
MINUTE = dt.timedelta(minutes=1)
# (zone, the local hour repeated on the fall-back night, skipped on the spring-forward one)
ZONES = [("America/New_York", 1, 2), ("Europe/Paris", 2, 2), ("Australia/Sydney", 2, 2)]


def transitions(tz: str, year: int = YEAR) -> tuple[dt.datetime, dt.datetime]:
    """``(spring_forward, fall_back)``: the UTC instants ``tz`` changes offset in ``year``."""
    zone = ZoneInfo(tz)
    found: dict[str, dt.datetime] = {}
    t = dt.datetime(year, 1, 1, tzinfo=UTC)
    while t.year == year:
        before, after = t.astimezone(zone).utcoffset(), (t + HOUR).astimezone(zone).utcoffset()
        if before is not None and after is not None and before != after:
            found["spring" if after > before else "fall"] = t + HOUR
        t += HOUR
    return found["spring"], found["fall"]


def local_day(tz: str, instant: dt.datetime) -> tuple[dt.datetime, dt.datetime]:
    """The UTC bounds of the local day ``instant`` falls on in ``tz``."""
    zone = ZoneInfo(tz)
    day = instant.astimezone(zone).date()
    start = dt.datetime(day.year, day.month, day.day, tzinfo=zone)
    return start.astimezone(UTC), (start + dt.timedelta(days=1)).astimezone(UTC)


def schedule_all(engine: Engine, schema: str, tz: str, schedules: dict[str, str]) -> None:
    def setup(q: Any) -> None:
        q.create_queue("dst")
        for key, expr in schedules.items():
            q.schedule("dst", expr, {"key": key}, key=key, tz=tz)

    in_tx(engine, schema, setup)


def sweep(engine: Engine, schema: str, instants: list[dt.datetime]) -> None:
    """One cron-only pass at each instant (fake time), then one to send what is left."""
    clock = FakeClock(instants[0])
    supervisor = Supervisor(engine, schema=schema, clock=clock, **ONLY_CRON)
    for when in [*instants, instants[-1] + dt.timedelta(seconds=5)]:
        clock.set(when)
        supervisor.run_once(force=True)


def every(start: dt.datetime, end: dt.datetime, seconds: int = 30) -> list[dt.datetime]:
    out, t = [], start
    while t <= end:
        out.append(t)
        t += dt.timedelta(seconds=seconds)
    return out


def fired(engine: Engine, schema: str) -> dict[str, list[dt.datetime]]:
    """Per schedule key, the minute slots (UTC) its send-it jobs took."""
    found = rows(
        engine,
        schema,
        "SELECT singleton_key, singleton_on FROM {s}.job WHERE name = :q ORDER BY singleton_on",
        q=SEND_IT_QUEUE,
    )
    out: dict[str, list[dt.datetime]] = {}
    for r in found:
        out.setdefault(r.singleton_key.rsplit("__", 1)[1], []).append(
            r.singleton_on.replace(tzinfo=UTC)
        )
    return out


def delivered(engine: Engine, schema: str) -> Counter[str]:
    """Per schedule key, the jobs sent to the queue (at 26, where the supervisor works
    send-it jobs at fake times), or the send-it jobs carrying its data (at 46, whose
    send-it jobs wait for the database clock to reach their slot)."""
    [(version,)] = rows(engine, schema, "SELECT version FROM {s}.version")
    if int(version) < 46:
        found = rows(engine, schema, "SELECT data FROM {s}.job WHERE name = 'dst'")
        return Counter(r.data["key"] for r in found)
    found = rows(engine, schema, "SELECT data FROM {s}.job WHERE name = :q", q=SEND_IT_QUEUE)
    return Counter(r.data["data"]["key"] for r in found if r.data["name"] == "dst")


def cron_schedules(hour: int) -> dict[str, str]:
    return {
        "daily": f"30 {hour} * * *",
        "hourly": "0 * * * *",
        "allhours": "0 0-23 * * *",
        "minutes": f"*/20 {hour} * * *",
        "sixfield": f"0 30 {hour} * * *",
    }


def rrule_schedules(hour: int) -> dict[str, str]:
    return {
        "rdaily": f"FREQ=DAILY;BYHOUR={hour};BYMINUTE=30;BYSECOND=0",
        "rhourly": "FREQ=HOURLY;BYMINUTE=0;BYSECOND=0",
    }


@pytest.fixture(params=["26", "46"])
def any_schema(request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("schema" if request.param == "26" else "schema46"))


# ------------------------------------------------------------------ the rule itself


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
def test_previous_fire_follows_the_rule_at_every_second_of_the_repeated_hour(
    tz: str, repeated: int, skipped: int
) -> None:
    _, fall = transitions(tz)
    for t in every(fall - HOUR, fall + HOUR, seconds=7):
        daily = cron.previous_fire(f"30 {repeated} * * *", tz, t)
        hourly = cron.previous_fire("0 * * * *", tz, t)
        assert daily is not None and hourly is not None
        # the first 0x:30 only (the day before's until then); the top of every real hour
        first = fall - 30 * MINUTE
        assert daily == (first if t >= first else first - dt.timedelta(days=1))
        assert hourly == t.replace(minute=0, second=0, microsecond=0)


# ------------------------------------------------------------------ cron, fall-back


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
def test_cron_on_the_fall_back_night(
    engine: Engine, any_schema: str, tz: str, repeated: int, skipped: int
) -> None:
    _, fall = transitions(tz)  # local `repeated`:00 happens at fall - 1h and at fall
    schedule_all(engine, any_schema, tz, cron_schedules(repeated))
    sweep(engine, any_schema, every(fall - 70 * MINUTE, fall + 70 * MINUTE))
    got = fired(engine, any_schema)
    assert got["daily"] == [fall - 30 * MINUTE]
    assert got["sixfield"] == [fall - 30 * MINUTE]
    assert got["minutes"] == [fall - 60 * MINUTE, fall - 40 * MINUTE, fall - 20 * MINUTE]
    assert got["hourly"] == [fall - HOUR, fall, fall + HOUR]
    assert got["allhours"] == [fall - HOUR, fall, fall + HOUR]
    assert delivered(engine, any_schema) == {k: len(v) for k, v in got.items()}


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
def test_cron_on_the_spring_forward_night(
    engine: Engine, any_schema: str, tz: str, repeated: int, skipped: int
) -> None:
    spring, _ = transitions(tz)  # local `skipped`:00 to `skipped+1`:00 never happens
    schedule_all(engine, any_schema, tz, cron_schedules(skipped))
    sweep(engine, any_schema, every(spring - 70 * MINUTE, spring + 70 * MINUTE))
    got = fired(engine, any_schema)
    assert got["daily"] == [spring]  # once, at the first minute after the gap
    assert "sixfield" not in got and "minutes" not in got  # no set time: nothing to move
    assert got["hourly"] == [spring - HOUR, spring, spring + HOUR]
    assert got["allhours"] == [spring - HOUR, spring, spring + HOUR]
    assert delivered(engine, any_schema) == {k: len(v) for k, v in got.items()}


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
@pytest.mark.parametrize("night", ["fall", "spring"])
def test_every_hour_fires_each_real_hour_of_the_day(
    engine: Engine, any_schema: str, tz: str, repeated: int, skipped: int, night: str
) -> None:
    spring, fall = transitions(tz)
    start, end = local_day(tz, fall if night == "fall" else spring)
    hours = int((end - start) / HOUR)
    assert hours == (25 if night == "fall" else 23)
    schedules = {"hourly": "0 * * * *", "allhours": "0 0-23 * * *", "daily": "0 12 * * *"}
    schedule_all(engine, any_schema, tz, schedules)
    # two passes at the top of each real hour of the local day, and one half past
    instants = [start + h * HOUR + dt.timedelta(seconds=s) for h in range(hours) for s in (5, 40)]
    sweep(engine, any_schema, sorted([*instants, *(t + 30 * MINUTE for t in instants[::2])]))
    got = fired(engine, any_schema)
    assert got["hourly"] == [start + h * HOUR for h in range(hours)]
    assert got["allhours"] == got["hourly"]
    assert len(got["daily"]) == 1
    assert delivered(engine, any_schema) == {"hourly": hours, "allhours": hours, "daily": 1}


# ------------------------------------------------------------------ rrule (schema 46)


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
def test_rrule_on_the_fall_back_night(
    engine: Engine, schema46: str, tz: str, repeated: int, skipped: int
) -> None:
    # A rule is iterated in local time and a repeated local time is its first
    # instant (RFC 5545), as rrule-temporal in pg-boss 12.38.1 resolves it: the
    # daily rule fires once, and the hourly one once for the repeated hour.
    _, fall = transitions(tz)
    schedule_all(engine, schema46, tz, rrule_schedules(repeated))
    sweep(engine, schema46, every(fall - 70 * MINUTE, fall + 70 * MINUTE))
    got = fired(engine, schema46)
    assert got["rdaily"] == [fall - 30 * MINUTE]
    assert got["rhourly"] == [fall - HOUR, fall + HOUR]
    assert delivered(engine, schema46) == {"rdaily": 1, "rhourly": 2}


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
def test_rrule_on_the_spring_forward_night(
    engine: Engine, schema46: str, tz: str, repeated: int, skipped: int
) -> None:
    # An instance at a local time that does not exist is dropped (RFC 5545), as
    # rrule-temporal drops it; the hourly rule fires every real hour.
    spring, _ = transitions(tz)
    schedule_all(engine, schema46, tz, rrule_schedules(skipped))
    sweep(engine, schema46, every(spring - 70 * MINUTE, spring + 70 * MINUTE))
    got = fired(engine, schema46)
    assert "rdaily" not in got
    assert got["rhourly"] == [spring - HOUR, spring, spring + HOUR]
    assert delivered(engine, schema46) == {"rhourly": 3}


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
def test_missed_once_catches_up_across_the_repeated_hour(
    engine: Engine, schema46: str, tz: str, repeated: int, skipped: int
) -> None:
    # No pass from 20 minutes into the first run of the repeated hour to 20 minutes
    # into the second: the first 0x:30 was missed, and is caught up (a local-time
    # reading at the second 0x:20 would find the day before's, and catch up nothing).
    _, fall = transitions(tz)

    def setup(q: Any) -> None:
        q.create_queue("dst")
        q.schedule(
            "dst", f"30 {repeated} * * *", {"key": "daily"}, key="daily", tz=tz, missed="once"
        )
        q.schedule("dst", "0 * * * *", {"key": "hourly"}, key="hourly", tz=tz, missed="once")

    in_tx(engine, schema46, setup)
    sweep(engine, schema46, [fall - 40 * MINUTE, fall + 20 * MINUTE])
    assert fired(engine, schema46) == {"daily": [fall - 30 * MINUTE], "hourly": [fall]}
