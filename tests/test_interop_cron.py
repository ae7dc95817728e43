"""Interop, cron: a schedule stored by either side fires through either side's timekeeper,
once per minute slot in total (pg-boss's cron scheduling).

The timekeepers run on real time (Node's clock is the database's), at their
shortest intervals; one test waits for a minute boundary and is marked ``slow``.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.node import (
    NodeBoss,
    NodeFactory,
    in_tx,
    node,
    node_modules,
    node_url,
    py_engine,
    wait_until,
)

from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.supervision import Supervisor

__all__ = ["node", "node_modules", "node_url", "py_engine"]  # fixtures used below

pytestmark = [
    pytest.mark.interop,
]


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
    """Minute slots whose send-it job has been worked (one send-it job per slot, by i4).

    A send-it job still queued when a timekeeper stops (a minute boundary passed in
    the meantime) has not fired yet, so only completed ones count.
    """
    with engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    f'SELECT count(DISTINCT singleton_on) FROM "{schema}".job '
                    "WHERE name = :n AND singleton_key = :k AND state = 'completed'"
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
