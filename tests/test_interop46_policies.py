"""Interop at schema 46, policies: one outcome table per queue policy, played with Python and
Node pg-boss 12.38.0 taking turns, in both seatings.

A script is a list of steps taken by side ``X`` or side ``Y``; each is played once with
Python as ``X`` and Node as ``Y`` and once the other way round, on a queue created by ``X``
(in ``job_common`` and in its own partition), and every answer must be the table's. At 46
a claim skips a key held by another job rather than colliding on it (pg-boss 12.38's
``NOT EXISTS`` probes), and ``key_strict_fifo`` claims only each key's head.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import Shared46, on46, shared46_by, sql
from support.node import NodeBoss46, NodeError, in_tx, node46_modules

from alkstore_sa.errors import AlkstoreError
from alkstore_sa.names import partition_table_name

__all__ = ["node46_modules", "on46", "shared46_by"]  # fixtures

pytestmark = pytest.mark.interop

PARTITION = pytest.mark.parametrize("partition", [False, True], ids=["common", "partition"])
SEATING = pytest.mark.parametrize("x", ["python", "node"], ids=["python-first", "node-first"])

# Steps: ("send", side, key, expected label or None), ("fetch", side, n, [labels]),
# ("complete", side, label), ("fail", side, label). Labels name jobs in sending order.
SCRIPTS: dict[str, list[tuple[Any, ...]]] = {
    "standard": [
        ("send", "X", "k", "a"),
        ("send", "Y", "k", "b"),
        ("fetch", "Y", 5, ["a", "b"]),
    ],
    "short": [
        ("send", "X", "k", "a"),
        ("send", "Y", "k", None),  # one queued job per key
        ("send", "Y", "other", "b"),
        ("fetch", "X", 1, ["a"]),
        ("send", "Y", "k", "c"),  # the key's job is active: it may be queued again
    ],
    "singleton": [
        ("send", "X", "k", "a"),
        ("send", "Y", "k", "b"),
        ("send", "X", "other", "c"),
        ("fetch", "X", 1, ["a"]),
        ("fetch", "Y", 5, ["c"]),  # the busy key is skipped, the free one taken
        ("fetch", "X", 5, []),
        ("complete", "Y", "a"),
        ("fetch", "X", 5, ["b"]),
    ],
    "stately": [
        ("send", "X", "k", "a"),
        ("send", "Y", "k", None),  # one created per key
        ("fetch", "Y", 1, ["a"]),
        ("send", "X", "k", "b"),  # the created slot is free again
        ("send", "Y", "k", None),
        ("fetch", "X", 5, []),  # one active per key
        ("complete", "X", "a"),
        ("fetch", "Y", 5, ["b"]),
    ],
    "exclusive": [
        ("send", "X", "k", "a"),
        ("send", "Y", "k", None),  # queued counts
        ("fetch", "Y", 1, ["a"]),
        ("send", "X", "k", None),  # active counts too
        ("send", "Y", "k", None),
        ("complete", "X", "a"),
        ("send", "Y", "k", "b"),
    ],
    "key_strict_fifo": [
        ("send", "X", "k1", "a"),
        ("send", "Y", "k1", "b"),
        ("send", "X", "k2", "c"),
        ("send", "Y", "k2", "d"),
        ("fetch", "Y", 5, ["a", "c"]),  # each key's head only
        ("fetch", "X", 5, []),  # both keys held
        ("fail", "X", "a"),  # a goes back to retry and stays its key's head
        ("fetch", "Y", 5, ["a"]),
        ("complete", "Y", "c"),
        ("fetch", "X", 5, ["d"]),
        ("complete", "X", "a"),
        ("fetch", "Y", 5, ["b"]),
    ],
}


class Side:
    """One side's verbs, answering with job ids as text (or ``None``)."""

    def __init__(self, kind: str, engine: Engine, schema: str, boss: NodeBoss46) -> None:
        self.kind, self.engine, self.schema, self.boss = kind, engine, schema, boss

    def tx(self, fn: Any) -> Any:
        return in_tx(self.engine, self.schema, fn)

    def create(self, name: str, policy: str, partition: bool) -> None:
        options = {"policy": policy, "partition": partition}
        if self.kind == "python":
            self.tx(lambda q: q.create_queue(name, retry_limit=1, retry_delay=0, **options))
        else:
            self.boss.call("createQueue", name, {**options, "retryLimit": 1, "retryDelay": 0})

    def send(self, name: str, key: str | None) -> str | None:
        if self.kind == "python":
            job_id = self.tx(lambda q: q.send(name, {"key": key}, singleton_key=key))
            return None if job_id is None else str(job_id)
        options = {} if key is None else {"singletonKey": key}
        result = self.boss.call("send", name, {"key": key}, options)
        return None if result is None else str(result)

    def fetch(self, name: str, n: int) -> list[str]:
        if self.kind == "python":
            return [str(j.id) for j in self.tx(lambda q: q.fetch(name, n))]
        return [j["id"] for j in self.boss.call("fetch", name, {"batchSize": n})]

    def complete(self, name: str, job_id: str) -> None:
        if self.kind == "python":
            assert self.tx(lambda q: q.complete(name, job_id)).count == 1
        else:
            assert self.boss.call("complete", name, job_id)["affected"] == 1

    def fail(self, name: str, job_id: str) -> None:
        if self.kind == "python":
            assert self.tx(lambda q: q.fail(name, job_id, {"e": 1})).count == 1
        else:
            assert self.boss.call("fail", name, job_id, {"e": 1})["affected"] == 1


