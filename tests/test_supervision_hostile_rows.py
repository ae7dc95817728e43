"""Supervision against rows it did not write: throttle stamps at ±infinity (any
client, Node pg-boss included, may store them), and what its expiry log says.

At both schemas a pass must run the step whose stamp is infinite and leave a finite
time behind; a finite stamp keeps its meaning exactly.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

import pytest
from sqlalchemy import Engine
from support.direct import in_tx, rows

from alkstore_sa.clock import FakeClock
from alkstore_sa.supervision import Supervisor

UTC = dt.UTC

# (fixture, column, the report field that names the queue when the step ran)
STAMPS = [
    ("schema", "monitor_on", "monitored"),
    ("schema", "maintain_on", "maintained"),
    ("schema46", "monitor_on", "monitored"),
    ("schema46", "monitor_claim_on", "monitored"),
    ("schema46", "maintain_on", "maintained"),
]


def db_now(engine: Engine) -> dt.datetime:
    [(now,)] = rows(engine, "public", "SELECT now()")
    assert isinstance(now, dt.datetime)
    return now


@pytest.mark.parametrize("value", ["infinity", "-infinity"])
@pytest.mark.parametrize(("fixture", "column", "step"), STAMPS)
def test_an_infinite_throttle_stamp_is_due_now_and_is_replaced_by_a_finite_time(
    request: pytest.FixtureRequest, engine: Engine, fixture: str, column: str, step: str, value: str
) -> None:
    schema: str = request.getfixturevalue(fixture)
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    rows(
        engine,
        schema,
        f"UPDATE {{s}}.queue SET {column} = CAST(:v AS timestamptz) WHERE name = 'q'",
        v=value,
    )
    before = db_now(engine)

    report = Supervisor(engine, schema=schema).run_once()

    assert report.errors == ()
    assert "q" in getattr(report, step)
    [(stamp, finite)] = rows(
        engine, schema, f"SELECT {column}, isfinite({column}) FROM {{s}}.queue WHERE name = 'q'"
    )
    assert finite is True
    if column == "monitor_claim_on":
        # The claim is the turn's time; monitor_on is written with the counts.
        [(finite,)] = rows(
            engine, schema, "SELECT isfinite(monitor_on) FROM {s}.queue WHERE name = 'q'"
        )
        assert finite is True
    assert before - dt.timedelta(seconds=5) <= stamp <= db_now(engine) + dt.timedelta(seconds=5)


@pytest.mark.parametrize(("fixture", "column", "step"), STAMPS)
def test_a_finite_stamp_far_ahead_still_means_not_due(
    request: pytest.FixtureRequest, engine: Engine, fixture: str, column: str, step: str
) -> None:
    schema: str = request.getfixturevalue(fixture)
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    ahead = "9999-01-01 00:00:00+00"
    rows(
        engine,
        schema,
        f"UPDATE {{s}}.queue SET {column} = CAST(:v AS timestamptz) WHERE name = 'q'",
        v=ahead,
    )

    report = Supervisor(engine, schema=schema).run_once()

    assert report.errors == ()
    assert "q" not in getattr(report, step)
    [(stamp,)] = rows(engine, schema, f"SELECT {column} FROM {{s}}.queue WHERE name = 'q'")
    assert stamp == dt.datetime(9999, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("version", ["schema", "schema46"], ids=["26", "46"])
@pytest.mark.parametrize("value", ["infinity", "-infinity"])
def test_an_infinite_cron_stamp_is_due_now_and_replaced(
    engine: Engine, request: pytest.FixtureRequest, version: str, value: str
) -> None:
    schema: str = request.getfixturevalue(version)
    rows(engine, schema, "UPDATE {s}.version SET cron_on = CAST(:v AS timestamptz)", v=value)

    report = Supervisor(engine, schema=schema).run_once()

    assert report.errors == () and report.cron_checked
    [(finite,)] = rows(engine, schema, "SELECT isfinite(cron_on) FROM {s}.version")
    assert finite is True


# ------------------------------------------------------------------ expiry log


def expiry_records(caplog: pytest.LogCaptureFixture) -> dict[str, Any]:
    found = [r for r in caplog.records if getattr(r, "action", None) == "jobs_expired"]
    return {r.__dict__["reason"]: r for r in found}


def test_expiry_at_26_says_the_handler_ran_past_its_timeout(
    engine: Engine, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q", expire_seconds=1, retry_limit=1))
    in_tx(engine, schema, lambda q: q.send("q"))
    in_tx(engine, schema, lambda q: q.fetch("q"))
    clock = FakeClock(db_now(engine) + dt.timedelta(seconds=5))

    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        report = Supervisor(engine, schema=schema, clock=clock).run_once()

    assert report.expired == {"q": 1}
    records = expiry_records(caplog)
    assert set(records) == {"timeout"}
    record = records["timeout"]
    assert record.levelno == logging.WARNING
    assert (record.__dict__["queue"], record.__dict__["count"]) == ("q", 1)
    message = record.getMessage()
    assert "ran past its timeout" in message and "expire_seconds" in message
    assert "stopped answering" not in message


def test_expiry_at_46_names_a_lapsed_heartbeat_apart_from_a_lease_run_out(
    engine: Engine, schema46: str, caplog: pytest.LogCaptureFixture
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("q"))
    rows(
        engine,
        schema46,
        """INSERT INTO {s}.job (name, state, started_on, heartbeat_on, heartbeat_seconds,
                                expire_seconds, retry_limit) VALUES
        ('q', 'active', now() - interval '1 hour', now() - interval '1 hour', NULL, 60, 0),
        ('q', 'active', now() - interval '1 minute', now() - interval '1 minute', 10, 900, 0),
        ('q', 'active', now() - interval '1 minute', now() - interval '1 minute', 10, 900, 0),
        ('q', 'active', now(), now(), 10, 900, 0)""",
    )

    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        report = Supervisor(engine, schema=schema46).run_once(force=True)

    assert report.expired == {"q": 3}
    records = expiry_records(caplog)
    assert set(records) == {"timeout", "heartbeat"}
    lease, heartbeat = records["timeout"], records["heartbeat"]
    assert (lease.__dict__["queue"], lease.__dict__["count"]) == ("q", 1)
    assert (heartbeat.__dict__["queue"], heartbeat.__dict__["count"]) == ("q", 2)
    assert "ran past its timeout" in lease.getMessage()
    assert "stopped answering" not in lease.getMessage()
    # The worker's rescue words a lapsed heartbeat the same way.
    assert "stopped answering (no heartbeat for its heartbeat_seconds)" in heartbeat.getMessage()
    assert "ran past" not in heartbeat.getMessage()


def test_a_pass_that_expires_nothing_logs_no_expiry(
    engine: Engine, schema46: str, caplog: pytest.LogCaptureFixture
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("q"))
    rows(
        engine,
        schema46,
        """INSERT INTO {s}.job (name, state, started_on, heartbeat_on, heartbeat_seconds,
                                expire_seconds) VALUES ('q', 'active', now(), now(), 10, 900)""",
    )
    with caplog.at_level(logging.DEBUG, logger="alkstore_sa"):
        report = Supervisor(engine, schema=schema46).run_once(force=True)
    assert report.expired == {} and "q" in report.monitored
    assert expiry_records(caplog) == {}
