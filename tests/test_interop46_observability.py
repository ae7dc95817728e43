"""Interop at schema 46, observability: Node pg-boss 12.38.0 and alkstore_sa read each
other's instance registry rows, persisted warnings and queue-stats history.

- Node's ``getInstances`` lists a running Python worker (live, then stopped), and our
  ``get_instances`` lists the Node instance.
- A ``queue_backlog`` warning Node persists (``persistWarnings``) is read by our
  ``get_warnings``; ours, written with ``persist_warnings``, carries the same type and data keys.
- On the same ``queue_stats`` rows, our ``get_queue_stats_history`` answers as Node's
  ``getQueueStats`` does, raw and bucketed (``bucketSeconds``, ``maxDataPoints``,
  ``aggregate``).
"""

from __future__ import annotations

import datetime as dt
import socket
import time
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from support.interop46 import schema46_by, sql
from support.node import in_tx, iso, node46, node46_modules, node_url, parse_time, py_engine

from alkstore_sa import QueueService
from alkstore_sa.sql.v46.stats import create_partition
from alkstore_sa.worker import Worker

__all__ = ["node46", "node46_modules", "node_url", "py_engine", "schema46_by"]

pytestmark = pytest.mark.interop

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)


def service(engine: Engine, schema: str, fn: Any) -> Any:
    with Session(engine) as session, session.begin():
        return fn(QueueService(session, schema=schema))


def test_node_lists_our_worker_and_we_list_node(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("reg"))
    boss = node46(schema, instanceName="node-api")
    worker = Worker(
        py_engine,
        schema=schema,
        name="py-billing",
        handlers={"reg": lambda job: None},
        supervise=False,
        shutdown_timeout=1,
    )
    worker.start()
    try:
        by_node = {i["id"]: i for i in boss.call("getInstances")}
        ours = by_node[str(worker.instance_id)]
        assert ours["live"] is True and ours["name"] == "py-billing"
        assert ours["version"].startswith("alkstore_sa") and ours["stoppedOn"] is None
        assert ours["applicationName"] == "alkstore-interop"
        assert [w["queue"] for w in ours["workers"]] == ["reg"]
        assert ours["metrics"]["memoryLimit"] > 0 and ours["crashRestarts"] == 0
        listed = service(engine, schema, lambda q: q.get_instances())
        node_rows = [i for i in listed if i.name == "node-api"]
        assert len(node_rows) == 1 and node_rows[0].live
        assert node_rows[0].node_version.startswith("v")
    finally:
        worker.stop()
    ours = {i["id"]: i for i in boss.call("getInstances")}[str(worker.instance_id)]
    assert ours["live"] is False and parse_time(ours["stoppedOn"]) is not None


def test_we_read_node_warnings_and_write_ours_alike(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("big"))
    in_tx(engine, schema, lambda q: q.send_many("big", [{"data": {"n": n}} for n in range(3)]))
    boss = node46(schema, persistWarnings=True, warningQueueSize=1, monitorIntervalSeconds=1)
    boss.call("supervise", "big")
    [node_warning] = service(engine, schema, lambda q: q.get_warnings("queue_backlog"))
    assert '"big"' in node_warning.message and node_warning.data["queuedCount"] == 3

    time.sleep(1.2)  # the monitor turn (1 s) is due again, for us
    with Session(py_engine) as session, session.begin():
        QueueService(session, schema=schema).supervise(
            "big", monitor_interval=1, warning_queue_size=1, persist_warnings=True
        )
    ours, theirs = service(engine, schema, lambda q: q.get_warnings(type="queue_backlog"))
    assert theirs.id == node_warning.id and ours.created_on >= theirs.created_on
    assert set(ours.data) >= {"name", "queuedCount", "warningQueueSize"}
    assert (
        ours.data["queuedCount"] == 3 and ours.message.split(":")[0] == theirs.message.split(":")[0]
    )


def put_series(engine: Engine, schema: str) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("h"))
    with engine.begin() as conn:
        conn.execute(create_partition(schema, T0.date()))
    rows = [
        (5, 10, None, None),
        (25, 30, None, None),
        (45, 21, None, None),
        (70, 7, 4, 60),
        (110, 8, 1, 100),
        (190, 3, 5, 180),
        (250, 12, 2, 240),
    ]
    for captured, queued, created, delta_on in rows:
        sql(
            engine,
            schema,
            """INSERT INTO {s}.queue_stats (id, name, captured_on, queued_count, total_count,
                 created_delta, completed_delta, failed_delta, delta_seconds, delta_on,
                 wait_bins, run_bins, ready_oldest_seconds)
               SELECT :id, 'h', :c, :q, :q + 1, cr, cr, cr * 0, :ds, :d,
                 CASE WHEN cr IS NOT NULL THEN array_fill(0, ARRAY[48]) END,
                 CASE WHEN cr IS NOT NULL THEN array_fill(1, ARRAY[48]) END, cr
               FROM (SELECT CAST(:cr AS int) AS cr) v""",
            id=uuid.uuid4(),
            c=T0 + dt.timedelta(seconds=captured),
            q=queued,
            cr=created,
            ds=None if created is None else 40,
            d=None if delta_on is None else T0 + dt.timedelta(seconds=delta_on),
        )


