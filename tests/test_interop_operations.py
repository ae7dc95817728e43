"""Interop, other operations: publish/subscribe, cancel/resume/retry, queue updates,
live stats and schedule storage, each started on one side and checked on the other
(pg-boss's job and queue operations, cron scheduling).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from support.node import NodeFactory, in_tx, node, node_modules, node_url, to_node_options

__all__ = ["node", "node_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop

SEND_OPTIONS: dict[str, Any] = {
    "priority": 7,
    "start_after": 30,
    "singleton_key": "order-1",
    "singleton_seconds": 3600,
    "expire_seconds": 60,
    "retention_seconds": 7200,
    "deletion_seconds": 300,
    "retry_limit": 3,
    "retry_delay": 4,
    "retry_backoff": True,
    "retry_delay_max": 30,
}


def make_queues(engine: Engine, schema: str, name: str, **options: Any) -> None:
    def create(q: Any) -> None:
        q.create_queue("dlq")
        q.create_queue(name, dead_letter="dlq", **options)

    in_tx(engine, schema, create)


# --------------------------------------------------------------- publish / subscribe


def test_python_publish_reaches_queues_subscribed_from_both_sides(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "billing")
    in_tx(engine, schema, lambda q: q.create_queue("audit"))
    boss = node(schema)
    boss.call("subscribe", "order.paid", "billing")
    in_tx(engine, schema, lambda q: q.subscribe("order.paid", "audit"))

    in_tx(engine, schema, lambda q: q.publish("order.paid", {"order": 7}))

    [billed] = boss.call("fetch", "billing")
    [audited] = in_tx(engine, schema, lambda q: q.fetch("audit"))
    assert billed["data"] == audited.data == {"order": 7}


def test_node_publish_reaches_queues_subscribed_from_both_sides(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "billing")
    in_tx(engine, schema, lambda q: q.create_queue("audit"))
    boss = node(schema)
    in_tx(engine, schema, lambda q: q.subscribe("order.paid", "billing"))
    boss.call("subscribe", "order.paid", "audit")

    boss.call("publish", "order.paid", {"order": 8})

    [billed] = in_tx(engine, schema, lambda q: q.fetch("billing"))
    [audited] = boss.call("fetch", "audit")
    assert billed.data == audited["data"] == {"order": 8}


def test_unsubscribe_from_python_stops_node_publish_reaching_the_queue(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("audit"))
    boss = node(schema)
    boss.call("subscribe", "order.paid", "audit")
    assert in_tx(engine, schema, lambda q: q.unsubscribe("order.paid", "audit"))
    boss.call("publish", "order.paid", {"order": 9})
    assert in_tx(engine, schema, lambda q: q.fetch("audit")) == []


# --------------------------------------------------------------- other operations


def test_cancel_resume_and_retry_cross_sides(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders", retry_limit=0)
    boss = node(schema)
    job_id = boss.call("send", "orders", {"n": 1})

    assert in_tx(engine, schema, lambda q: q.cancel("orders", job_id)).count == 1
    assert boss.call("getJobById", "orders", job_id)["state"] == "cancelled"
    assert boss.call("resume", "orders", job_id)["affected"] == 1
    [job] = in_tx(engine, schema, lambda q: q.fetch("orders"))
    boss.call("fail", "orders", job_id, {"reason": "boom"})
    assert in_tx(engine, schema, lambda q: q.retry("orders", job_id)).count == 1

    [again] = boss.call("fetch", "orders", {"includeMetadata": True})
    assert again["id"] == job_id == str(job.id)
    # One more attempt: retry_limit was raised by one, and the re-fetch counted it.
    assert (again["retryLimit"], again["retryCount"]) == (1, 1)


def test_queue_settings_changed_in_python_apply_to_the_next_node_send(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    boss.call("send", "orders", None)  # Node has the queue cached now
    in_tx(engine, schema, lambda q: q.update_queue("orders", retry_limit=9, expire_seconds=30))
    # Sends read the queue row in SQL, so the cache does not hold old settings back.
    job_id = boss.call("send", "orders", None)
    job = in_tx(engine, schema, lambda q: q.get_job("orders", job_id))
    assert (job.retry_limit, job.expire_seconds) == (9, 30)


def test_queue_settings_changed_in_node_apply_to_the_next_python_send(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    boss.call("updateQueue", "orders", {"retryLimit": 7, "deleteAfterSeconds": 99})
    info = in_tx(engine, schema, lambda q: q.get_queue("orders"))
    job_id = in_tx(engine, schema, lambda q: q.send("orders", None))
    job = in_tx(engine, schema, lambda q: q.get_job("orders", job_id))
    assert (info.retry_limit, info.deletion_seconds) == (7, 99)
    assert (job.retry_limit, job.deletion_seconds) == (7, 99)


def test_live_queue_stats_agree_between_python_and_node(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "orders")
    boss = node(schema)
    for n in range(3):
        boss.call("send", "orders", {"n": n})
    boss.call("send", "orders", None, {"startAfter": 3600})
    in_tx(engine, schema, lambda q: q.fetch("orders"))

    live = boss.call("getQueueStats", "orders")
    ours = in_tx(engine, schema, lambda q: q.get_queue_stats("orders"))
    assert (live["deferredCount"], live["queuedCount"], live["activeCount"]) == (1, 3, 1)
    assert (ours.deferred_count, ours.queued_count, ours.active_count, ours.total_count) == (
        live["deferredCount"],
        live["queuedCount"],
        live["activeCount"],
        live["totalCount"],
    )


# --------------------------------------------------------------- schedules (storage)


def test_schedule_rows_are_identical_whichever_side_stores_them(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "report")
    boss = node(schema)
    in_tx(
        engine,
        schema,
        lambda q: q.schedule(
            "report", "*/5 * * * *", {"a": 1}, key="k", tz="Europe/Paris", **SEND_OPTIONS
        ),
    )
    [ours] = in_tx(engine, schema, lambda q: q.get_schedules("report"))
    node_options = {"key": "k", "tz": "Europe/Paris", **to_node_options(SEND_OPTIONS)}
    boss.call("schedule", "report", "*/5 * * * *", {"a": 1}, node_options)  # same key: replaces
    [theirs] = in_tx(engine, schema, lambda q: q.get_schedules("report"))

    assert (ours.cron, ours.timezone, ours.data, ours.options) == (
        theirs.cron,
        theirs.timezone,
        theirs.data,
        theirs.options,
    )
    assert theirs.updated_on > ours.updated_on


def test_unschedule_in_node_removes_a_python_schedule(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    make_queues(engine, schema, "report")
    in_tx(engine, schema, lambda q: q.schedule("report", "0 * * * *", key="hourly"))
    boss = node(schema)
    assert [s["key"] for s in boss.call("getSchedules", "report", "hourly")] == ["hourly"]
    boss.call("unschedule", "report", "hourly")
    assert in_tx(engine, schema, lambda q: q.get_schedules("report")) == []
