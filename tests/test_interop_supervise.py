"""Interop, supervision: Node pg-boss and our Supervisor watch one schema together.

Both sides throttle each step through the same columns (``queue.monitor_on``,
``queue.maintain_on``, ``version.cron_on``) and take the same advisory locks
(reference §2.9, §9, §12), so every step runs once per interval across both.
A test-only trigger records who won each throttle window (by application_name).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from support.node import NodeBoss, NodeFactory, in_tx, node, node_modules, node_url

from alkstore_sa import Job, JobSpec, QueueService
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.worker import Worker

try:
    from alkstore_sa.worker.supervisor import Supervisor
except ImportError:  # pragma: no cover - while the supervisor is being written
    Supervisor = None  # type: ignore[assignment,misc]

__all__ = ["node", "node_modules", "node_url"]  # fixtures used below

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(Supervisor is None, reason="alkstore_sa.worker.supervisor is missing"),
]

PY_APP = "alkstore-interop"
NODE_APP = "pgboss"  # Node pg-boss's default application_name


@pytest.fixture
def py_engine(database_url: str) -> Iterator[Engine]:
    """The Python side's engine, named so the audit trigger can tell it from Node."""
    eng = create_engine(database_url, connect_args={"application_name": PY_APP})
    yield eng
    eng.dispose()


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


def wait_until(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


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
    boss.close()

    # No errors on either side.
    assert load.errors == []
    assert boss.errors() == []
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
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    f'SELECT data, priority, retry_limit FROM "{schema}".job WHERE name = :q '
                    "ORDER BY created_on"
                ),
                {"q": queue},
            ).all()
        )


def send_it_slots(engine: Engine, schema: str, key: str) -> int:
    """Minute slots in which the schedule was fired (one send-it job each, by i4)."""
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    f'SELECT count(DISTINCT singleton_on) FROM "{schema}".job '
                    "WHERE name = :n AND singleton_key = :k"
                ),
                {"n": SEND_IT_QUEUE, "k": key},
            ).scalar_one()
        )


def test_schedule_made_in_node_fires_through_the_python_timekeeper(
    engine: Engine, py_engine: Engine, schema: str, node: NodeFactory
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("report"))
    boss = node(schema)  # no timekeeper on the Node side
    boss.call("schedule", "report", "* * * * *", {"from": "node"}, {"priority": 3, "retryLimit": 5})

    supervisor = Supervisor(py_engine, schema=schema, **CRON_SETTINGS)
    supervisor.start()
    try:
        assert wait_until(lambda: len(fired(engine, schema, "report")) >= 1, timeout=10)
        time.sleep(3)  # more cron checks: none may fire again in the same minute
    finally:
        supervisor.stop(5)

    jobs = fired(engine, schema, "report")
    assert len(jobs) == send_it_slots(engine, schema, "report__")
    assert tuple(jobs[0]) == ({"from": "node"}, 3, 5)


def test_schedule_made_in_python_fires_through_the_node_timekeeper(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    def setup(q: Any) -> None:
        q.create_queue("report")
        q.schedule("report", "* * * * *", {"from": "python"}, priority=4, retry_limit=6)

    in_tx(engine, schema, setup)
    boss = node(schema, **NODE_CRON)
    assert wait_until(lambda: len(fired(engine, schema, "report")) >= 1, timeout=10)
    time.sleep(3)
    boss.close()

    jobs = fired(engine, schema, "report")
    assert len(jobs) == send_it_slots(engine, schema, "report__")
    assert tuple(jobs[0]) == ({"from": "python"}, 4, 6)
    assert boss.errors() == []


def _run_both_timekeepers(
    engine: Engine, py_engine: Engine, schema: str, node: NodeFactory, until: Callable[[], bool]
) -> NodeBoss:
    def setup(q: Any) -> None:
        q.create_queue("report")
        q.schedule("report", "* * * * *", {"from": "python"}, key="py")

    in_tx(engine, schema, setup)
    boss = node(schema, **NODE_CRON)
    boss.call("schedule", "report", "* * * * *", {"from": "node"}, {"key": "js"})
    supervisor = Supervisor(py_engine, schema=schema, **CRON_SETTINGS)
    supervisor.start()
    try:
        while not until():
            time.sleep(0.2)
    finally:
        supervisor.stop(5)
        boss.close()
    return boss


def test_both_timekeepers_fire_each_schedule_once_per_minute(
    engine: Engine, py_engine: Engine, schema: str, node: NodeFactory
) -> None:
    ends = time.monotonic() + 6
    boss = _run_both_timekeepers(engine, py_engine, schema, node, lambda: time.monotonic() > ends)

    jobs = fired(engine, schema, "report")
    by_source = Counter(j.data["from"] for j in jobs)
    assert by_source["python"] == send_it_slots(engine, schema, "report__py") >= 1
    assert by_source["node"] == send_it_slots(engine, schema, "report__js") >= 1
    assert max(by_source.values()) <= 2  # 6 s can straddle at most one minute boundary
    assert boss.errors() == []


@pytest.mark.slow
def test_both_timekeepers_fire_again_in_the_next_minute_and_only_once(
    engine: Engine, py_engine: Engine, schema: str, node: NodeFactory
) -> None:
    now = dt.datetime.now(dt.UTC)
    if now.second >= 50:  # too close to the boundary to be sure of a first fire before it
        time.sleep(61 - now.second - now.microsecond / 1e6)
        now = dt.datetime.now(dt.UTC)
    # Run until 4 s into the next minute (at most ~64 s, ~74 s with the wait above).
    next_minute = now.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    ends = time.monotonic() + (next_minute - now).total_seconds() + 4
    boss = _run_both_timekeepers(engine, py_engine, schema, node, lambda: time.monotonic() > ends)

    by_source = Counter(j.data["from"] for j in fired(engine, schema, "report"))
    assert by_source == Counter({"python": 2, "node": 2})
    assert send_it_slots(engine, schema, "report__py") == 2
    assert send_it_slots(engine, schema, "report__js") == 2
    assert boss.errors() == []


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
