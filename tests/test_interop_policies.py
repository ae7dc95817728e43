"""Interop, queues and policies: a queue made on one side works on the other, and
its policy binds both (pg-boss's create_queue() function, queue policies).

The policy lives in unique indexes, so it holds whoever sends or fetches; these
tests take one step on each side and check the other side's answer.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.node import NodeBoss, NodeFactory, in_tx, node, node_modules, node_url

from alkstore_sa.names import partition_table_name

__all__ = ["node", "node_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop

POLICIES = ["standard", "short", "singleton", "stately", "exclusive"]
PARTITION = pytest.mark.parametrize("partition", [False, True], ids=["common", "partition"])


def py_create(engine: Engine, schema: str, name: str, policy: str, partition: bool) -> None:
    in_tx(
        engine,
        schema,
        lambda q: q.create_queue(name, policy=policy, partition=partition, retry_limit=1),
    )


def js_create(boss: NodeBoss, name: str, policy: str, partition: bool) -> None:
    boss.call("createQueue", name, {"policy": policy, "partition": partition, "retryLimit": 1})


def py_send(engine: Engine, schema: str, name: str, key: str) -> Any:
    return in_tx(engine, schema, lambda q: q.send(name, {"key": key}, singleton_key=key))


def js_send(boss: NodeBoss, name: str, key: str) -> Any:
    return boss.call("send", name, {"key": key}, {"singletonKey": key})


def py_fetch(engine: Engine, schema: str, name: str, batch_size: int = 1) -> list[str]:
    jobs = in_tx(engine, schema, lambda q: q.fetch(name, batch_size))
    return [str(j.id) for j in jobs]


def js_fetch(boss: NodeBoss, name: str, batch_size: int = 1) -> list[str]:
    return [j["id"] for j in boss.call("fetch", name, {"batchSize": batch_size})]


# --------------------------------------------------------------- queues


@PARTITION
@pytest.mark.parametrize("policy", POLICIES)
def test_queue_created_by_python_is_used_from_node(
    engine: Engine, schema: str, node: NodeFactory, policy: str, partition: bool
) -> None:
    py_create(engine, schema, "mail", policy, partition)
    boss = node(schema)

    seen = boss.call("getQueue", "mail")
    expected_table = partition_table_name("mail") if partition else "job_common"
    assert (seen["policy"], seen["partition"], seen["table"], seen["retryLimit"]) == (
        policy,
        partition,
        expected_table,
        1,
    )
    job_id = js_send(boss, "mail", "k")
    assert py_fetch(engine, schema, "mail") == [job_id]
    in_tx(engine, schema, lambda q: q.complete("mail", job_id))
    assert boss.call("getJobById", "mail", job_id)["state"] == "completed"


@PARTITION
@pytest.mark.parametrize("policy", POLICIES)
def test_queue_created_by_node_is_used_from_python(
    engine: Engine, schema: str, node: NodeFactory, policy: str, partition: bool
) -> None:
    boss = node(schema)
    js_create(boss, "mail", policy, partition)

    info = in_tx(engine, schema, lambda q: q.get_queue("mail"))
    expected_table = partition_table_name("mail") if partition else "job_common"
    assert (info.policy, info.partition, info.table_name, info.retry_limit) == (
        policy,
        partition,
        expected_table,
        1,
    )
    job_id = py_send(engine, schema, "mail", "k")
    assert js_fetch(boss, "mail") == [str(job_id)]
    boss.call("complete", "mail", str(job_id))
    assert in_tx(engine, schema, lambda q: q.get_job("mail", job_id)).state == "completed"


@PARTITION
def test_partition_made_by_either_side_has_the_same_indexes(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    boss = node(schema)
    for policy in POLICIES:
        py_create(engine, schema, f"py-{policy}", policy, partition)
        js_create(boss, f"js-{policy}", policy, partition)

    def indexes(queue: str) -> list[str]:
        table = partition_table_name(queue) if partition else "job_common"
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT replace(indexdef, :t, 'T') FROM pg_indexes "
                    "WHERE schemaname = :s AND tablename = :t ORDER BY 1"
                ),
                {"s": schema, "t": table},
            )
            return list(rows.scalars())

    for policy in POLICIES:
        assert indexes(f"py-{policy}") == indexes(f"js-{policy}")


def test_queue_deleted_by_python_is_gone_for_node(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    boss = node(schema)
    js_create(boss, "mail", "standard", True)
    js_send(boss, "mail", "k")
    assert in_tx(engine, schema, lambda q: q.delete_queue("mail"))
    assert boss.call("getQueue", "mail") is None
    with engine.connect() as conn:
        table = f"{schema}.{partition_table_name('mail')}"
        found = conn.execute(text("SELECT to_regclass(:t)"), {"t": table}).scalar()
    assert found is None


def test_node_sends_to_a_queue_python_created_after_node_started(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    boss = node(schema)
    assert boss.call("getQueues") == []
    py_create(engine, schema, "late", "short", False)
    # A cache miss makes Node read the queue row at once.
    assert js_send(boss, "late", "k") is not None
    assert js_send(boss, "late", "k") is None


def test_node_send_to_a_queue_python_deleted_is_dropped_with_null(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    boss = node(schema)
    py_create(engine, schema, "gone", "standard", False)
    assert js_send(boss, "gone", "k") is not None
    assert in_tx(engine, schema, lambda q: q.delete_queue("gone"))
    # Node still has the queue in its cache (up to 60 s): no error, no job.
    assert js_send(boss, "gone", "k") is None
    with engine.connect() as conn:
        left = conn.execute(text(f'SELECT count(*) FROM "{schema}".job')).scalar_one()
    assert left == 0


# --------------------------------------------------------------- policies


@PARTITION
def test_standard_queue_accepts_the_same_key_from_both_sides(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    py_create(engine, schema, "q", "standard", partition)
    boss = node(schema)
    assert py_send(engine, schema, "q", "k") is not None
    assert js_send(boss, "q", "k") is not None
    assert len(js_fetch(boss, "q", 5)) == 2


@PARTITION
def test_short_job_queued_by_python_makes_node_send_with_the_key_return_null(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    py_create(engine, schema, "q", "short", partition)
    boss = node(schema)
    assert py_send(engine, schema, "q", "k") is not None
    assert js_send(boss, "q", "k") is None
    assert js_send(boss, "q", "other") is not None


@PARTITION
def test_short_job_queued_by_node_makes_python_send_with_the_key_return_none(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    boss = node(schema)
    js_create(boss, "q", "short", partition)
    assert js_send(boss, "q", "k") is not None
    assert py_send(engine, schema, "q", "k") is None
    # Once the queued job is active, the key may be queued again.
    assert len(js_fetch(boss, "q")) == 1
    assert py_send(engine, schema, "q", "k") is not None


@PARTITION
def test_singleton_key_active_in_node_blocks_a_python_fetch_of_the_key(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    boss = node(schema)
    js_create(boss, "q", "singleton", partition)
    first, second = js_send(boss, "q", "k"), js_send(boss, "q", "k")
    assert js_fetch(boss, "q") == [first]

    assert py_fetch(engine, schema, "q") == []
    assert py_fetch(engine, schema, "q", batch_size=5) == []
    boss.call("complete", "q", first)
    assert py_fetch(engine, schema, "q") == [second]


@PARTITION
def test_singleton_key_active_in_python_blocks_a_node_fetch_of_the_key(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    py_create(engine, schema, "q", "singleton", partition)
    boss = node(schema)
    first = str(py_send(engine, schema, "q", "k"))
    py_send(engine, schema, "q", "k")
    other = str(py_send(engine, schema, "q", "other"))
    assert py_fetch(engine, schema, "q") == [first]

    assert js_fetch(boss, "q") == []
    # Node's batch meets the busy key and comes back empty as a whole (its unique
    # violation is swallowed); ours skips the busy key and takes the free one.
    assert js_fetch(boss, "q", 5) == []
    # PostgreSQL reports Node's failed claim a moment before it releases that
    # statement's row locks, and SKIP LOCKED passes over locked rows: ask again.
    claimed: list[str] = []
    for _ in range(20):
        claimed = py_fetch(engine, schema, "q", 5)
        if claimed:
            break
        time.sleep(0.05)
    assert claimed == [other]


@PARTITION
def test_stately_queue_allows_one_job_per_state_and_key_across_sides(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    py_create(engine, schema, "q", "stately", partition)
    boss = node(schema)
    created = js_send(boss, "q", "k")
    assert created is not None
    assert py_send(engine, schema, "q", "k") is None  # one created per key
    assert py_fetch(engine, schema, "q") == [created]
    again = js_send(boss, "q", "k")  # the created slot is free again
    assert again is not None and py_send(engine, schema, "q", "k") is None
    assert js_fetch(boss, "q") == []  # one active per key


@PARTITION
def test_exclusive_key_active_in_node_refuses_sends_from_both_sides(
    engine: Engine, schema: str, node: NodeFactory, partition: bool
) -> None:
    py_create(engine, schema, "q", "exclusive", partition)
    boss = node(schema)
    job_id = str(py_send(engine, schema, "q", "k"))
    assert js_send(boss, "q", "k") is None  # queued counts
    assert js_fetch(boss, "q") == [job_id]
    assert py_send(engine, schema, "q", "k") is None  # active counts too
    assert js_send(boss, "q", "k") is None
    in_tx(engine, schema, lambda q: q.complete("q", job_id))
    assert js_send(boss, "q", "k") is not None
