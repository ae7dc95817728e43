"""Interop at schema 46, supervision and cron: Node pg-boss 12.38.0 and our Supervisor watch one
schema together.

At 46 a monitor turn is claimed through ``queue.monitor_claim_on`` and its counts are written
with ``monitor_on`` under a try-lock; maintenance is claimed through ``maintain_on``. A test
trigger records who wrote each stamp (by application_name), so the tests see that every
duty ran once per interval across both sides, that both sides won turns, and that no duty
was skipped by the side that won it: expiry (lease and heartbeat), counters (blocked/ready
split, retained and total), retention (``deletion_seconds = 0`` keeps), dead letters.
Cron: a schedule stored by either side fires once per minute slot with both timekeepers on.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter
from functools import partial
from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import schema46_by, sql, states, wait_until
from support.node import (
    PY_APP,
    NodeBoss46,
    in_tx,
    node46,
    node46_modules,
    node_url,
    py_engine,
)

from alkstore_sa import Job, JobSpec, QueueService
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.supervision import Supervisor
from alkstore_sa.worker import Worker

__all__ = ["node46", "node46_modules", "node_url", "py_engine", "schema46_by"]

pytestmark = pytest.mark.interop

MONITOR = 2  # seconds: monitor_interval / monitorIntervalSeconds
MAINTAIN = 3  # seconds: maintenance_interval / maintenanceIntervalSeconds
RUN_FOR = 20.0  # seconds of load


def install_audit(engine: Engine, schema: str) -> None:
    """Record each turn taken (the monitor's claim, the maintenance stamp) with the
    writer's application_name."""
    sql(
        engine,
        schema,
        "CREATE TABLE {s}.test_audit (queue text, step text, previous timestamptz, "
        "stamped timestamptz, app text)",
    )
    sql(
        engine,
        schema,
        """
        CREATE FUNCTION {s}.test_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          -- The monitor's turn is its claim (monitor_claim_on); monitor_on is written
          -- with the counts, in a statement that may start later under load.
          IF NEW.monitor_claim_on IS DISTINCT FROM OLD.monitor_claim_on
             AND NEW.monitor_claim_on IS NOT NULL THEN
            INSERT INTO {s}.test_audit VALUES (NEW.name, 'monitor', OLD.monitor_claim_on,
              NEW.monitor_claim_on, current_setting('application_name'));
          END IF;
          IF NEW.maintain_on IS DISTINCT FROM OLD.maintain_on AND NEW.maintain_on IS NOT NULL THEN
            INSERT INTO {s}.test_audit VALUES (NEW.name, 'maintain', OLD.maintain_on,
              NEW.maintain_on, current_setting('application_name'));
          END IF;
          RETURN NEW;
        END $$""",
    )
    sql(
        engine,
        schema,
        "CREATE TRIGGER test_audit AFTER UPDATE ON {s}.queue "
        "FOR EACH ROW EXECUTE FUNCTION {s}.test_audit_fn()",
    )


def python_errors(records: list[logging.LogRecord]) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if r.name.startswith("alkstore_sa") and r.levelno >= logging.ERROR
    ]


def send_batch(q: QueueService, batch: list[JobSpec]) -> list[Any]:
    return q.send_many("load", batch)


class Load:
    """Senders on both sides and workers on both sides, counting every run."""

    def __init__(self, engine: Engine, schema: str, boss: NodeBoss46) -> None:
        self.engine, self.schema, self.boss = engine, schema, boss
        self.sent: list[str] = []
        self.runs: list[str] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    def handle(self, job: Job) -> str:
        with self.lock:
            self.runs.append(str(job.id))
        return "python"

    def send_loop(self) -> None:
        n = 0
        try:
            while not self.stop.is_set():
                n += 1
                batch: list[JobSpec] = [{"data": {"n": n, "i": i}} for i in range(5)]
                ids = in_tx(self.engine, self.schema, partial(send_batch, batch=batch))
                theirs = [self.boss.call("send", "load", {"n": n, "node": i}) for i in range(5)]
                with self.lock:
                    self.sent += [str(i) for i in ids] + theirs
                self.stop.wait(0.1)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)


def node_runs(boss: NodeBoss46) -> set[str]:
    return {e["id"] for e in boss.events_of("job")}


