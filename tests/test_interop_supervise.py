"""Interop, supervision: Node pg-boss and our Supervisor watch one schema together.

Both sides throttle each step through the same columns (``queue.monitor_on``,
``queue.maintain_on``, ``version.cron_on``) and take the same advisory locks
(pg-boss's advisory-lock keys), so every step runs once per interval across both.
A test-only trigger records who won each throttle window (by application_name).
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
from sqlalchemy import Engine, text
from support.node import (
    PY_APP,
    NodeBoss,
    NodeFactory,
    in_tx,
    node,
    node_modules,
    node_url,
    py_engine,
    wait_until,
)

from alkstore_sa import Job, JobSpec, QueueService
from alkstore_sa.supervision import Supervisor
from alkstore_sa.worker import Worker

__all__ = ["node", "node_modules", "node_url", "py_engine"]  # fixtures used below

pytestmark = [
    pytest.mark.interop,
]

NODE_APP = "pgboss"  # Node pg-boss's default application_name


def install_audit(engine: Engine, schema: str) -> None:
    """Record every change of a throttle column with the winner's application_name."""
    s = f'"{schema}"'
    with engine.begin() as conn:
        conn.execute(
            text(
                f"CREATE TABLE {s}.test_audit (queue text, step text, "
                "previous timestamptz, stamped timestamptz, app text)"
            )
        )
        conn.execute(
            text(
                f"""
                CREATE FUNCTION {s}.test_audit_fn() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN
                  IF NEW.monitor_on IS DISTINCT FROM OLD.monitor_on THEN
                    INSERT INTO {s}.test_audit VALUES (NEW.name, 'monitor', OLD.monitor_on,
                      NEW.monitor_on, current_setting('application_name'));
                  END IF;
                  IF NEW.maintain_on IS DISTINCT FROM OLD.maintain_on THEN
                    INSERT INTO {s}.test_audit VALUES (NEW.name, 'maintain', OLD.maintain_on,
                      NEW.maintain_on, current_setting('application_name'));
                  END IF;
                  RETURN NEW;
                END $$"""
            )
        )
        conn.execute(
            text(
                f"CREATE TRIGGER test_audit AFTER UPDATE ON {s}.queue "
                f"FOR EACH ROW EXECUTE FUNCTION {s}.test_audit_fn()"
            )
        )


def audit(engine: Engine, schema: str) -> list[Any]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(f'SELECT * FROM "{schema}".test_audit ORDER BY queue, step, stamped')
            ).all()
        )


def count(engine: Engine, schema: str, where: str, **params: Any) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(f'SELECT count(*) FROM "{schema}".job WHERE {where}'), params
            ).scalar_one()
        )


def python_errors(records: list[logging.LogRecord]) -> list[str]:
    return [
        r.getMessage()
        for r in records
        if r.name.startswith("alkstore_sa") and r.levelno >= logging.ERROR
    ]


# --------------------------------------------------------------- supervision under load

MONITOR = 2  # seconds: monitor_interval / monitorIntervalSeconds
MAINTAIN = 3  # seconds: maintenance_interval / maintenanceIntervalSeconds
RUN_FOR = 20.0  # seconds of load


def send_batch(q: QueueService, batch: list[JobSpec]) -> list[Any]:
    return q.send_many("load", batch)


class Load:
    """Senders on both sides and workers on both sides, counting every run."""

    def __init__(self, engine: Engine, schema: str, boss: NodeBoss) -> None:
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


