"""Supervision against rows it did not write: throttle stamps at ±infinity (any
client, Node pg-boss included, may store them).

At both schemas a pass must run the step whose stamp is infinite and leave a finite
time behind; a finite stamp keeps its meaning exactly.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import Engine
from support.direct import in_tx, rows

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


@pytest.mark.parametrize("value", ["infinity", "-infinity"])
def test_an_infinite_cron_stamp_at_26_is_due_now_and_replaced(
    engine: Engine, schema: str, value: str
) -> None:
    rows(engine, schema, "UPDATE {s}.version SET cron_on = CAST(:v AS timestamptz)", v=value)

    report = Supervisor(engine, schema=schema).run_once()

    assert report.errors == () and report.cron_checked
    [(finite,)] = rows(engine, schema, "SELECT isfinite(cron_on) FROM {s}.version")
    assert finite is True
