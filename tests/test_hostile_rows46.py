"""Rows another client wrote (Node pg-boss, a SQL console) never take a page down.

The tables the dashboard and the stats readers read besides the job table
(``queue_stats``, ``instance``, ``warning``, ``schedule``) hold values Python, or an
expression over them, cannot hold: ``infinity`` timestamps, a histogram of thousands
of slots, an integer at the top of its range. Each is written here by raw SQL, as such
a client would; each reader still returns the row, says what it could not read, and
the pages that show it answer 200.
"""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from alkstore_sa import QueueService
from alkstore_sa.dashboard import create_app
from alkstore_sa.ops.observe import percentile
from alkstore_sa.sql.v46.stats import create_partition

LOCAL = "http://127.0.0.1"
INT_MAX = 2_147_483_647


def client(engine: Engine, schema: str) -> TestClient:
    app = create_app(engine, schemas=[schema])
    return TestClient(app, base_url=LOCAL, headers={"origin": LOCAL})


def service(engine: Engine, schema: str, work: Any) -> Any:
    with Session(engine) as session, session.begin():
        return work(QueueService(session, schema=schema))


def stats_row(engine: Engine, schema: str, **columns: str) -> None:
    """A ``queue_stats`` row of queue ``q`` captured a minute ago (today's and
    yesterday's partitions made first); ``columns`` are SQL expressions."""
    values = {
        "name": "'q'",
        "captured_on": "now() - interval '1 minute'",
        "queued_count": "1",
        "total_count": "3",
        "completed_delta": "2",
        "delta_seconds": "60",
        "delta_on": "now() - interval '1 minute'",
        **columns,
    }
    with engine.begin() as conn:
        today = conn.execute(text("SELECT (now() AT TIME ZONE 'UTC')::date")).scalar_one()
        for day in (today - dt.timedelta(days=1), today):
            conn.execute(create_partition(schema, day))
        conn.execute(
            text(
                f'INSERT INTO "{schema}".queue_stats ({", ".join(values)}) '
                f"VALUES ({', '.join(values.values())})"
            )
        )


@pytest.fixture
def queue46(engine: Engine, schema46: str) -> str:
    service(engine, schema46, lambda q: q.create_queue("q"))
    return schema46


def pages_answer(engine: Engine, schema: str, *paths: str) -> dict[str, str]:
    c = client(engine, schema)
    out = {}
    for path in paths:
        page = c.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        out[path] = page.text
    return out


# ------------------------------------------------------------------ queue_stats


def test_a_stats_row_counting_to_infinity_is_read_and_shown(engine: Engine, queue46: str) -> None:
    schema = queue46
    stats_row(engine, schema, delta_on="'infinity'")
    [raw] = service(engine, schema, lambda q: q.get_queue_stats_history("q"))
    assert raw.completed_delta == 2 and raw.queued_count == 1
    assert raw.delta_on is not None and raw.delta_on.year == 9999  # the stand-in
    assert "infinity" in raw.unreadable["delta_on"]
    [bucket] = service(engine, schema, lambda q: q.get_queue_stats_history("q", max_data_points=30))
    assert bucket.completed_delta == 2 and "infinity" in bucket.unreadable["delta_on"]
    pages = pages_answer(engine, schema, "/", f"/s/{schema}/queues/q")
    row = re.search(r'<tr data-queue="q".*?</tr>', pages["/"], re.S)
    assert row is not None and "<polyline points=" in row.group(0)


def unpartition(engine: Engine, schema: str) -> None:
    """``queue_stats`` as a plain table (as pg-boss made it before partitioning by
    day): only such a table can hold a capture at ``infinity``."""
    with engine.begin() as conn:
        conn.execute(text(f'ALTER TABLE "{schema}".queue_stats RENAME TO queue_stats_by_day'))
        conn.execute(
            text(
                f'CREATE TABLE "{schema}".queue_stats '
                f'(LIKE "{schema}".queue_stats_by_day INCLUDING DEFAULTS, PRIMARY KEY (id))'
            )
        )


def test_a_stats_row_captured_at_infinity_is_read_and_shown(engine: Engine, queue46: str) -> None:
    schema = queue46
    unpartition(engine, schema)
    with engine.begin() as conn:
        for captured in ("now() - interval '1 minute'", "'infinity'", "'-infinity'"):
            conn.execute(
                text(
                    f'INSERT INTO "{schema}".queue_stats (name, captured_on, queued_count,'
                    f" completed_delta, delta_on) VALUES ('q', {captured}, 1, 2, {captured})"
                )
            )
    raw = service(engine, schema, lambda q: q.get_queue_stats_history("q"))
    assert len(raw) == 3
    assert "infinity" in raw[0].unreadable["captured_on"]
    assert "-infinity" in raw[-1].unreadable["captured_on"]
    assert raw[1].unreadable == {}
    for options in ({"max_data_points": 30}, {"bucket_seconds": 10**9}, {"bucket_seconds": 1}):
        buckets = service(engine, schema, lambda q, o=options: q.get_queue_stats_history("q", **o))
        assert sum(b.completed_delta or 0 for b in buckets) == 6, options
        assert any("captured_on" in b.unreadable for b in buckets), options
    pages_answer(engine, schema, "/", f"/s/{schema}/queues/q")


