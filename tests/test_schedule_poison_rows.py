"""Poison schedule rows: one stored schedule the timekeeper cannot read or fire
(written by raw SQL, as Node pg-boss or a SQL console could write it) is reported
and skipped, and every other schedule still fires (schema 46 and schema 26)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from support.direct import MINUTE_BEHIND_NOW, in_tx, rows

from alkstore_sa import InvalidOptionsError, QueueService
from alkstore_sa.clock import FakeClock
from alkstore_sa.supervision import Supervisor

ONLY_CRON: dict[str, Any] = {"supervise": False, "bam": False}
DEEP = "repeat('[', 5000) || repeat(']', 5000)"  # PostgreSQL stores it; Python cannot read it
LONG_NUMBER = "'{\"n\": ' || repeat('9', 5000) || '}'"  # past Python's 4,300 digits
# A key that fits the schedule's primary key but, behind the escaped queue name,
# not the send-it job's unique index: random text, which the index cannot compress.
LONG_KEY = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 75))"
LONG_NAME = "q" + "_" * 150


# (what, the row's name, cron, kind, data and options as SQL)
POISON46 = [
    (
        "interval",
        "reports",
        "'FREQ=DAILY;INTERVAL=99999999999999999999'",
        "'rrule'",
        "NULL",
        "'{}'",
    ),
    ("byday", "reports", "'FREQ=MONTHLY;BYDAY=99MO'", "'rrule'", "NULL", "'{}'"),
    ("unsatisfiable", "reports", "'FREQ=DAILY;BYMONTH=2;BYMONTHDAY=30'", "'rrule'", "NULL", "'{}'"),
    (
        "far count",
        "reports",
        "'DTSTART:20000101T000000Z' || chr(10) || 'RRULE:FREQ=SECONDLY;BYSECOND=0;COUNT=2000000'",
        "'rrule'",
        "NULL",
        "'{}'",
    ),
    ("deep data", "reports", "'* * * * *'", "'cron'", f"({DEEP})::jsonb", "'{}'"),
    ("long number in data", "reports", "'* * * * *'", "'cron'", f"({LONG_NUMBER})::jsonb", "'{}'"),
    (
        "long number in options",
        "reports",
        "'* * * * *'",
        "'cron'",
        "NULL",
        f"({LONG_NUMBER})::jsonb",
    ),
    ("bad cron", "reports", "'61 * * * *'", "'cron'", "NULL", "'{}'"),
    ("key past the index", LONG_NAME, "'* * * * *'", "'cron'", "NULL", "'{}'"),
]


@pytest.mark.parametrize(
    ("what", "queue", "cron", "kind", "data", "options"), POISON46, ids=[p[0] for p in POISON46]
)
def test_a_poison_row_is_reported_and_the_other_schedules_fire_at_46(
    engine: Engine,
    schema46: str,
    what: str,
    queue: str,
    cron: str,
    kind: str,
    data: str,
    options: str,
) -> None:
    [(now,)] = rows(engine, schema46, MINUTE_BEHIND_NOW)
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    in_tx(engine, schema46, lambda q: q.create_queue(LONG_NAME))
    in_tx(
        engine, schema46, lambda q: q.schedule("reports", "* * * * *", {"good": True}, key="good")
    )
    key = LONG_KEY if what == "key past the index" else "'bad'"
    rows(
        engine,
        schema46,
        "INSERT INTO {s}.schedule (name, key, cron, timezone, kind, data, options)"
        f" VALUES (:q, {key}, {cron}, 'UTC', {kind}, {data}, {options})",
        q=queue,
    )
    clock = FakeClock(now + dt.timedelta(seconds=1))
    supervisor = Supervisor(
        engine, schema=schema46, clock=clock, persist_warnings=True, **ONLY_CRON
    )
    report = supervisor.run_once(force=True)
    # The good schedule fired and its job was sent; the bad row was reported, once.
    assert report.cron_checked and report.sent == 1, report
    [job] = rows(engine, schema46, "SELECT data FROM {s}.job WHERE name = 'reports'")
    assert job.data == {"good": True}
    bad = [e for e in report.errors if "__good" not in e]
    assert len(bad) == 1 and f"schedule {queue}__" in bad[0], report.errors
    assert not any(e.startswith("cron:") for e in report.errors), report.errors
    warnings = rows(
        engine, schema46, "SELECT message, data FROM {s}.warning WHERE type = 'invalid_schedule'"
    )
    assert len(warnings) == 1 and warnings[0].data["queue"] == queue


def test_a_huge_plain_count_fires_at_46(engine: Engine, schema46: str) -> None:
    # The rule, written by raw SQL: two billion seconds from 2000. It fires.
    [(now,)] = rows(engine, schema46, MINUTE_BEHIND_NOW)
    in_tx(engine, schema46, lambda q: q.create_queue("reports"))
    rows(
        engine,
        schema46,
        "INSERT INTO {s}.schedule (name, key, cron, timezone, kind, data, options)"
        " VALUES ('reports', 'huge', 'DTSTART:20000101T000000Z' || chr(10) ||"
        " 'RRULE:FREQ=SECONDLY;COUNT=2000000000', 'UTC', 'rrule', '{\"huge\": 1}', '{}')",
    )
    clock = FakeClock(now + dt.timedelta(seconds=1))
    report = Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    # Every second of the window, filed into the two minute slots it spans.
    assert report.errors == () and report.sent == 2, report
    jobs = rows(engine, schema46, "SELECT data FROM {s}.job WHERE name = 'reports'")
    assert [j.data for j in jobs] == [{"huge": 1}, {"huge": 1}]


POISON26 = [
    ("deep data", "reports", "'bad'", "'* * * * *'", f"({DEEP})::jsonb", "'{}'"),
    ("long number in data", "reports", "'bad'", "'* * * * *'", f"({LONG_NUMBER})::jsonb", "'{}'"),
    ("long number in options", "reports", "'bad'", "'* * * * *'", "NULL", f"({LONG_NUMBER})::jsonb"),  # noqa: E501
    ("bad cron", "reports", "'bad'", "'61 * * * *'", "NULL", "'{}'"),
    # Its send-it job's key (queue__key) is longer than a job's key may be.
    ("key past the index", LONG_NAME, LONG_KEY, "'* * * * *'", "NULL", "'{}'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "queue", "key", "cron", "data", "options"), POISON26, ids=[p[0] for p in POISON26]
)
def test_a_poison_row_is_reported_and_the_other_schedules_fire_at_26(
    engine: Engine,
    schema: str,
    what: str,
    queue: str,
    key: str,
    cron: str,
    data: str,
    options: str,
) -> None:
    [(now,)] = rows(engine, schema, MINUTE_BEHIND_NOW)
    in_tx(engine, schema, lambda q: q.create_queue("reports"))
    if queue != "reports":
        in_tx(engine, schema, lambda q: q.create_queue(queue))
    in_tx(engine, schema, lambda q: q.schedule("reports", "* * * * *", {"good": True}, key="good"))
    rows(
        engine,
        schema,
        "INSERT INTO {s}.schedule (name, key, cron, timezone, data, options)"
        f" VALUES ('{queue}', {key}, {cron}, 'UTC', {data}, {options})",
    )
    clock = FakeClock(now + dt.timedelta(seconds=1))
    report = Supervisor(engine, schema=schema, clock=clock, supervise=False).run_once(force=True)
    assert report.cron_checked and report.sent == 1, report
    [job] = rows(engine, schema, "SELECT data FROM {s}.job WHERE name = 'reports'")
    assert job.data == {"good": True}
    [error] = report.errors
    assert error.startswith(f"schedule {queue}__"), report.errors


def test_a_schedule_on_a_key_strict_fifo_queue_needs_a_singleton_key(
    engine: Engine, schema46: str
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("ledger", policy="key_strict_fifo"))
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.send("ledger", {"mine": 1}, singleton_key="own")  # the caller's own write
        with pytest.raises(InvalidOptionsError, match="key_strict_fifo") as caught:
            q.schedule("ledger", "* * * * *", {"tick": 1})
        assert caught.value.option == "singleton_key"
        # With a key every job it sends has one: accepted, in the same transaction.
        q.schedule("ledger", "* * * * *", {"tick": 1}, key="k", singleton_key="account-7")
    assert [s.key for s in in_tx(engine, schema46, lambda q: q.get_schedules())] == ["k"]
    # And it does send: the keyed schedule fires into the queue.
    [(now,)] = rows(engine, schema46, MINUTE_BEHIND_NOW)
    clock = FakeClock(now + dt.timedelta(seconds=1))
    report = Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert report.errors == () and report.sent == 1, report
    sent = rows(
        engine, schema46, "SELECT singleton_key FROM {s}.job WHERE name = 'ledger' ORDER BY 1"
    )
    assert [r.singleton_key for r in sent] == ["account-7", "own"]


@pytest.mark.parametrize("version", [26, 46])
def test_a_schedule_row_stamped_at_infinity_is_read_and_fires(
    engine: Engine, request: pytest.FixtureRequest, version: int
) -> None:
    """PostgreSQL stores ``infinity`` in a timestamp; Python has no such datetime, so
    reading the row raised for the whole read: no schedule fired, ``get_schedules``
    failed. The stamp is read as a stand-in, noted in ``unreadable``."""
    name = request.getfixturevalue("schema46" if version == 46 else "schema")
    [(now,)] = rows(engine, name, MINUTE_BEHIND_NOW)
    in_tx(engine, name, lambda q: q.create_queue("reports"))
    for key in ("good", "odd"):

        def add(q: QueueService, k: str = key) -> None:
            q.schedule("reports", "* * * * *", {"k": k}, key=k)

        in_tx(engine, name, add)
    rows(engine, name, "UPDATE {s}.schedule SET updated_on = 'infinity' WHERE key = 'odd'")
    settings = ONLY_CRON if version == 46 else {"supervise": False}
    clock = FakeClock(now + dt.timedelta(seconds=1))
    report = Supervisor(engine, schema=name, clock=clock, **settings).run_once(force=True)
    assert report.errors == () and report.sent == 2, report
    listed = {s.key: s for s in in_tx(engine, name, lambda q: q.get_schedules())}
    assert listed["good"].unreadable == {}
    assert "infinity" in listed["odd"].unreadable["updated_on"]
