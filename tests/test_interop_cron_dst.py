"""Interop, cron and rrule across the nights the clocks change, in a zone of each
hemisphere: at schema 46 Node pg-boss supervising, Python, and both; at 26 what
pg-boss 11.1.2's timekeeper reads (it has no fake clock, and runs on real time).

Node runs on pg-boss's own ``TestClock`` (its statements read the fake time
through ``job_now()``, its timers fire as the clock is ticked); Python on a
:class:`FakeClock` set to the same instants. What each timekeeper reads at a
given instant is also compared directly, over every half minute of each night:
Node's reading comes from its timekeeper's own ``readOccurrences``.

The installed Node is pg-boss 12.38.0, which sends a repeated local time twice
when the clocks go back (``30 1 * * *`` in America/New_York fires at 01:30 EDT
and 01:30 EST); 12.38.1 sends it once, at the first, as we do. Where 12.38.0
differs, the tests say so and check that it still does; they expect the fixed
behaviour from a later pg-boss.
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import schema46_by, sql
from support.node import (
    INTEROP_DIR,
    in_tx,
    node46,
    node46_modules,
    node_modules,
    node_url,
    py_engine,
    run_node46,
)
from test_cron_dst import HOUR, MINUTE, ZONES, every, fired, local_day, transitions

from alkstore_sa.clock import FakeClock
from alkstore_sa.cron import previous_fire
from alkstore_sa.ops.occurrences import _due, slot_of
from alkstore_sa.supervision import Supervisor

__all__ = ["node46", "node46_modules", "node_modules", "node_url", "py_engine", "schema46_by"]

pytestmark = pytest.mark.interop


def fixed() -> bool:
    """Whether the installed pg-boss sends a repeated local time once (12.38.1 on). Read
    when a test runs, after its fixtures installed Node's modules: reading it at import
    would fail the collection of the whole suite on a machine without them."""
    package = Path(__file__).parent / "interop46/node_modules/pg-boss/package.json"
    version = json.loads(package.read_text())["version"]
    return tuple(int(p) for p in version.split(".")) >= (12, 38, 1)


STEP = 30  # seconds between passes, pg-boss's default cron interval
NODE_CRON: dict[str, Any] = {
    "schedule": True,
    "migrate": False,
    "cronMonitorIntervalSeconds": STEP,
    "cronWorkerIntervalSeconds": 5,
}
PY_CRON: dict[str, Any] = {
    "supervise": False,
    "bam": False,
    "cron_monitor_interval": 1,
    "cron_worker_interval": 1,
}


def schedules(hour: int) -> dict[str, tuple[str, str]]:
    """key: (kind, expression); ``hour`` is the repeated or skipped local hour."""
    return {
        "daily": ("cron", f"30 {hour} * * *"),
        "hourly": ("cron", "0 * * * *"),
        "allhours": ("cron", "0 0-23 * * *"),
        "minutes": ("cron", f"*/20 {hour} * * *"),
        "sixfield": ("cron", f"0 30 {hour} * * *"),
        "rdaily": ("rrule", f"FREQ=DAILY;BYHOUR={hour};BYMINUTE=30;BYSECOND=0"),
        "rhourly": ("rrule", "FREQ=HOURLY;BYMINUTE=0;BYSECOND=0"),
    }


def fall_back(fall: dt.datetime) -> dict[str, list[dt.datetime]]:
    """What fires in ``fall`` +/- 70 minutes, by pg-boss 12.38.1's rule and ours."""
    return {
        "daily": [fall - 30 * MINUTE],
        "hourly": [fall - HOUR, fall, fall + HOUR],
        "allhours": [fall - HOUR, fall, fall + HOUR],
        "minutes": [fall - 60 * MINUTE, fall - 40 * MINUTE, fall - 20 * MINUTE],
        "sixfield": [fall - 30 * MINUTE],
        "rdaily": [fall - 30 * MINUTE],
        "rhourly": [fall - HOUR, fall + HOUR],
    }