def test_a_histogram_of_5000_slots_is_read_and_shown(engine: Engine, queue46: str) -> None:
    schema = queue46
    huge = "array_fill(1, ARRAY[5000])"
    stats_row(engine, schema, wait_bins=huge, run_bins=huge)
    [raw] = service(engine, schema, lambda q: q.get_queue_stats_history("q", percentiles=[50, 95]))
    assert raw.wait_bins is not None and len(raw.wait_bins) == 5000  # shown raw
    assert "5000" in raw.unreadable["wait_bins"] and "5000" in raw.unreadable["run_bins"]
    assert raw.percentiles is not None
    for p in raw.percentiles:
        assert p.wait_seconds is not None and 0 < p.wait_seconds < float("inf")
    [bucket] = service(
        engine,
        schema,
        lambda q: q.get_queue_stats_history("q", max_data_points=48, percentiles=[50, 95]),
    )
    assert bucket.wait_bins is not None and sum(bucket.wait_bins) == 5000
    assert "wait_bins" in bucket.unreadable
    page = pages_answer(engine, schema, f"/s/{schema}/queues/q")[f"/s/{schema}/queues/q"]
    assert "wait before a worker took a job" in page


def test_percentile_of_a_histogram_past_its_slots_is_finite() -> None:
    # Slots past the 48th count in the last, which is open-ended: its lower edge.
    last = percentile([0] * 47 + [1], 50)
    assert percentile([0] * 4999 + [1], 50) == last
    assert percentile([1] * 5000, 99) == last
    assert percentile([1] * 48, 50) == percentile([1] * 48 + [0] * 4000, 50)


def test_odd_histograms_are_read(engine: Engine, queue46: str) -> None:
    # Two dimensions and negative slots: an int[] column holds both.
    schema = queue46
    stats_row(engine, schema, wait_bins="'{{1,2},{3,4}}'", run_bins="ARRAY[-5, 3, 0]")
    [raw] = service(engine, schema, lambda q: q.get_queue_stats_history("q", percentiles=[50]))
    assert raw.wait_bins is None and "wait_bins" in raw.unreadable
    assert raw.run_bins == (-5, 3, 0)  # raw, as stored
    assert raw.percentiles is not None and raw.percentiles[0].run_seconds is not None
    [bucket] = service(
        engine,
        schema,
        lambda q: q.get_queue_stats_history("q", bucket_seconds=3600, percentiles=[50]),
    )
    assert bucket.completed_delta == 2 and "wait_bins" in bucket.unreadable
    pages_answer(engine, schema, "/", f"/s/{schema}/queues/q")


# ------------------------------------------------------------------ instance


def instance_row(engine: Engine, schema: str, **columns: str) -> uuid.UUID:
    ident = uuid.uuid4()
    values = {
        "id": f"'{ident}'",
        "host": "'node-host'",
        "pid": "4242",
        "version": "'pg-boss 12.38.0'",
        "node_version": "'v22.1.0'",
        "heartbeat_seconds": "60",
        "supervise": "true",
        "schedule": "false",
        "migrate": "false",
        "persist_queue_stats": "true",
        "persist_warnings": "true",
        **columns,
    }
    with engine.begin() as conn:
        conn.execute(
            text(
                f'INSERT INTO "{schema}".instance ({", ".join(values)}) '
                f"VALUES ({', '.join(values.values())})"
            )
        )
    return ident


def test_an_instance_beating_every_int_max_seconds_is_read_and_shown(
    engine: Engine, schema46: str
) -> None:
    ident = instance_row(engine, schema46, heartbeat_seconds=str(INT_MAX))
    [found] = service(engine, schema46, lambda q: q.get_instances())
    assert found.id == ident and found.heartbeat_seconds == INT_MAX and found.live
    page = pages_answer(engine, schema46, f"/s/{schema46}/instances")
    assert f'data-instance-id="{ident}"' in page[f"/s/{schema46}/instances"]


def test_instance_times_at_infinity_are_shown_as_stored(engine: Engine, schema46: str) -> None:
    ident = instance_row(
        engine,
        schema46,
        started_on="'-infinity'",
        heartbeat_on="'infinity'",
        stopped_on="'infinity'",
        workers="(repeat('[', 1000) || repeat(']', 1000))::jsonb",
    )
    [found] = service(engine, schema46, lambda q: q.get_instances())
    assert found.id == ident and found.workers == []
    assert set(found.unreadable) == {"started_on", "heartbeat_on", "stopped_on", "workers"}
    page = pages_answer(engine, schema46, f"/s/{schema46}/instances")
    row = re.search(rf'<tr id="instance-{ident}".*?</tr>', page[f"/s/{schema46}/instances"], re.S)
    assert row is not None
    assert ">-infinity<" in row.group(0) and row.group(0).count(">infinity<") == 2
    assert "9999" not in row.group(0)  # the stand-ins are not shown as times
    assert ">unreadable</span>" in row.group(0)  # not "0 workers"