def play(x: Side, y: Side, policy: str, partition: bool, queue: str) -> list[Any]:
    """Play the policy's script on a new queue; return every answer, ids replaced by labels."""
    x.create(queue, policy, partition)
    sides, labels, answers = {"X": x, "Y": y}, {}, []
    names: dict[str, str] = {}
    for step in SCRIPTS[policy]:
        verb, who = step[0], sides[step[1]]
        if verb == "send":
            job_id = who.send(queue, step[2])
            if job_id is not None and step[3] is not None:
                labels[job_id], names[step[3]] = step[3], job_id
            answers.append(None if job_id is None else labels.get(job_id, job_id))
        elif verb == "fetch":
            answers.append(sorted(labels.get(i, i) for i in who.fetch(queue, step[2])))
        else:
            getattr(who, verb)(queue, names[step[2]])
            answers.append(verb)
    return answers


def expected(policy: str) -> list[Any]:
    return [
        step[3] if step[0] == "send" else sorted(step[3]) if step[0] == "fetch" else step[0]
        for step in SCRIPTS[policy]
    ]


@SEATING
@PARTITION
@pytest.mark.parametrize("policy", list(SCRIPTS))
def test_each_policy_gives_the_same_outcome_table_whoever_takes_each_step(
    engine: Engine, on46: Shared46, policy: str, partition: bool, x: str
) -> None:
    boss = on46.boss
    python = Side("python", engine, on46.schema, boss)
    node = Side("node", engine, on46.schema, boss)
    first, second = (python, node) if x == "python" else (node, python)
    assert play(first, second, policy, partition, on46.queue()) == expected(policy)
    assert boss.errors() == []


@PARTITION
@pytest.mark.parametrize("creator", ["python", "node"])
def test_key_strict_fifo_refuses_a_job_without_a_key_on_both_sides(
    engine: Engine, on46: Shared46, partition: bool, creator: str
) -> None:
    boss, schema, name = on46.boss, on46.schema, on46.queue()
    Side(creator, engine, schema, boss).create(name, "key_strict_fifo", partition)
    with pytest.raises(NodeError):
        boss.call("send", name, {"n": 1})
    with pytest.raises(AlkstoreError):
        in_tx(engine, schema, lambda q: q.send(name, {"n": 1}))
    assert sql(engine, schema, "SELECT count(*) FROM {s}.job WHERE name = :n", n=name) == [(0,)]


@PARTITION
def test_partitions_made_by_either_side_have_the_same_indexes_for_every_policy(
    engine: Engine, on46: Shared46, partition: bool
) -> None:
    boss, schema46_by, tag = on46.boss, on46.schema, on46.queue("")
    python = Side("python", engine, schema46_by, boss)
    node = Side("node", engine, schema46_by, boss)
    for policy in SCRIPTS:
        python.create(f"py-{policy}{tag}", policy, partition)
        node.create(f"js-{policy}{tag}", policy, partition)

    def indexes(queue: str) -> list[str]:
        table = partition_table_name(queue) if partition else "job_common"
        rows = sql(
            engine,
            schema46_by,
            "SELECT replace(indexdef, :t, 'T') FROM pg_indexes "
            "WHERE schemaname = :s AND tablename = :t ORDER BY 1",
            s=schema46_by,
            t=table,
        )
        return [r[0] for r in rows]

    for policy in SCRIPTS:
        assert indexes(f"py-{policy}{tag}") == indexes(f"js-{policy}{tag}")
    queues = {q["name"]: q for q in boss.call("getQueues")}
    for policy in SCRIPTS:
        ours = in_tx(engine, schema46_by, lambda q, p=policy: q.get_queue(f"js-{p}{tag}"))  # type: ignore[misc]
        assert str(ours.policy) == queues[f"py-{policy}{tag}"]["policy"] == policy