def fall_back_1238_0(fall: dt.datetime) -> dict[str, list[dt.datetime]]:
    """The same, by pg-boss 12.38.0: a repeated local time sent at both instants."""
    out = fall_back(fall)
    out["daily"] = out["sixfield"] = [fall - 30 * MINUTE, fall + 30 * MINUTE]
    out["minutes"] = [fall + m * MINUTE for m in (-60, -40, -20, 0, 20, 40)]
    return out


def spring_forward(spring: dt.datetime, *, python: bool) -> dict[str, list[dt.datetime]]:
    """What fires in ``spring`` +/- 70 minutes: a set time in the skipped hour fires
    at the first minute after the gap in Python, and not at all in pg-boss."""
    out = {
        "hourly": [spring - HOUR, spring, spring + HOUR],
        "allhours": [spring - HOUR, spring, spring + HOUR],
        "rhourly": [spring - HOUR, spring, spring + HOUR],
    }
    if python:
        out["daily"] = [spring]
    return out


def schedule_all(engine: Engine, schema: str, tz: str, hour: int) -> None:
    def setup(q: Any) -> None:
        q.create_queue("dst")
        for key, (_, expr) in schedules(hour).items():
            q.schedule("dst", expr, {"key": key}, key=key, tz=tz)

    in_tx(engine, schema, setup)


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


# ------------------------------------------------------------------ each timekeeper's reading

NODE_READS = """
import Timekeeper from './node_modules/pg-boss/dist/timekeeper.js'
const [cases, start, end, step] = JSON.parse(process.argv[1])
console.log(JSON.stringify(cases.map(([expr, kind, tz]) => {
  const slots = new Set()
  for (let t = Date.parse(start); t <= Date.parse(end); t += step * 1000) {
    for (const o of Timekeeper.prototype.readOccurrences.call(null, expr, kind, tz, t)) {
      slots.add(new Date(Math.floor(o.getTime() / 60000) * 60000).toISOString())
    }
  }
  return [...slots].sort()
})))
"""


def python_reads(expr: str, kind: str, tz: str, instants: list[dt.datetime]) -> list[str]:
    slots = set()
    for at in instants:
        for o in _due(expr, kind, tz, at - MINUTE, at):
            slots.add(iso(slot_of(o).replace(tzinfo=dt.UTC)).replace("Z", ".000Z"))
    return sorted(slots)


def as_isos(expected: dict[str, list[dt.datetime]]) -> dict[str, list[str]]:
    return {k: [iso(t).replace("Z", ".000Z") for t in v] for k, v in expected.items()}


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
@pytest.mark.parametrize("night", ["fall", "spring"])
def test_both_timekeepers_read_the_same_occurrences_across_the_night(
    node46_modules: None, tz: str, repeated: int, skipped: int, night: str
) -> None:
    spring, fall = transitions(tz)
    change = fall if night == "fall" else spring
    table = schedules(repeated if night == "fall" else skipped)
    start, end = change - 70 * MINUTE, change + 70 * MINUTE
    cases = [(expr, kind, tz) for kind, expr in table.values()]
    node = json.loads(
        run_node46(
            "--input-type=module", "-e", NODE_READS, json.dumps([cases, iso(start), iso(end), STEP])
        )
    )
    instants = every(start, end, STEP)
    ours = {key: python_reads(expr, kind, tz, instants) for key, (kind, expr) in table.items()}
    theirs = {key: slots for key, slots in zip(table, node, strict=True) if slots}
    ours = {k: v for k, v in ours.items() if v}
    if night == "fall":
        assert ours == as_isos(fall_back(fall))
        assert theirs == as_isos(fall_back(fall) if fixed() else fall_back_1238_0(fall))
    else:
        assert ours == as_isos(spring_forward(spring, python=True))
        assert theirs == as_isos(spring_forward(spring, python=False))