def test_node_and_python_supervisors_share_the_work_under_load(
    engine: Engine,
    py_engine: Engine,
    schema: str,
    node: NodeFactory,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="alkstore_sa")

    def create(q: Any) -> None:
        q.create_queue("dlq")
        q.create_queue("load", deletion_seconds=1)
        q.create_queue("stall", expire_seconds=1, retry_limit=1, dead_letter="dlq")

    in_tx(engine, schema, create)
    install_audit(engine, schema)

    boss = node(
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
    stall_jobs: list[JobSpec] = [{"data": {"by": "python", "i": i}} for i in range(3)]
    in_tx(engine, schema, lambda q: q.send_many("stall", stall_jobs))
    for i in range(3):
        boss.call("send", "stall", {"by": "node", "i": i})

    supervisor.start()
    worker.start()
    sender = threading.Thread(target=load.send_loop, daemon=True)
    sender.start()
    started = time.monotonic()
    try:
        while time.monotonic() - started < RUN_FOR:
            # Keep taking the stalled jobs (first attempts and retries) and dropping them.
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
    # Node's errors are read before it stops: pg-boss 11.1.2's own supervision pass, caught
    # by stop() mid-way, fails on its closed pool ("Cannot destructure property 'rows'").
    node_errors = boss.errors()
    boss.close()

    # No errors on either side.
    assert load.errors == []
    assert node_errors == []
    assert python_errors(caplog.records) == []

    # No job lost, none run twice.
    runs = Counter(load.runs + [e["id"] for e in boss.events_of("job")])
    assert set(runs) == set(load.sent) and len(load.sent) > 200
    assert max(runs.values()) == 1

    # Each throttle window was won by exactly one side, and both sides took turns.
    trail = audit(engine, schema)
    for step, interval in (("monitor", MONITOR), ("maintain", MAINTAIN)):
        for queue in ("load", "stall", "dlq"):
            stamps = [r for r in trail if r.queue == queue and r.step == step]
            assert len(stamps) >= RUN_FOR / (interval + 1) - 2, (queue, step, stamps)
            for row in stamps:
                if row.previous is not None:
                    assert row.stamped - row.previous > dt.timedelta(seconds=interval)
    assert {r.app for r in trail} == {PY_APP, NODE_APP}

    # Expiration: every stalled job timed out twice (one retry), then failed once,
    # with exactly one dead-letter copy each.
    with engine.connect() as conn:
        stalled = conn.execute(
            text(f"SELECT state::text, retry_count, output FROM \"{schema}\".job "
                 "WHERE name = 'stall'")
        ).all()  # fmt: skip
    assert [(s, n) for s, n, _ in stalled] == [("failed", 1)] * 6
    assert all(o == {"value": {"message": "job timed out"}} for *_, o in stalled)
    assert count(engine, schema, "name = 'dlq'") == 6

    # Deletion: what is left completed was not yet due at the last deletion turn.
    with engine.connect() as conn:
        last = conn.execute(
            text(f"SELECT max(stamped) FROM \"{schema}\".test_audit "
                 "WHERE queue = 'load' AND step = 'maintain'")
        ).scalar_one()  # fmt: skip
        overdue = conn.execute(
            text(f"SELECT count(*) FROM \"{schema}\".job WHERE name = 'load' "
                 "AND state = 'completed' AND completed_on + interval '1 second' < :last"),
            {"last": last},
        ).scalar_one()  # fmt: skip
    assert overdue == 0
    assert count(engine, schema, "name = 'load'") < len(load.sent)


def node_runs(boss: NodeBoss) -> set[str]:
    return {e["id"] for e in boss.events_of("job")}


# --------------------------------------------------------------- monitor results


@pytest.mark.parametrize("policy", ["singleton", "stately", "standard"])
def test_python_and_node_monitors_cache_the_same_counters(
    engine: Engine, py_engine: Engine, schema: str, node: NodeFactory, policy: str
) -> None:
    boss = node(schema)
    for name in ("by-node", "by-python"):
        in_tx(engine, schema, lambda q, n=name: q.create_queue(n, policy=policy))  # type: ignore[misc]
        for key in ("a", "b", "c"):
            boss.call("send", name, {"key": key}, {"singletonKey": key})
        boss.call("send", name, None, {"startAfter": 3600, "singletonKey": "later"})
        boss.call("fetch", name, {"batchSize": 2})  # activates a and b

    boss.call("supervise", "by-node")
    report = Supervisor(py_engine, schema=schema, schedule=False, queues=["by-python"]).run_once()
    assert report.monitored == ("by-python",)

    columns = (
        "deferred_count, queued_count, active_count, total_count, "
        "array(SELECT unnest(singletons_active) ORDER BY 1) AS active_keys"
    )
    with engine.connect() as conn:
        rows = conn.execute(
            text(f'SELECT name, {columns} FROM "{schema}".queue WHERE name LIKE \'by-%\' '
                 "ORDER BY name")
        ).all()  # fmt: skip
    by_node, by_python = (tuple(r)[1:] for r in rows)
    assert by_python == by_node
    assert by_node[:4] == (1, 2, 2, 4)
