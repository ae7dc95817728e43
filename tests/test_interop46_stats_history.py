"""Interop at schema 46, queue-stats history: Node pg-boss 12.38.0 with ``persistQueueStats``
and our supervisor (without ``persist_queue_stats``) take monitor turns in alternation.

Every turn leaves a ``queue_stats`` row, whoever won it; the rows' windows tile (each starts
where the last ended), so their deltas add up to the jobs of the whole span, counted here
from the job table; and Node's reader, ``getQueueStats``, reads our rows with its own.
"""

from __future__ import annotations

import itertools
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import schema46_by, sql
from support.node import in_tx, node46, node46_modules, node_url, py_engine

from alkstore_sa.supervision import Supervisor

__all__ = ["node46", "node46_modules", "node_url", "py_engine", "schema46_by"]

pytestmark = pytest.mark.interop

TURNS = 6


def add_jobs(engine: Engine, schema: str, turn: int) -> None:
    """Jobs stamped 9.5 s back: the next pass (1.2 s on) counts up to 10 s behind it,
    so its window holds them (created, and finished with known wait and run times)."""
    sql(
        engine,
        schema,
        """INSERT INTO {s}.job (name, state, created_on, start_after, started_on, completed_on)
        SELECT 'hist', CAST(st AS {s}.job_state), now() - interval '9.5 seconds',
               now() - interval '9.5 seconds',
               CASE WHEN st <> 'created' THEN now() - interval '9.4 seconds' END,
               CASE WHEN st <> 'created' THEN now() - interval '9.3 seconds' END
        FROM unnest(CAST(:states AS text[])) st""",
        states=["created"] * (turn + 1) + ["completed"] * 2 + ["failed"] * (turn % 2),
    )


def test_alternating_turns_leave_a_history_row_each_and_node_reads_ours(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("hist"))
    boss = node46(schema, persistQueueStats=True, monitorIntervalSeconds=1)
    writers = []
    for turn in range(TURNS):
        add_jobs(engine, schema, turn)
        time.sleep(1.2)  # the monitor turn (1 s) is due again
        if turn % 2 == 0:
            boss.call("supervise", "hist")
            writers.append("node")
        else:
            report = Supervisor(
                py_engine, schema=schema, schedule=False, monitor_interval=1, queues=["hist"]
            ).run_once()
            assert report.monitored == ("hist",) and not report.errors
            writers.append("python")

    rows = sql(
        engine, schema, "SELECT * FROM {s}.queue_stats WHERE name = 'hist' ORDER BY captured_on"
    )
    assert len(rows) == TURNS  # a row for every turn, whoever won it
    # Node's ids are random (version 4); ours, written because Node persists, version 8.
    ours = [uuid.UUID(str(r.id)).version == 8 for r in rows]
    assert ours == [w == "python" for w in writers]

    # The windows tile: each starts where the previous one ended.
    for before, after in itertools.pairwise(rows):
        assert after.delta_on > before.delta_on
        assert after.delta_seconds == round((after.delta_on - before.delta_on).total_seconds())
    # So their counts are the job table's over the whole span, nothing lost or counted twice.
    [expected] = sql(
        engine,
        schema,
        """SELECT count(*) FILTER (WHERE created_on >= :a AND created_on < :b) AS created,
          count(*) FILTER (WHERE state = 'completed' AND completed_on >= :a AND completed_on < :b)
            AS completed,
          count(*) FILTER (WHERE state = 'failed' AND completed_on >= :a AND completed_on < :b)
            AS failed
        FROM {s}.job WHERE name = 'hist'""",
        a=rows[0].delta_on,
        b=rows[-1].delta_on,
    )
    counted = rows[1:]
    assert sum(r.created_delta for r in counted) == expected.created > 0
    assert sum(r.completed_delta for r in counted) == expected.completed > 0
    assert sum(r.failed_delta for r in counted) == expected.failed > 0
    # Each finished job waited and ran 0.1 s: slot 7 (from 10 ms·√2^6 to 10 ms·√2^7).
    timed = expected.completed + expected.failed
    assert sum((r.wait_bins[7] or 0) for r in counted) == timed
    assert sum((r.run_bins[7] or 0) for r in counted) == timed

    # Node's reader: our rows among its own, newest first, counters and histograms read.
    snapshots = boss.call("getQueueStats", "hist", {"percentiles": [50]})
    assert len(snapshots) == TURNS
    by_node = [s["createdDelta"] for s in reversed(snapshots)]
    assert by_node == [r.created_delta for r in rows]
    python_rows = [s for s, w in zip(reversed(snapshots), writers, strict=True) if w == "python"]
    assert all(len(s["waitBins"]) == 48 for s in python_rows)
    assert sum(s["waitBins"][7] for s in python_rows) == sum(
        (r.wait_bins[7] or 0) for r, w in zip(rows, writers, strict=True) if w == "python"
    )


