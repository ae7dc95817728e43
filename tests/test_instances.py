"""The instance registry at schema 46 (pg-boss 12.38's ``instance`` table): workers
register at start, beat every ``instance_heartbeat_seconds`` and are stamped stopped at
stop; ``get_instances`` lists them with ``live``; supervision deletes old rows. At 26
workers write nothing and ``get_instances`` is refused."""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.worker import Harness, wait_for

from alkstore_sa import Instance, QueueService
from alkstore_sa.errors import InvalidOptionsError, SchemaFeatureError
from alkstore_sa.worker import Worker

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def rows(h: Harness) -> list[Any]:
    return h.sql("SELECT * FROM {s}.instance ORDER BY started_on")


def test_a_worker_registers_beats_and_stops_like_a_node_instance(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.start(
        h.worker(
            name="billing",
            handlers={"q": h.handler()},
            instance_heartbeat_seconds=1,
            concurrency=3,
        )
    )
    [row] = rows(h)  # registered by the time start() returned
    assert row.id == w.instance_id
    assert (row.name, row.host, row.pid) == ("billing", socket.gethostname(), os.getpid())
    assert row.version.startswith("alkstore_sa ") and row.node_version.startswith("Python ")
    assert row.heartbeat_seconds == 1 and row.stopped_on is None
    assert (row.supervise, row.schedule, row.migrate) == (False, False, False)
    assert row.application_name is not None
    [entry] = row.workers
    assert entry["queue"] == "q" and entry["localConcurrency"] == 3 and entry["active"] == 0
    assert row.config["instanceHeartbeatSeconds"] == 1 and row.config["client"] == "alkstore_sa"
    # The process's vitals in Node's keys: no CPU figure before a second sample.
    assert row.metrics["cpu"] is None and row.metrics["cgroup"] is None
    assert row.metrics["rss"] > 0 and row.metrics["memoryLimit"] > 0
    assert row.metrics["cpuLimit"] >= 1
    first_beat = row.heartbeat_on

    # A job run: the next beat reports when it was fetched and ended.
    h.service_tx(lambda q: q.send("q", {"n": 1}))
    wait_for(lambda: rows(h)[0].workers[0]["lastJobEndedOn"] is not None, timeout=10)
    [row] = rows(h)
    assert row.heartbeat_on > first_beat and row.workers[0]["lastFetchedOn"] is not None
    assert row.metrics["cpu"] >= 0

    listed = h.service_tx(lambda q: q.get_instances())
    assert [i.id for i in listed] == [w.instance_id]
    assert isinstance(listed[0], Instance) and listed[0].live

    h.stop(w)
    [row] = rows(h)
    assert row.stopped_on is not None
    [gone] = h.service_tx(lambda q: q.get_instances())
    assert not gone.live


def test_register_instance_false_writes_nothing(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.start(h.worker(handlers={"q": h.handler()}, register_instance=False))
    h.service_tx(lambda q: q.send("q"))
    wait_for(lambda: w.stats()["q"].completed == 1)
    h.stop(w)
    assert rows(h) == []


def test_an_unnamed_worker_records_no_name_and_its_supervisor_settings(
    engine: Engine, schema46: str
) -> None:
    w = Worker(
        engine,
        schema=schema46,
        handlers={"q": lambda job: None},
        supervisor_options={"persist_queue_stats": True, "persist_warnings": True},
        shutdown_timeout=1,
    )
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    w.start()
    try:
        with engine.connect() as conn:
            row = conn.exec_driver_sql(f'SELECT * FROM "{schema46}".instance').one()
        assert row.name is None
        assert (row.supervise, row.schedule) == (True, True)
        assert (row.persist_queue_stats, row.persist_warnings) == (True, True)
        assert row.config["persistQueueStats"] is True
    finally:
        w.stop()


def test_a_worker_at_26_writes_no_instance_and_listing_is_refused(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.start(h.worker(handlers={"q": h.handler()}, instance_heartbeat_seconds=1))
    h.service_tx(lambda q: q.send("q"))
    wait_for(lambda: w.stats()["q"].completed == 1)
    h.stop(w)
    assert h.sql("SELECT to_regclass(:t) IS NULL", t=f'"{h.schema}".instance') == [(True,)]
    with pytest.raises(SchemaFeatureError, match=r"instance registry.*version 46"):
        h.service_tx(lambda q: q.get_instances())


def test_get_instances_pages_and_checks_its_options(engine: Engine, schema46: str) -> None:
    ids = []
    with engine.begin() as conn:
        for n in range(3):
            ident = uuid.uuid4()
            ids.append(ident)
            conn.exec_driver_sql(
                f'INSERT INTO "{schema46}".instance (id, host, pid, version, node_version, '
                "heartbeat_seconds, supervise, schedule, migrate, persist_queue_stats, "
                "persist_warnings, started_on, heartbeat_on) VALUES "
                f"('{ident}', 'h', 1, '12.38.0', 'v22', 30, true, true, true, false, false, "
                f"now() - interval '{10 - n} minutes', now() - interval '{10 - n} minutes')"
            )
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        first = q.get_instances(limit=2)
        assert [i.id for i in first] == ids[:2]
        assert all(not i.live for i in first)  # quiet: no beat for far more than 3 x 30 s
        assert [i.id for i in q.get_instances(after=first[-1].id)] == ids[2:]
        assert q.get_instances(after=str(ids[2])) == []
        for bad in ({"limit": 0}, {"limit": 100_001}, {"after": "nope"}):
            with pytest.raises(InvalidOptionsError):
                q.get_instances(**bad)
        with pytest.raises(InvalidOptionsError, match="no longer registered"):
            q.get_instances(after=uuid.uuid4())
        # The transaction is still usable.
        assert len(q.get_instances()) == 3


def test_instance_heartbeat_seconds_is_checked_with_the_worker(
    engine: Engine, schema46: str
) -> None:
    for bad in (0, 3601, 1.5, True):
        with pytest.raises(InvalidOptionsError, match="instance_heartbeat_seconds"):
            Worker(engine, schema=schema46, instance_heartbeat_seconds=bad)  # type: ignore[arg-type]


def test_supervision_deletes_instances_quiet_for_seven_days(engine: Engine, schema46: str) -> None:
    with engine.begin() as conn:
        for age in ("8 days", "6 days"):
            conn.exec_driver_sql(
                f'INSERT INTO "{schema46}".instance (id, host, pid, version, node_version, '
                "heartbeat_seconds, supervise, schedule, migrate, persist_queue_stats, "
                "persist_warnings, started_on, heartbeat_on) VALUES "
                f"(gen_random_uuid(), '{age}', 1, '12.38.0', 'v22', 30, true, true, true, "
                f"false, false, now() - interval '{age}', now() - interval '{age}')"
            )
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).supervise(force=True)
    with engine.connect() as conn:
        left = [r.host for r in conn.exec_driver_sql(f'SELECT host FROM "{schema46}".instance')]
    assert left == ["6 days"]


def dead_life(engine: Engine, schema: str, name: str, minutes_ago: int, *, stopped: bool) -> None:
    """A row of an earlier life of ``name`` on this host: quiet (crashed) or stopped."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f'INSERT INTO "{schema}".instance (id, name, host, pid, version, node_version, '
                "heartbeat_seconds, supervise, schedule, migrate, persist_queue_stats, "
                "persist_warnings, started_on, heartbeat_on, stopped_on) VALUES "
                "(gen_random_uuid(), :name, :host, 1, 'x', 'x', 30, false, false, false, false, "
                "false, now() - make_interval(mins => :ago), "
                "now() - make_interval(mins => :ago - 1), "
                "CASE WHEN :stopped THEN now() - make_interval(mins => :ago - 1) END)"
            ),
            {"name": name, "host": socket.gethostname(), "ago": minutes_ago, "stopped": stopped},
        )


def test_crash_restarts_are_counted_since_the_last_graceful_stop(
    engine: Engine, schema46: str
) -> None:
    # Lives of "billing": crashed, stopped gracefully, then crashed twice: two crashes in a row.
    for ago, stopped in ((60, False), (50, True), (40, False), (30, False)):
        dead_life(engine, schema46, "billing", ago, stopped=stopped)
    dead_life(engine, schema46, "other", 20, stopped=False)  # another name: not counted
    w = Worker(engine, schema=schema46, name="billing", handlers={"q": lambda job: None})
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    w.start()
    try:
        with Session(engine) as session, session.begin():
            listed = {i.id: i for i in QueueService(session, schema=schema46).get_instances()}
        me = listed[w.instance_id]
        assert me.crash_restarts == 2
        # Since the first crash of the streak: the life started 40 minutes ago (its last beat).
        lives = sorted(
            (i for i in listed.values() if i.name == "billing" and i.id != me.id),
            key=lambda i: i.started_on,
        )
        earliest = lives[2].heartbeat_on
        assert me.crash_restarts_since == earliest
    finally:
        w.stop()


def test_a_stopped_worker_leaves_no_heartbeat_running(engine: Engine, schema46: str) -> None:
    import threading

    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    w = Worker(engine, schema=schema46, handlers={"q": lambda job: None}, supervise=False)
    w.start()
    w.stop()
    assert not [t for t in threading.enumerate() if t.name == "alkstore-registrar"]
    with engine.connect() as conn:
        [stopped] = conn.execute(text(f'SELECT stopped_on FROM "{schema46}".instance')).one()
    assert stopped is not None
