"""Recurrence-rule schedules created from Python (schema 46, as pg-boss 12.38's
``schedule()`` with an RFC 5545 rule): stored as Node stores them, read back,
fired by our supervisor, refused when malformed, spent or on schema 26."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from support.direct import MINUTE_BEHIND_NOW, in_tx, rows

from alkstore_sa import InvalidOptionsError, QueueService
from alkstore_sa.clock import FakeClock
from alkstore_sa.errors import SchemaFeatureError
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.supervision import Supervisor

UTC = dt.UTC
YEAR = dt.datetime.now(UTC).year + 1  # fake times ahead of the database clock
ONLY_CRON: dict[str, Any] = {"supervise": False, "bam": False}


def test_a_rule_is_stored_as_node_stores_it_and_read_back(engine: Engine, schema46: str) -> None:
    rule = "DTSTART;TZID=Europe/Paris:20260105T090000\nRRULE:FREQ=WEEKLY;BYDAY=MO,TH"
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    in_tx(
        engine,
        schema46,
        lambda q: q.schedule("reports", rule, {"r": 1}, key="weekly", tz="Europe/Paris"),
    )
    [row] = rows(engine, schema46, "SELECT kind, cron, timezone, options FROM {s}.schedule")
    assert (row.kind, row.cron, row.timezone) == ("rrule", rule, "Europe/Paris")
    assert row.options == {"tz": "Europe/Paris", "key": "weekly"}
    [info] = in_tx(engine, schema46, lambda q: q.get_schedules("reports"))
    assert (info.kind, info.cron, info.key, info.data) == ("rrule", rule, "weekly", {"r": 1})
    assert info.last_job_id is None
    # A cron expression replacing it relabels the row, as pg-boss does.
    in_tx(engine, schema46, lambda q: q.schedule("reports", "0 9 * * 1", key="weekly"))
    [info] = in_tx(engine, schema46, lambda q: q.get_schedules("reports", "weekly"))
    assert (info.kind, info.cron) == ("cron", "0 9 * * 1")


def test_a_rule_scheduled_in_python_fires_through_the_supervisor(
    engine: Engine, schema46: str
) -> None:
    # A daily rule at this minute's wall time in Paris, fired by a supervisor whose
    # clock is the database's (the send-it job then is due at once and is sent).
    [(now,)] = rows(engine, schema46, MINUTE_BEHIND_NOW)
    paris = now.astimezone(ZoneInfo("Europe/Paris"))
    rule = f"FREQ=DAILY;BYHOUR={paris.hour};BYMINUTE={paris.minute};BYSECOND=0"
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    in_tx(engine, schema46, lambda q: q.schedule("reports", rule, {"a": 1}, tz="Europe/Paris"))
    # Just before the occurrence: nothing is due.
    clock = FakeClock(now - dt.timedelta(seconds=30))
    Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert rows(engine, schema46, "SELECT id FROM {s}.job WHERE name = :q", q=SEND_IT_QUEUE) == []
    clock.advance(31)
    report = Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert report.errors == () and report.sent == 1
    [sent] = rows(
        engine, schema46, "SELECT singleton_on FROM {s}.job WHERE name = :q", q=SEND_IT_QUEUE
    )
    assert sent.singleton_on == now.replace(tzinfo=None)
    [job] = rows(engine, schema46, "SELECT id, data FROM {s}.job WHERE name = 'reports'")
    assert job.data == {"a": 1}
    [info] = in_tx(engine, schema46, lambda q: q.get_schedules())
    assert info.last_job_id == job.id


def test_a_stored_rule_that_never_advances_does_not_stall_the_timekeeper(
    engine: Engine, schema46: str
) -> None:
    # INTERVAL=0, written by raw SQL (schedule() refuses it): python-dateutil would
    # loop forever on it. The pass reports it and still fires the good rule.
    [(now,)] = rows(engine, schema46, MINUTE_BEHIND_NOW)
    rule = f"FREQ=DAILY;BYHOUR={now.hour};BYMINUTE={now.minute};BYSECOND=0"
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    in_tx(engine, schema46, lambda q: q.schedule("reports", rule, {"good": True}, key="good"))
    rows(
        engine,
        schema46,
        "INSERT INTO {s}.schedule (name, key, cron, timezone, kind, options)"
        " VALUES ('reports', 'stuck', 'FREQ=DAILY;INTERVAL=0', 'UTC', 'rrule', '{}')",
    )
    clock = FakeClock(now + dt.timedelta(seconds=1))
    report = Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert report.sent == 1
    [job] = rows(engine, schema46, "SELECT data FROM {s}.job WHERE name = 'reports'")
    assert job.data == {"good": True}


@pytest.mark.parametrize(
    ("expression", "tz", "problem"),
    [
        ("FREQ=SOMETIMES", "UTC", "cron"),
        ("FREQ=DAILY;BYHOUR=25", "UTC", "cron"),
        ("FREQ=DAILY;INTERVAL=0", "UTC", "cron"),
        ("FREQ=WEEKLY;BYMONTHDAY=3", "UTC", "cron"),
        ("FREQ=DAILY;BYDAY=1MO", "UTC", "cron"),
        ("FREQ=DAILY;BYHOURS=9", "UTC", "cron"),
        ("FREQ=DAILY;COUNT=3", "UTC", "cron"),  # COUNT needs a DTSTART
        ("FREQ=DAILY;UNTIL=20200101T000000Z", "UTC", "cron"),  # nothing left
        ("DTSTART:20200101T090000Z\nRRULE:FREQ=DAILY;COUNT=3", "UTC", "cron"),  # spent
        ("FREQ=DAILY;BYHOUR=9", "Mars/Olympus", "tz"),
    ],
)
def test_a_bad_rule_is_refused_before_anything_is_written(
    engine: Engine, schema46: str, expression: str, tz: str, problem: str
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.schedule("reports", "0 * * * *", key="kept")
        with pytest.raises(InvalidOptionsError) as caught:
            q.schedule("reports", expression, tz=tz)
        assert caught.value.option == problem
        # The caller's transaction is intact: it goes on and commits.
        q.send("reports", {"after": "refusal"})
    assert [s.key for s in in_tx(engine, schema46, lambda q: q.get_schedules())] == ["kept"]
    assert len(rows(engine, schema46, "SELECT id FROM {s}.job WHERE name = 'reports'")) == 1


def test_a_rule_with_occurrences_left_is_accepted(engine: Engine, schema46: str) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    rule = f"DTSTART:{YEAR}0101T090000Z\nRRULE:FREQ=DAILY;COUNT=2"
    in_tx(engine, schema46, lambda q: q.schedule("reports", rule, key="twice"))
    until = f"FREQ=HOURLY;UNTIL={YEAR + 1}0101T000000Z"
    in_tx(engine, schema46, lambda q: q.schedule("reports", until, key="until"))
    # A spent rule with an extra date still to come sends that date.
    extra = f"DTSTART:20200101T090000Z\nRRULE:FREQ=DAILY;COUNT=1\nRDATE:{YEAR}0101T090000Z"
    in_tx(engine, schema46, lambda q: q.schedule("reports", extra, key="extra"))
    kinds = {s.key: s.kind for s in in_tx(engine, schema46, lambda q: q.get_schedules())}
    assert kinds == {"twice": "rrule", "until": "rrule", "extra": "rrule"}


def test_a_rule_on_schema_26_is_refused_with_the_schema_it_needs(
    engine: Engine, schema: str
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("reports"))
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        with pytest.raises(SchemaFeatureError) as caught:
            q.schedule("reports", "FREQ=DAILY;BYHOUR=9")
        assert (caught.value.needed, caught.value.found) == (46, 26)
        q.schedule("reports", "0 9 * * *")  # the transaction goes on
    [info] = in_tx(engine, schema, lambda q: q.get_schedules())
    assert (info.kind, info.cron, info.last_job_id) == ("cron", "0 9 * * *", None)


def test_cli_schedule_add_takes_a_rule_with_rrule(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, schema46: str
) -> None:
    from alkstore_sa.cli import main

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main([*argv, "--database-url", database_url, "--schema", schema46, "--json"])
        captured = capsys.readouterr()
        return code, captured.out + captured.err

    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    code, out = run("schedule", "add", "reports", "--rrule", "FREQ=DAILY;BYHOUR=9", "--tz", "UTC")
    assert code == 0 and '"rrule"' in out, out
    code, out = run("schedule", "add", "reports", "--key", "x", "--rrule", "0 9 * * *")
    assert code != 0 and "not an RFC 5545 rule" in out
    code, out = run("schedule", "add", "reports", "--key", "y", "--rrule", "FREQ=DAILY;BYHOUR=24")
    assert code != 0 and "BYHOUR" in out
    [info] = in_tx(engine, schema46, lambda q: q.get_schedules())
    assert (info.kind, info.cron) == ("rrule", "FREQ=DAILY;BYHOUR=9")


def test_sync_and_async_services_store_and_read_a_rule(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("reports"))
    env46.tx(lambda q: q.schedule("reports", "FREQ=DAILY;BYHOUR=9", {"n": 1}, tz="Europe/Paris"))
    [info] = env46.tx(lambda q: q.get_schedules("reports"))
    assert (info.kind, info.cron, info.timezone) == ("rrule", "FREQ=DAILY;BYHOUR=9", "Europe/Paris")
    with pytest.raises(InvalidOptionsError, match="no occurrence left"):
        env46.tx(lambda q: q.schedule("reports", "FREQ=DAILY;UNTIL=20200101T000000Z", key="x"))


def test_next_after_finds_the_first_occurrence_without_walking_the_horizon() -> None:
    from alkstore_sa import rrule

    now = dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.UTC)
    # Every second: found at once, not by listing ten years of seconds.
    assert rrule.parse("FREQ=SECONDLY", "UTC").next_after(now) == now + dt.timedelta(seconds=1)
    # 02:30 Berlin does not exist on 2026-03-29 (DST): the next one is a day later.
    daily = rrule.parse("DTSTART;TZID=Europe/Berlin:20260301T023000\nFREQ=DAILY", "Europe/Berlin")
    found = daily.next_after(now)
    assert found == dt.datetime(2026, 3, 30, 2, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    spent = rrule.parse("DTSTART:20200101T000000Z\nFREQ=DAILY;COUNT=2", "UTC")
    assert spent.next_after(now) is None and not spent.sends_after(now)


@pytest.mark.parametrize(
    ("expression", "tz", "option", "words"),
    [
        # Parts no date satisfies: read to the year 9999 without the step budget.
        ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "UTC", "cron", "to evaluate"),
        ("FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30", "UTC", "cron", "to evaluate"),
        # A COUNT with a BY... part, far from its DTSTART: walked, over budget.
        (
            "DTSTART:20000101T000000Z\nRRULE:FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30;COUNT=5",
            "UTC",
            "cron",
            "to evaluate",
        ),
        # python-dateutil's OverflowError and IndexError, as a clear refusal.
        ("FREQ=DAILY;INTERVAL=99999999999999999999", "UTC", "cron", "OverflowError"),
        ("FREQ=MONTHLY;BYDAY=99MO", "UTC", "cron", "out of range"),
        ("FREQ=YEARLY;BYDAY=-54MO", "UTC", "cron", "out of range"),
        ("FREQ=MONTHLY;BYSETPOS=0", "UTC", "cron", "out of range"),
        ("FREQ=MONTHLY;BYMONTHDAY=0", "UTC", "cron", "out of range"),
        # Lone surrogates: text PostgreSQL cannot store, refused before the insert.
        ("FREQ=DAILY;BYHOUR=9\ud800", "UTC", "cron", "surrogate"),
        ("FREQ=DAILY;X-NOTE=\udfff", "UTC", "cron", "surrogate"),
        ("FREQ=DAILY", "Europe/\ud800", "tz", "surrogate"),
    ],
)
def test_a_rule_that_cannot_be_evaluated_is_refused_with_a_clear_error(
    engine: Engine, schema46: str, expression: str, tz: str, option: str, words: str
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.send("reports", {"mine": "before"})  # the caller's own write
        with pytest.raises(InvalidOptionsError) as caught:
            q.schedule("reports", expression, tz=tz)
        assert caught.value.option == option
        assert words in str(caught.value)
        str(caught.value).encode("utf-8")  # printable and storable as it is
    # The transaction was not poisoned: it committed the caller's write, and no schedule.
    [job] = rows(engine, schema46, "SELECT data FROM {s}.job WHERE name = 'reports'")
    assert job.data == {"mine": "before"}
    assert in_tx(engine, schema46, lambda q: q.get_schedules()) == []


def test_a_plain_count_far_from_its_start_is_counted_not_walked(
    engine: Engine, schema46: str
) -> None:
    from alkstore_sa import rrule

    # Two billion seconds from 2000 (to 2063), as the rule: no BY... part,
    # so the occurrence n periods on is known without walking to it.
    huge = "DTSTART:20000101T000000Z\nRRULE:FREQ=SECONDLY;COUNT=2000000000"
    at = dt.datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    rule = rrule.parse(huge, "UTC")
    assert rule.between(at - dt.timedelta(seconds=3), at) == [
        at - dt.timedelta(seconds=2),
        at - dt.timedelta(seconds=1),
        at,
    ]
    assert rule.latest(at - dt.timedelta(days=1), at) == at
    last = dt.datetime(2000, 1, 1, tzinfo=UTC) + dt.timedelta(seconds=2_000_000_000 - 1)
    assert rule.next_after(last - dt.timedelta(seconds=1)) == last
    assert rule.next_after(last) is None
    # The count is still honoured exactly: three hours, the third is the last.
    short = rrule.parse("DTSTART:20200101T000000Z\nRRULE:FREQ=HOURLY;INTERVAL=2;COUNT=3", "UTC")
    assert short.between(dt.datetime(2020, 1, 1, 3, tzinfo=UTC), at) == [
        dt.datetime(2020, 1, 1, 4, tzinfo=UTC)
    ]
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    in_tx(engine, schema46, lambda q: q.schedule("reports", huge, key="huge"))
    [info] = in_tx(engine, schema46, lambda q: q.get_schedules())
    assert (info.key, info.kind) == ("huge", "rrule")


def test_every_entry_point_stops_at_the_step_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from alkstore_sa import limits, rrule

    # The step budget is under test: the time budget ran out first on a loaded
    # machine with the declared floor of python-dateutil.
    monkeypatch.setattr(limits, "MAX_RRULE_SECONDS", 600.0)

    at = dt.datetime(2026, 6, 1, tzinfo=UTC)
    never = rrule.parse("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "UTC")
    calls: list[Callable[[], object]] = [
        lambda: never.between(at - dt.timedelta(minutes=1), at),
        lambda: never.latest(at - dt.timedelta(days=1), at),
        lambda: never.sends_after(at),
        lambda: never.next_after(at),
        # parse and validate read no occurrence: a COUNT rule's end is found later.
        lambda: rrule.parse(
            "DTSTART:20000101T000000Z\nRRULE:FREQ=MINUTELY;BYHOUR=1;COUNT=999999", "UTC"
        ).sends_after(at),
    ]
    for call in calls:
        with pytest.raises(InvalidOptionsError, match="more than 200,000 steps"):
            call()


def test_the_time_budget_counts_the_evaluating_threads_cpu_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_RRULE_SECONDS of CPU time an evaluation is refused; time the thread
    spends not running (here asleep, on a loaded machine waiting for a core) does
    not count."""
    from alkstore_sa import limits, rrule

    at = dt.datetime(2026, 6, 1, tzinfo=UTC)
    never = rrule.parse("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30", "UTC")
    monkeypatch.setattr(limits, "MAX_RRULE_STEPS", 10**9)
    monkeypatch.setattr(limits, "MAX_RRULE_SECONDS", 0.05)
    with pytest.raises(InvalidOptionsError, match=r"more than 0.05 s to evaluate"):
        never.sends_after(at)
    # A rule that is fine, evaluated while its thread sleeps at each step: past 0.05 s
    # of wall time, far below it of CPU time.
    real_tick = rrule._Budget.tick

    def slow_tick(self: object, steps: int = 1) -> None:
        time.sleep(0.1)  # off the CPU, as a thread waiting for a core is
        real_tick(self, max(steps, 256))  # type: ignore[arg-type]  # the time read each tick

    monkeypatch.setattr(rrule._Budget, "tick", slow_tick)
    started = time.monotonic()
    assert rrule.parse("FREQ=DAILY;BYHOUR=9", "UTC").sends_after(at)
    assert time.monotonic() - started > 0.05
