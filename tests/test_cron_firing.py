"""Cron firing: the timekeeper, the send-it queue, time zones and clock skew
(pg-boss's cron scheduling).

A :class:`FakeClock` carries the supervisor across minutes and daylight-saving
changes in a few hundred milliseconds; the statements use its time, and the
send-it job's throttle slot follows it, so the slot a job took shows the
(fake) minute it fired in.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.direct import in_tx, rows

from alkstore_sa import InvalidOptionsError
from alkstore_sa.clock import FakeClock
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.supervision import Supervisor

UTC = dt.UTC
# Fake times lie in the future, ahead of the database clock, like a test that
# moves time forward (the send-it slot then shifts forward too).
YEAR = dt.datetime.now(UTC).year + 1


def last_sunday(month: int) -> dt.date:
    """The European daylight-saving change days: last Sunday of March / October."""
    day = dt.date(YEAR, month + 1, 1) - dt.timedelta(days=1)
    return day - dt.timedelta(days=(day.weekday() + 1) % 7)


def at(day: dt.date, hour: int, minute: int, second: int = 0) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=UTC)


JUNE_1 = dt.date(YEAR, 6, 1)
SPRING = last_sunday(3)
FALL = last_sunday(10)


def db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()  # type: ignore[no-any-return]


def run_window(
    engine: Engine, schema: str, start: dt.datetime, end: dt.datetime, step: float = 31
) -> list[Any]:
    """Run a cron-only supervisor from ``start`` to ``end`` (fake time), a pass per step."""
    clock = FakeClock(start)
    supervisor = Supervisor(engine, schema=schema, clock=clock, supervise=False)
    reports = []
    while clock.now() <= end:
        reports.append(supervisor.run_once())
        clock.advance(step)
    return reports


def fired_slots(engine: Engine, schema: str) -> list[dt.datetime]:
    """The minute slots (UTC) taken by send-it jobs, in order."""
    found = rows(
        engine,
        schema,
        "SELECT singleton_on FROM {s}.job WHERE name = :q ORDER BY singleton_on",
        q=SEND_IT_QUEUE,
    )
    return [r.singleton_on.replace(tzinfo=UTC) for r in found]


def jobs_of(engine: Engine, schema: str, queue: str) -> list[Any]:
    return rows(
        engine, schema, "SELECT * FROM {s}.job WHERE name = :q ORDER BY created_on", q=queue
    )


@pytest.fixture
def queue(engine: Engine, schema: str) -> str:
    in_tx(engine, schema, lambda q: q.create_queue("reports"))
    return "reports"


# ------------------------------------------------------------------ firing


def test_every_minute_schedule_fires_once_in_each_minute(
    engine: Engine, schema: str, queue: str
) -> None:
    in_tx(engine, schema, lambda q: q.schedule(queue, "* * * * *", {"n": 1}))
    start = at(JUNE_1, 12, 0, 5)
    run_window(engine, schema, start, start + dt.timedelta(seconds=280), step=20)
    assert fired_slots(engine, schema) == [start.replace(second=0, minute=m) for m in range(5)]
    assert [j.data for j in jobs_of(engine, schema, queue)] == [{"n": 1}] * 5


def test_schedule_does_not_fire_outside_its_minute(engine: Engine, schema: str, queue: str) -> None:
    in_tx(engine, schema, lambda q: q.schedule(queue, "30 2 * * *"))
    start = at(JUNE_1, 1, 50)
    run_window(engine, schema, start, start + dt.timedelta(minutes=39))
    assert jobs_of(engine, schema, queue) == []


def test_six_field_cron_fires_at_most_once_per_minute(
    engine: Engine, schema: str, queue: str
) -> None:
    in_tx(engine, schema, lambda q: q.schedule(queue, "*/10 * * * * *"))
    start = at(JUNE_1, 12, 0)
    run_window(engine, schema, start, start + dt.timedelta(seconds=119), step=10)
    assert len(jobs_of(engine, schema, queue)) == 2


def test_schedule_in_paris_fires_after_the_gap_on_the_spring_forward_day(
    engine: Engine, schema: str, queue: str
) -> None:
    # 02:00 CET jumps to 03:00 CEST, so 02:30 never happens locally; the run
    # is not lost but made at 03:00 CEST (01:00 UTC), as cron does.
    in_tx(engine, schema, lambda q: q.schedule(queue, "30 2 * * *", tz="Europe/Paris"))
    start = at(SPRING, 0, 20)
    run_window(engine, schema, start, start + dt.timedelta(minutes=80))
    assert fired_slots(engine, schema) == [at(SPRING, 1, 0)]
    assert len(jobs_of(engine, schema, queue)) == 1


def test_schedule_in_paris_fires_once_on_the_fall_back_day(
    engine: Engine, schema: str, queue: str
) -> None:
    # 03:00 CEST falls back to 02:00 CET, so 02:30 happens twice locally
    # (00:30 and 01:30 UTC); the schedule runs once, at the first.
    in_tx(engine, schema, lambda q: q.schedule(queue, "30 2 * * *", tz="Europe/Paris"))
    start = at(FALL, 0, 10)
    run_window(engine, schema, start, start + dt.timedelta(minutes=100))
    assert fired_slots(engine, schema) == [at(FALL, 0, 30)]
    assert len(jobs_of(engine, schema, queue)) == 1


def test_schedule_in_a_time_zone_fires_at_its_local_time(
    engine: Engine, schema: str, queue: str
) -> None:
    in_tx(engine, schema, lambda q: q.schedule(queue, "0 9 * * *", tz="Asia/Tokyo"))
    start = at(JUNE_1, 23, 55)  # 08:55 in Tokyo
    run_window(engine, schema, start, start + dt.timedelta(minutes=10))
    assert fired_slots(engine, schema) == [at(JUNE_1 + dt.timedelta(days=1), 0, 0)]


def test_cron_turn_taken_by_another_instance_is_respected(
    engine: Engine, schema: str, queue: str
) -> None:
    in_tx(engine, schema, lambda q: q.schedule(queue, "* * * * *"))
    start = at(JUNE_1, 12, 0, 5)
    rows(engine, schema, "UPDATE {s}.version SET cron_on = :t", t=start - dt.timedelta(seconds=10))
    [report] = run_window(engine, schema, start, start)
    assert report.cron_checked is False
    assert jobs_of(engine, schema, queue) == []


def test_first_cron_turn_creates_the_send_it_queue(engine: Engine, schema: str) -> None:
    run_window(engine, schema, at(JUNE_1, 0, 0), at(JUNE_1, 0, 0))
    info = in_tx(engine, schema, lambda q: q.get_queue(SEND_IT_QUEUE))
    assert (info.policy, info.partition, info.table_name) == ("standard", False, "job_common")


# ------------------------------------------------------------------ what is sent


def test_scheduled_job_takes_the_schedules_send_options(
    engine: Engine, schema: str, queue: str
) -> None:
    in_tx(
        engine,
        schema,
        lambda q: q.schedule(queue, "* * * * *", {"n": 1}, retry_limit=7, priority=3),
    )
    run_window(engine, schema, at(JUNE_1, 0, 0), at(JUNE_1, 0, 0))
    [job] = jobs_of(engine, schema, queue)
    assert (job.data, job.retry_limit, job.priority) == ({"n": 1}, 7, 3)


def test_schedule_stored_by_node_fires_with_its_options(
    engine: Engine, schema: str, queue: str
) -> None:
    # pg-boss stores all send options under its own names, tz and key included.
    options = '{"tz": "UTC", "key": "nightly", "retryLimit": 4, "expireInSeconds": 77}'
    rows(
        engine,
        schema,
        "INSERT INTO {s}.schedule (name, key, cron, timezone, data, options)"
        " VALUES (:q, 'nightly', '* * * * *', 'UTC', '{\"from\": \"node\"}', CAST(:o AS jsonb))",
        q=queue,
        o=options,
    )
    run_window(engine, schema, at(JUNE_1, 0, 0), at(JUNE_1, 0, 0))
    [job] = jobs_of(engine, schema, queue)
    assert (job.data, job.retry_limit, job.expire_seconds) == ({"from": "node"}, 4, 77)
    [sent] = jobs_of(engine, schema, SEND_IT_QUEUE)
    assert sent.singleton_key == f"{queue}__nightly"


def test_send_it_job_for_a_missing_queue_is_failed_with_the_reason(
    engine: Engine, schema: str
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue(SEND_IT_QUEUE))
    job_id = in_tx(
        engine,
        schema,
        lambda q: q.send(SEND_IT_QUEUE, {"name": "ghost", "data": None}, retry_limit=0),
    )
    report = Supervisor(engine, schema=schema, supervise=False).run_once()
    job = in_tx(engine, schema, lambda q: q.get_job(SEND_IT_QUEUE, job_id))
    assert job.state == "failed" and "ghost" in job.output["message"]
    assert report.sent == 0


def test_send_it_job_is_turned_into_a_job_and_completed_in_one_transaction(
    engine: Engine, schema: str, queue: str
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue(SEND_IT_QUEUE))
    spec = {"name": queue, "data": {"x": 1}, "options": {"priority": 2}}
    job_id = in_tx(engine, schema, lambda q: q.send(SEND_IT_QUEUE, spec))
    report = Supervisor(engine, schema=schema, supervise=False).run_once()
    assert report.sent == 1
    assert in_tx(engine, schema, lambda q: q.get_job(SEND_IT_QUEUE, job_id)).state == "completed"
    [job] = jobs_of(engine, schema, queue)
    assert (job.data, job.priority) == ({"x": 1}, 2)


# ------------------------------------------------------------------ validation and clocks


@pytest.mark.parametrize(
    ("cron", "tz", "option"),
    [
        ("61 * * * *", "UTC", "cron"),
        ("every minute", "UTC", "cron"),
        ("* * * * *", "Mars/Olympus", "tz"),
    ],
)
def test_invalid_cron_or_time_zone_is_rejected_when_scheduled(
    env: Any, cron: str, tz: str, option: str
) -> None:
    env.tx(lambda q: q.create_queue("reports"))
    svc = env.service()
    with pytest.raises(InvalidOptionsError) as caught:
        svc.schedule("reports", cron, tz=tz)
    assert caught.value.option == option
    assert svc.get_schedules() == []
    env.commit()


def test_cron_is_evaluated_at_database_time_corrected_for_clock_skew(
    engine: Engine, schema: str, queue: str
) -> None:
    hour = db_now(engine).astimezone(UTC).hour
    # Due during the database's current hour and the next one, never 3 hours later.
    in_tx(engine, schema, lambda q: q.schedule(queue, f"* {hour},{(hour + 1) % 24} * * *"))
    ahead = FakeClock(db_now(engine) + dt.timedelta(hours=3), drives_database=False)
    report = Supervisor(engine, schema=schema, clock=ahead, supervise=False).run_once()
    assert report.skew_seconds == pytest.approx(-3 * 3600, abs=30)
    assert report.fired == (f"{queue}__",)