def node_view(snapshot: dict[str, Any]) -> tuple[Any, ...]:
    return (
        parse_time(snapshot["capturedOn"]),
        snapshot["queuedCount"],
        snapshot["totalCount"],
        snapshot["createdDelta"],
        snapshot["deltaSeconds"],
        parse_time(snapshot["deltaOn"]),
        snapshot["readyOldestSeconds"],
        None if snapshot["runBins"] is None else sum(snapshot["runBins"]),
    )


def our_view(s: Any) -> tuple[Any, ...]:
    return (
        s.captured_on,
        s.queued_count,
        s.total_count,
        s.created_delta,
        s.delta_seconds,
        s.delta_on,
        s.ready_oldest_seconds,
        None if s.run_bins is None else sum(s.run_bins),
    )


CASES = [
    ({}, {}),
    ({"limit": 3}, {"limit": 3}),
    ({"bucketSeconds": 60}, {"bucket_seconds": 60}),
    ({"bucketSeconds": 30, "aggregate": "min"}, {"bucket_seconds": 30, "aggregate": "min"}),
    ({"bucketSeconds": 20, "aggregate": "avg"}, {"bucket_seconds": 20, "aggregate": "avg"}),
    ({"bucketSeconds": 45, "limit": 2}, {"bucket_seconds": 45, "limit": 2}),
    ({"maxDataPoints": 4}, {"max_data_points": 4}),
    ({"maxDataPoints": 3, "aggregate": "avg"}, {"max_data_points": 3, "aggregate": "avg"}),
]


def test_our_history_reader_answers_as_node_getqueuestats(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    put_series(engine, schema)
    boss = node46(schema, persistQueueStats=True)
    windows: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({}, {}),
        (
            {"from": iso(T0 + dt.timedelta(seconds=50)), "to": iso(T0 + dt.timedelta(seconds=105))},
            {"from_": T0 + dt.timedelta(seconds=50), "to": T0 + dt.timedelta(seconds=105)},
        ),
    ]
    compared = 0
    for node_window, our_window in windows:
        for node_opts, our_opts in CASES:
            theirs = boss.call("getQueueStats", "h", {**node_opts, **node_window})  # type: ignore[dict-item]
            ours = service(
                engine,
                schema,
                lambda q, o=our_opts, w=our_window: q.get_queue_stats_history("h", **o, **w),
            )
            assert [our_view(s) for s in ours] == [node_view(s) for s in theirs], (
                node_opts,
                node_window,
            )
            compared += 1
    assert compared == 2 * len(CASES)


def test_crash_restarts_are_counted_as_node_counts_them(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    """The same earlier lives under two names: Node counts its own, we count ours."""
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("cr"))
    for name in ("node-svc", "py-svc"):
        # crashed, stopped, crashed, crashed (oldest first): a streak of two.
        for ago, stopped in ((60, False), (50, True), (40, False), (30, False)):
            sql(
                engine,
                schema,
                "INSERT INTO {s}.instance (id, name, host, pid, version, node_version, "
                "heartbeat_seconds, supervise, schedule, migrate, persist_queue_stats, "
                "persist_warnings, started_on, heartbeat_on, stopped_on) VALUES "
                "(gen_random_uuid(), :n, :h, 1, 'x', 'x', 30, false, false, false, false, "
                "false, now() - make_interval(mins => :ago), "
                "now() - make_interval(mins => :ago - 1), "
                "CASE WHEN :stopped THEN now() - make_interval(mins => :ago - 1) END)",
                n=name,
                h=socket.gethostname(),
                ago=ago,
                stopped=stopped,
            )
    node46(schema, instanceName="node-svc")
    worker = Worker(
        py_engine, schema=schema, name="py-svc", handlers={"cr": lambda job: None},
        supervise=False, shutdown_timeout=1,
    )  # fmt: skip
    worker.start()
    try:
        rows = sql(
            engine,
            schema,
            "SELECT name, crash_restarts, crash_restarts_since - heartbeat_on AS lag, "
            "crash_restarts_since IS NOT NULL AS since FROM {s}.instance "
            "WHERE stopped_on IS NULL AND heartbeat_on > now() - interval '1 minute' "
            "ORDER BY name",
        )
    finally:
        worker.stop()
    assert [(r.name, r.crash_restarts, r.since) for r in rows] == [
        ("node-svc", 2, True),
        ("py-svc", 2, True),
    ]
    assert rows[0].lag.total_seconds() == pytest.approx(rows[1].lag.total_seconds(), abs=60)