def live_counts(engine: Engine, schema: str, name: str) -> dict[str, int]:
    [row] = sql(
        engine,
        schema,
        "SELECT count(*) FILTER (WHERE state < 'active' AND blocked) AS blocked_count, "
        "count(*) FILTER (WHERE state < 'active' AND NOT blocked AND start_after > now()) "
        "  AS deferred_count, "
        "count(*) FILTER (WHERE state < 'active' AND NOT blocked AND start_after <= now()) "
        "  AS ready_count, "
        "count(*) FILTER (WHERE state = 'active') AS active_count, "
        "count(*) FILTER (WHERE state = 'failed') AS failed_count FROM {s}.job WHERE name = :n",
        n=name,
    )
    return dict(row._mapping)


def cached_counts(engine: Engine, schema: str, name: str) -> dict[str, int]:
    [row] = sql(
        engine,
        schema,
        "SELECT blocked_count, deferred_count, ready_count, active_count, failed_count "
        "FROM {s}.queue WHERE name = :n",
        n=name,
    )
    return dict(row._mapping)


def test_node_and_python_supervisors_share_every_duty_under_load(
    engine: Engine,
    py_engine: Engine,
    schema46_by: str,
    node46: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    schema = schema46_by
    caplog.set_level(logging.INFO, logger="alkstore_sa")

    def create(q: Any) -> None:
        q.create_queue("dlq")
        q.create_queue("load", deletion_seconds=1)
        q.create_queue("keep", deletion_seconds=0)
        q.create_queue("stall", expire_seconds=1, retry_limit=1, dead_letter="dlq")

    in_tx(engine, schema, create)
    install_audit(engine, schema)
    boss = node46(
        schema,
        supervise=True,
        superviseIntervalSeconds=1,
        monitorIntervalSeconds=MONITOR,
        maintenanceIntervalSeconds=MAINTAIN,
        queueCacheIntervalSeconds=1,
    )
    supervisor = Supervisor(
        py_engine,
        schema=schema,
        schedule=False,
        supervise_interval=0.7,  # out of step with Node's 1 s, so both win turns
        monitor_interval=MONITOR,
        maintenance_interval=MAINTAIN,
    )
    load = Load(engine, schema, boss)
    worker = Worker(py_engine, schema=schema, poll_interval=0.2, supervise=False, concurrency=2)
    worker.register("load", load.handle, batch_size=5)
    boss.call("work", "load", {"pollingIntervalSeconds": 0.5, "batchSize": 5}, {})

    # Jobs left active on purpose, by both sides: only expiration can end them.
    in_tx(
        engine,
        schema,
        lambda q: q.send_many("stall", [{"data": {"by": "py", "i": i}} for i in range(3)]),
    )
    for i in range(3):
        boss.call("send", "stall", {"by": "node", "i": i})
    # Completed jobs of a queue that keeps them (deletion_seconds = 0), by both sides.
    kept = [in_tx(engine, schema, lambda q: q.send("keep", {"by": "py"})) for _ in range(2)]
    kept += [boss.call("send", "keep", {"by": "node"}) for _ in range(2)]
    for job in in_tx(engine, schema, lambda q: q.fetch("keep", 4)):
        in_tx(engine, schema, lambda q, j=job: q.complete("keep", j.id))  # type: ignore[misc]

    supervisor.start()
    worker.start()
    sender = threading.Thread(target=load.send_loop, daemon=True)
    sender.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < RUN_FOR:
            in_tx(engine, schema, lambda q: q.fetch("stall", 10))
            boss.call("fetch", "stall", {"batchSize": 10})
            time.sleep(0.5)
        load.stop.set()
        sender.join(10)
        assert wait_until(lambda: len(set(load.runs) | node_runs(boss)) >= len(load.sent), 20)
    finally:
        load.stop.set()
        worker.stop(5)
        supervisor.stop(5)
    boss.close()

    assert load.errors == []
    assert boss.errors() == []
    assert python_errors(caplog.records) == []

    # No job lost, none run twice.
    runs = Counter(load.runs + [e["id"] for e in boss.events_of("job")])
    assert set(runs) == set(load.sent) and len(load.sent) > 200
    assert max(runs.values()) == 1

    # Each stamp written once per interval across both sides, and both sides took turns.
    trail = sql(engine, schema, "SELECT * FROM {s}.test_audit ORDER BY queue, step, stamped")
    for step, interval in (("monitor", MONITOR), ("maintain", MAINTAIN)):
        for queue in ("load", "stall", "dlq", "keep"):
            stamps = [r for r in trail if r.queue == queue and r.step == step]
            assert len(stamps) >= RUN_FOR / (interval + 1) - 2, (queue, step, stamps)
            for row in stamps:
                if row.previous is not None:
                    assert row.stamped - row.previous >= dt.timedelta(seconds=interval), row
    apps = {("node" if r.app.startswith("pgboss") else r.app) for r in trail}
    assert apps == {PY_APP, "node"}

    # Expiry: every stalled job timed out twice (one retry), then failed once, one copy each.
    stalled = sql(
        engine, schema, "SELECT state::text, retry_count, output FROM {s}.job WHERE name = 'stall'"
    )
    assert sorted((s, n) for s, n, _ in stalled) == [("failed", 1)] * 6
    assert all(o == {"value": {"message": "job timed out"}} for *_, o in stalled)
    assert states(engine, schema, "dlq")["created"] == 6

    # Retention: nothing completed in 'load' outlived its deletion turn; 'keep' kept all.
    [(last,)] = sql(
        engine, schema,
        "SELECT max(stamped) FROM {s}.test_audit WHERE queue = 'load' AND step = 'maintain'",
    )  # fmt: skip
    [(overdue,)] = sql(
        engine, schema,
        "SELECT count(*) FROM {s}.job WHERE name = 'load' AND state = 'completed' "
        "AND completed_on + interval '1 second' < :last",
        last=last - dt.timedelta(seconds=1),
    )  # fmt: skip
    assert overdue == 0
    assert states(engine, schema, "keep")["completed"] == 4 == len(kept)

    # Counters: a forced pass of each side leaves the live counts in the queue row.
    for name in ("load", "keep", "dlq"):
        Supervisor(py_engine, schema=schema, schedule=False, queues=[name]).run_once(force=True)
        assert cached_counts(engine, schema, name) == live_counts(engine, schema, name), name
    # Retained and total (pg-boss 12.38): the kept completed jobs, once a walk counted them.
    [(retained, total)] = sql(
        engine, schema, "SELECT retained_count, total_count FROM {s}.queue WHERE name = 'keep'"
    )
    assert (retained, total) == (4, 4)


@pytest.mark.parametrize("policy", ["standard", "singleton", "stately"])
def test_python_and_node_monitors_cache_the_same_counters(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any, policy: str
) -> None:
    schema = schema46_by
    boss = node46(schema)
    for name in ("by-node", "by-python"):
        in_tx(engine, schema, lambda q, n=name: q.create_queue(n, policy=policy))  # type: ignore[misc]
        for key in ("a", "b", "c"):
            boss.call("send", name, {"key": key}, {"singletonKey": key})
        boss.call("send", name, None, {"startAfter": 3600, "singletonKey": "later"})
        boss.call("fetch", name, {"batchSize": 2})  # activates a and b

    boss.call("supervise", "by-node")
    report = Supervisor(py_engine, schema=schema, schedule=False, queues=["by-python"]).run_once(
        force=True
    )
    assert "by-python" in report.monitored

    columns = (
        "deferred_count, queued_count, ready_count, blocked_count, active_count, total_count, "
        "array(SELECT unnest(singletons_active) ORDER BY 1) AS active_keys, "
        "monitor_on IS NOT NULL AS stamped"
    )
    rows = sql(
        engine,
        schema,
        f"SELECT name, {columns} FROM {{s}}.queue WHERE name LIKE 'by-%' ORDER BY name",
    )
    by_node, by_python = (tuple(r)[1:] for r in rows)
    assert by_python == by_node
    assert by_node[:6] == (1, 2, 1, 0, 2, 4)


# --------------------------------------------------------------- cron

CRON_SETTINGS: dict[str, Any] = {
    "supervise": False,
    "cron_monitor_interval": 1,
    "cron_worker_interval": 1,
}
NODE_CRON: dict[str, Any] = {
    "schedule": True,
    "cronMonitorIntervalSeconds": 1,
    "cronWorkerIntervalSeconds": 1,
}


def fired(engine: Engine, schema: str, queue: str) -> list[Any]:
    return sql(
        engine, schema,
        "SELECT data, priority, retry_limit FROM {s}.job WHERE name = :q ORDER BY created_on",
        q=queue,
    )  # fmt: skip


def send_it_slots(engine: Engine, schema: str, key: str) -> Counter[Any]:
    """Send-it jobs per minute slot for one schedule key (any state)."""
    rows = sql(
        engine, schema,
        "SELECT singleton_on, state::text FROM {s}.job WHERE name = :n AND singleton_key = :k",
        n=SEND_IT_QUEUE, k=key,
    )  # fmt: skip
    return Counter(r.singleton_on for r in rows)


def completed_slots(engine: Engine, schema: str, key: str) -> int:
    [(n,)] = sql(
        engine, schema,
        "SELECT count(DISTINCT singleton_on) FROM {s}.job WHERE name = :n AND singleton_key = :k "
        "AND state = 'completed'",
        n=SEND_IT_QUEUE, k=key,
    )  # fmt: skip
    return int(n)


def test_schedule_made_in_node_fires_through_the_python_timekeeper(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("report"))
    boss = node46(schema)  # no timekeeper on the Node side
    boss.call("schedule", "report", "* * * * *", {"from": "node"}, {"priority": 3, "retryLimit": 5})
    supervisor = Supervisor(py_engine, schema=schema, **CRON_SETTINGS)
    supervisor.start()
    try:
        assert wait_until(lambda: len(fired(engine, schema, "report")) >= 1, timeout=10)
        time.sleep(3)
    finally:
        supervisor.stop(5)
    jobs = fired(engine, schema, "report")
    assert len(jobs) == completed_slots(engine, schema, "report__")
    assert tuple(jobs[0]) == ({"from": "node"}, 3, 5)
    [(last_job,)] = sql(
        engine, schema, "SELECT last_job_id FROM {s}.schedule WHERE name = 'report'"
    )
    assert last_job is not None  # the send-it worker points the schedule at its last job


def test_schedule_made_in_python_fires_through_the_node_timekeeper(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by

    def setup(q: Any) -> None:
        q.create_queue("report")
        q.schedule("report", "* * * * *", {"from": "python"}, priority=4, retry_limit=6)

    in_tx(engine, schema, setup)
    [row] = sql(engine, schema, "SELECT kind, timezone FROM {s}.schedule WHERE name = 'report'")
    assert tuple(row) == ("cron", "UTC")
    boss = node46(schema, **NODE_CRON)
    assert wait_until(lambda: len(fired(engine, schema, "report")) >= 1, timeout=10)
    time.sleep(3)
    boss.close()
    jobs = fired(engine, schema, "report")
    assert len(jobs) == completed_slots(engine, schema, "report__")
    assert tuple(jobs[0]) == ({"from": "python"}, 4, 6)
    assert boss.errors() == []


def test_both_timekeepers_fire_each_schedule_once_per_slot(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by

    def setup(q: Any) -> None:
        q.create_queue("report_q")  # an underscore: the slot key escapes it (pg-boss 12.38)
        q.schedule("report_q", "* * * * *", {"from": "python"}, key="py")

    in_tx(engine, schema, setup)
    boss = node46(schema, **NODE_CRON)
    boss.call("schedule", "report_q", "* * * * *", {"from": "node"}, {"key": "js"})
    supervisor = Supervisor(py_engine, schema=schema, **CRON_SETTINGS)
    supervisor.start()
    try:
        time.sleep(6)
    finally:
        supervisor.stop(5)
        boss.close()
    by_source = Counter(j.data["from"] for j in fired(engine, schema, "report_q"))
    for source, key in (("python", "py"), ("node", "js")):
        slots = send_it_slots(engine, schema, f"report\\_q__{key}")
        assert slots and set(slots.values()) == {1}, (key, slots)
        assert by_source[source] == completed_slots(engine, schema, f"report\\_q__{key}") >= 1
    assert max(by_source.values()) <= 2  # 6 s can straddle at most one minute boundary
    assert boss.errors() == []


def test_schedules_stored_by_either_side_read_alike(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("report"))
    boss = node46(schema)
    in_tx(
        engine,
        schema,
        lambda q: q.schedule("report", "*/5 * * * *", {"a": 1}, key="py", tz="Europe/Paris"),
    )
    boss.call("schedule", "report", "*/5 * * * *", {"a": 1}, {"key": "js", "tz": "Europe/Paris"})
    rows = sql(
        engine, schema, "SELECT key, kind, cron, timezone, data FROM {s}.schedule ORDER BY key"
    )
    assert [tuple(r)[1:] for r in rows] == [("cron", "*/5 * * * *", "Europe/Paris", {"a": 1})] * 2
    seen = {s["key"]: s for s in boss.call("getSchedules", "report")}
    assert set(seen) == {"js", "py"} and seen["py"]["timezone"] == "Europe/Paris"
    ours = {s.key: s for s in in_tx(engine, schema, lambda q: q.get_schedules("report"))}
    assert ours["js"].cron == ours["py"].cron and ours["js"].timezone == "Europe/Paris"
    boss.call("unschedule", "report", "py")
    assert in_tx(engine, schema, lambda q: q.unschedule("report", "js"))
    assert boss.call("getSchedules", "report") == []