# pg-boss 11.1.2's timekeeper (schema 26) reads a schedule as due when cron-parser's prev()
# from now, in the schedule's zone, is under 60 seconds ago: the same call, at a given instant.
NODE11_READS = """
const { CronExpressionParser } = require('cron-parser')
const [cases, instants] = JSON.parse(process.argv[1])
console.log(JSON.stringify(cases.map(([expr, tz]) => {
  const due = new Set()
  for (const at of instants) {
    const now = Date.parse(at)
    const options = { tz, strict: false, currentDate: new Date(now) }
    const prev = CronExpressionParser.parse(expr, options).prev()
    if ((now - prev.getTime()) / 1000 < 60) due.add(prev.toISOString())
  }
  return [...due].sort()
})))
"""


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
@pytest.mark.parametrize("night", ["fall", "spring"])
def test_pgboss_11_reads_the_night_as_12_38_0_does(
    node_modules: None, tz: str, repeated: int, skipped: int, night: str
) -> None:
    # At 26 a due schedule is filed in the slot of the pass that found it; what is
    # compared is which occurrences the passes of the night find due.
    spring, fall = transitions(tz)
    change = fall if night == "fall" else spring
    table = {k: e for k, (kind, e) in schedules(repeated if night == "fall" else skipped).items()}
    table = {k: e for k, e in table.items() if not k.startswith("r")}  # no rules at 26
    instants = [
        t + dt.timedelta(seconds=7) for t in every(change - 70 * MINUTE, change + 70 * MINUTE)
    ]
    done = subprocess.run(
        [
            "node",
            "-e",
            NODE11_READS,
            json.dumps([[(e, tz) for e in table.values()], [iso(t) for t in instants]]),
        ],
        cwd=INTEROP_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    theirs = {k: v for k, v in zip(table, json.loads(done.stdout), strict=True) if v}
    ours: dict[str, list[str]] = {}
    for key, expr in table.items():
        due = set()
        for at in instants:
            last = previous_fire(expr, tz, at)
            if last is not None and at - last < MINUTE:
                due.add(iso(last).replace("Z", ".000Z"))
        if due:
            ours[key] = sorted(due)
    if night == "fall":
        assert ours == {k: v for k, v in as_isos(fall_back(fall)).items() if k in table}
        assert theirs == {k: v for k, v in as_isos(fall_back_1238_0(fall)).items() if k in table}
    else:
        assert ours == {
            k: v for k, v in as_isos(spring_forward(spring, python=True)).items() if k in table
        }
        assert theirs == {
            k: v for k, v in as_isos(spring_forward(spring, python=False)).items() if k in table
        }


# ------------------------------------------------------------------ supervising, on fake clocks


def run_night(
    engine: Engine,
    py_engine: Engine,
    schema: str,
    node46: Any,
    start: dt.datetime,
    end: dt.datetime,
    *,
    node: bool,
    python: bool,
    instants: list[dt.datetime] | None = None,
) -> Any:
    """Pass over ``start`` to ``end`` a half minute at a time (or at ``instants``):
    Node's clock ticked to each instant (its timers fire), or a Python pass at it;
    with both, they take turns, Node on the whole minutes and Python on the half
    minutes, so each reads every occurrence and files those due by its own rule."""
    boss = None
    if node:
        boss = node46(schema, clock={"$testClock": iso(start)}, **NODE_CRON)
    clock = FakeClock(start)
    supervisor = Supervisor(py_engine, schema=schema, clock=clock, **PY_CRON)
    for i, at in enumerate(instants or every(start, end, STEP)):
        if boss is not None and (not python or i % 2 == 0):
            boss.call("clockSetTime", {"$date": iso(at - dt.timedelta(seconds=1))})
            boss.call("clockTick", 1000)
        if python and (boss is None or i % 2 == 1):
            # 5 s early: Node's next pass (at a whole minute, less the second its
            # timer fires before) comes a full interval after this one's stamp.
            clock.set(at - dt.timedelta(seconds=5))
            supervisor.run_once(force=True)
    if boss is not None:
        boss.call("clockTick", 10_000)  # the send-it worker takes what is left
        assert boss.errors() == []
    return boss


def sent_to_queue(engine: Engine, schema: str) -> dict[str, int]:
    found = sql(engine, schema, "SELECT data FROM {s}.job WHERE name = 'dst'")
    out: dict[str, int] = {}
    for r in found:
        out[r.data["key"]] = out.get(r.data["key"], 0) + 1
    return out


def union(*sets: dict[str, list[dt.datetime]]) -> dict[str, list[dt.datetime]]:
    out: dict[str, set[dt.datetime]] = {}
    for each in sets:
        for key, slots in each.items():
            out.setdefault(key, set()).update(slots)
    return {key: sorted(slots) for key, slots in out.items()}


WHO = ["node", "python", "both"]


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
@pytest.mark.parametrize("who", WHO)
def test_supervising_the_fall_back_night(
    engine: Engine,
    py_engine: Engine,
    schema46_by: str,
    node46: Any,
    tz: str,
    repeated: int,
    skipped: int,
    who: str,
) -> None:
    # An occurrence is filed once (one send-it job per slot between the two
    # timekeepers); Node 12.38.0 also files the second instant of a repeated local
    # time, which a Python pass passes over.
    schema = schema46_by
    _, fall = transitions(tz)
    schedule_all(engine, schema, tz, repeated)
    start, end = fall - 70 * MINUTE, fall + 70 * MINUTE
    run_night(
        engine, py_engine, schema, node46, start, end, node=who != "python", python=who != "node"
    )
    node_rule = fall_back(fall) if fixed() else fall_back_1238_0(fall)
    expected = {
        "node": node_rule,
        "python": fall_back(fall),
        "both": union(node_rule, fall_back(fall)),
    }
    got = fired(engine, schema)
    assert got == expected[who]
    if who != "python":  # Node's send-it worker ran on its clock: every slot became one job
        assert sent_to_queue(engine, schema) == {k: len(v) for k, v in got.items()}


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
@pytest.mark.parametrize("who", WHO)
def test_supervising_the_spring_forward_night(
    engine: Engine,
    py_engine: Engine,
    schema46_by: str,
    node46: Any,
    tz: str,
    repeated: int,
    skipped: int,
    who: str,
) -> None:
    # Every real hour fires once; a set time in the skipped hour fires at the first
    # minute after the gap from a Python pass, never from Node's.
    schema = schema46_by
    spring, _ = transitions(tz)
    schedule_all(engine, schema, tz, skipped)
    start, end = spring - 70 * MINUTE, spring + 70 * MINUTE
    run_night(
        engine, py_engine, schema, node46, start, end, node=who != "python", python=who != "node"
    )
    got = fired(engine, schema)
    assert got == spring_forward(spring, python=who != "node")
    if who != "python":
        assert sent_to_queue(engine, schema) == {k: len(v) for k, v in got.items()}


@pytest.mark.parametrize(("tz", "repeated", "skipped"), ZONES)
@pytest.mark.parametrize("night", ["fall", "spring"])
@pytest.mark.parametrize("who", WHO)
def test_every_hour_fires_each_real_hour_of_the_day(
    engine: Engine,
    py_engine: Engine,
    schema46_by: str,
    node46: Any,
    tz: str,
    repeated: int,
    skipped: int,
    night: str,
    who: str,
) -> None:
    # Two passes at the top of each real hour of the local day (Node's and Python's
    # when both run): an expression naming every hour fires 25 times on the fall-back
    # day and 23 on the spring-forward one; an hourly rule once per local hour.
    schema = schema46_by
    spring, fall = transitions(tz)
    start, end = local_day(tz, fall if night == "fall" else spring)
    hours = int((end - start) / HOUR)
    schedule_all(engine, schema, tz, repeated if night == "fall" else skipped)
    instants = [start + h * HOUR + dt.timedelta(seconds=s) for h in range(hours) for s in (5, 35)]
    run_night(
        engine, py_engine, schema, node46, start, end,
        node=who != "python", python=who != "node", instants=instants,
    )  # fmt: skip
    got = fired(engine, schema)
    every_hour = [start + h * HOUR for h in range(hours)]
    assert (len(every_hour), got["hourly"], got["allhours"]) == (
        25 if night == "fall" else 23,
        every_hour,
        every_hour,
    )
    # the rule's repeated hour is its first instant only
    repeated_hour = [fall] if night == "fall" else []
    assert got["rhourly"] == [t for t in every_hour if t not in repeated_hour]
    if who != "python":
        sent = sent_to_queue(engine, schema)
        assert (sent["hourly"], sent["allhours"]) == (hours, hours)