def test_both_supervisors_on_timers_leave_a_history_row_for_every_counted_turn(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("busy"))
    # Who counted each turn: every write of monitor_on, with the writer's application_name.
    sql(engine, schema, "CREATE TABLE {s}.test_counted (app text, at timestamptz)")
    sql(
        engine,
        schema,
        """CREATE FUNCTION {s}.test_counted_fn() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF NEW.monitor_on IS DISTINCT FROM OLD.monitor_on AND NEW.name = 'busy' THEN
            INSERT INTO {s}.test_counted VALUES (current_setting('application_name'), now());
          END IF;
          RETURN NEW;
        END $$""",
    )
    sql(
        engine,
        schema,
        "CREATE TRIGGER test_counted AFTER UPDATE ON {s}.queue "
        "FOR EACH ROW EXECUTE FUNCTION {s}.test_counted_fn()",
    )
    boss = node46(
        schema,
        supervise=True,
        persistQueueStats=True,
        superviseIntervalSeconds=1,
        monitorIntervalSeconds=1,
    )
    supervisor = Supervisor(
        py_engine, schema=schema, schedule=False, supervise_interval=0.7, monitor_interval=1
    )
    supervisor.start()
    try:
        # At least 10 s of sends, and on until both sides have counted a turn (a busy
        # machine can starve one side's timer for a while; 60 s at most).
        for rounds in range(120):
            boss.call("send", "busy", {"by": "node"})
            in_tx(engine, schema, lambda q: q.send("busy", {"by": "python"}))
            time.sleep(0.5)
            if rounds >= 20:
                seen = sql(
                    engine, schema, "SELECT DISTINCT left(app, 6) AS a FROM {s}.test_counted"
                )
                # Both sides ("pgboss..." and ours) counted, over turns at least a second
                # apart: on a starved machine the only two turns can land together, and
                # then no send falls between the first row and the last.
                [(span,)] = sql(
                    engine,
                    schema,
                    "SELECT coalesce(extract(epoch FROM max(delta_on) - min(delta_on)), 0)"
                    " FROM {s}.queue_stats WHERE name = 'busy'",
                )
                if len(seen) >= 2 and span >= 1:
                    break
    finally:
        supervisor.stop(10)
        boss.close()

    counted = sql(engine, schema, "SELECT app FROM {s}.test_counted")
    apps = {"node" if r.app.startswith("pgboss") else "python" for r in counted}
    assert apps == {"node", "python"}  # both sides won turns
    rows = sql(
        engine, schema, "SELECT * FROM {s}.queue_stats WHERE name = 'busy' ORDER BY delta_on"
    )
    assert len(rows) == len(counted)  # one row per counted turn, whoever counted it
    for before, after in itertools.pairwise(rows):
        assert after.delta_seconds == round((after.delta_on - before.delta_on).total_seconds())
    [(created,)] = sql(
        engine,
        schema,
        "SELECT count(*) FROM {s}.job WHERE name = 'busy' AND created_on >= :a AND created_on < :b",
        a=rows[0].delta_on,
        b=rows[-1].delta_on,
    )
    assert sum(r.created_delta for r in rows[1:]) == created > 0