def test_a_warning_at_infinity_is_shown_as_stored(engine: Engine, schema46: str) -> None:
    with engine.begin() as conn:
        conn.execute(
            text(
                f'INSERT INTO "{schema46}".warning (type, message, data, created_on) VALUES '
                "('slow_queries', 'from Node', (repeat('[', 1000) || repeat(']', 1000))::jsonb,"
                " 'infinity')"
            )
        )
    [found] = service(engine, schema46, lambda q: q.get_warnings())
    assert set(found.unreadable) == {"created_on", "data"} and found.data is None
    page = pages_answer(engine, schema46, f"/s/{schema46}/warnings")[f"/s/{schema46}/warnings"]
    row = re.search(r'<tr data-type="slow_queries".*?</tr>', page, re.S)
    assert row is not None and ">infinity<" in row.group(0) and "9999" not in row.group(0)
    assert "deeper than" in row.group(0)  # why the data is not shown


def test_unreadable_stats_rows_are_named_on_the_queue_page(engine: Engine, queue46: str) -> None:
    schema = queue46
    stats_row(engine, schema, delta_on="'infinity'", wait_bins="array_fill(1, ARRAY[5000])")
    page = pages_answer(engine, schema, f"/s/{schema}/queues/q")[f"/s/{schema}/queues/q"]
    note = re.search(r'<p class="note" id="charts-unreadable">.*?</p>', page, re.S)
    assert note is not None
    assert "delta_on" in note.group(0) and "infinity" in note.group(0)
    assert "wait_bins" in note.group(0) and "5000 slots" in note.group(0)


def test_a_queue_row_with_odd_values_is_shown(engine: Engine, schema46: str) -> None:
    service(engine, schema46, lambda q: q.create_queue("odd"))
    with engine.begin() as conn:
        conn.execute(
            text(
                f'UPDATE "{schema46}".queue SET retention_seconds = {INT_MAX},'
                f" expire_seconds = {INT_MAX}, deletion_seconds = {INT_MAX},"
                f" retry_delay = {INT_MAX}, retry_delay_max = {INT_MAX},"
                f" heartbeat_seconds = {INT_MAX}, warning_queued = {INT_MAX},"
                f" retry_limit = {INT_MAX}, queued_count = {INT_MAX},"
                f" active_count = {INT_MAX}, total_count = {INT_MAX} WHERE name = 'odd'"
            )
        )
    pages = pages_answer(engine, schema46, "/", f"/s/{schema46}/queues/odd")
    assert 'data-queue="odd"' in pages["/"]
    assert "24855 days 3 h" in pages[f"/s/{schema46}/queues/odd"]  # the settings, as stored


def test_a_schedule_with_odd_values_is_shown(engine: Engine, schema46: str) -> None:
    service(engine, schema46, lambda q: q.create_queue("q"))
    with engine.begin() as conn:
        conn.execute(
            text(
                f'INSERT INTO "{schema46}".schedule (name, key, cron, timezone, data, options,'
                " created_on, updated_on) VALUES ('q', 'odd', 'not a cron', 'Mars/Olympus',"
                " (repeat('[', 1000) || repeat(']', 1000))::jsonb, '{\"priority\": 1e400}',"
                " '-infinity', 'infinity')"
            )
        )
    pages = pages_answer(engine, schema46, f"/s/{schema46}/schedules", f"/s/{schema46}/queues/q")
    row = re.search(
        r'<tr data-queue="q" data-key="odd">.*?</tr>', pages[f"/s/{schema46}/schedules"], re.S
    )
    assert row is not None and "<code>not a cron</code>" in row.group(0)


def test_a_pass_with_an_instance_beating_every_int_max_seconds(
    engine: Engine, queue46: str
) -> None:
    # The Node instance persists history and is live: our pass records on its behalf
    # (the rule of ops/stats_history.py), and trimming dead rows keeps it.
    from alkstore_sa.supervision import Supervisor

    ident = instance_row(engine, queue46, heartbeat_seconds=str(INT_MAX))
    report = Supervisor(engine, schema=queue46, schedule=False).run_once()
    assert report.errors == ()
    assert report.recorded == ("q",)
    [found] = service(engine, queue46, lambda q: q.get_instances())
    assert found.id == ident and found.live


def test_a_job_completed_at_infinity_is_counted_and_shown(engine: Engine, queue46: str) -> None:
    # With no history recorded, the overview and the queue page count completions
    # from the job table: the job is counted in the last bucket (the latest there is).
    schema = queue46
    with engine.begin() as conn:
        for completed in ("'infinity'", "now() - interval '1 minute'"):
            conn.execute(
                text(
                    f'INSERT INTO "{schema}".job (name, state, started_on, completed_on)'
                    f" VALUES ('q', 'completed', now() - interval '2 minutes', {completed})"
                )
            )
    since = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=30)
    counts = service(
        engine, schema, lambda q: q.count_completions(["q"], since=since, bucket_seconds=300)
    )
    assert sum(counts["q"]) == 2 and counts["q"][-1] == 2
    pages = pages_answer(engine, schema, "/", f"/s/{schema}/queues/q")
    assert "2 in the last hour" in pages["/"]
