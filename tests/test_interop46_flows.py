"""Interop at schema 46, flows: jobs with dependencies shared with Node pg-boss 12.38.0.

- The same graph sent by Node's ``flow()`` and by ``QueueService.flow`` writes the same
  rows: options, ``blocked``, ``blocking``, ``pending_dependencies`` and ``job_dependency``.
- A flow sent from Python is worked and released by Node alone (its workers and its
  background flow resolver); a flow sent by Node is worked and released by our Worker
  and its supervisor alone. Either way every job starts only after all its parents
  completed.
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import schema46_by, sql, states, wait_until
from support.node import in_tx, node46, node46_modules, node_url

from alkstore_sa.worker import Worker

__all__ = ["node46", "node46_modules", "node_url", "schema46_by"]  # fixtures

pytestmark = pytest.mark.interop

# A diamond over two queues, then a tail: p1, p2 -> c -> d, with options on some jobs.
GRAPH: list[Any] = [
    {"ref": "p1", "name": "fa", "data": {"n": 1}, "options": {"priority": 3}},
    {"ref": "p2", "name": "fb", "data": {"n": 2}, "options": {"retry_limit": 5}},
    {"ref": "c", "name": "fb", "data": {"n": 3}, "depends_on": ["p1", "p2"]},
    {"ref": "d", "name": "fa", "data": {"n": 4}, "depends_on": ["c"]},
]

NODE_OPTIONS = {"priority": "priority", "retry_limit": "retryLimit"}


def as_node(graph: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for job in graph:
        node: dict[str, Any] = {"ref": job["ref"], "name": job["name"], "data": job["data"]}
        if "options" in job:
            node["options"] = {NODE_OPTIONS[k]: v for k, v in job["options"].items()}
        if "depends_on" in job:
            node["dependsOn"] = job["depends_on"]
        out.append(node)
    return out


COLUMNS = (
    "name, data, priority, state::text, retry_limit, retry_delay, retry_backoff, "
    "expire_seconds, deletion_seconds, keep_until - start_after AS retention, policy, "
    "dead_letter, heartbeat_seconds, singleton_key, singleton_on, group_id, blocked, "
    "blocking, pending_dependencies"
)


def rows_by_ref(engine: Engine, schema: str, ids: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for ref, job_id in ids.items():
        [row] = sql(engine, schema, f"SELECT {COLUMNS} FROM {{s}}.job WHERE id = :i", i=str(job_id))
        out[ref] = tuple(row)
    return out


def edges(engine: Engine, schema: str, ids: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    ref_of = {str(v): k for k, v in ids.items()}
    rows = sql(
        engine,
        schema,
        "SELECT child_name, child_id, parent_name, parent_id FROM {s}.job_dependency",
    )
    return {
        (cn, ref_of[str(ci)], pn, ref_of[str(pi)]) for cn, ci, pn, pi in rows if str(ci) in ref_of
    }


def completed(engine: Engine, schema: str) -> int:
    return states(engine, schema, "fa")["completed"] + states(engine, schema, "fb")["completed"]


def assert_dependency_order(engine: Engine, schema: str, ids: dict[str, Any]) -> None:
    times = {
        str(r.id): (r.started_on, r.completed_on)
        for r in sql(engine, schema, "SELECT id, started_on, completed_on FROM {s}.job")
    }
    for job in GRAPH:
        started = times[str(ids[job["ref"]])][0]
        for parent in job.get("depends_on", []):
            assert times[str(ids[parent])][1] <= started, (parent, job["ref"])


def test_node_and_python_write_the_same_flow(engine: Engine, schema46_by: str, node46: Any) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: (q.create_queue("fa"), q.create_queue("fb")))
    boss = node46(schema)
    theirs = boss.call("flow", as_node(GRAPH))
    ours = in_tx(engine, schema, lambda q: q.flow(GRAPH))
    assert set(theirs) == set(ours) == {"p1", "p2", "c", "d"}
    assert rows_by_ref(engine, schema, ours) == rows_by_ref(engine, schema, theirs)
    assert (
        edges(engine, schema, ours)
        == edges(engine, schema, theirs)
        == {
            ("fb", "c", "fa", "p1"),
            ("fb", "c", "fb", "p2"),
            ("fa", "d", "fb", "c"),
        }
    )
    # Node reads our dependencies as its own.
    parents = boss.call("getDependencies", "fb", str(ours["c"]))
    assert {(p["name"], p["id"]) for p in parents} == {
        ("fa", str(ours["p1"])),
        ("fb", str(ours["p2"])),
    }
    # Our readers give Node's answer for Node's flow, in Node's order, with states.
    for node_reader, reader in (
        ("getDependencies", "get_dependencies"),
        ("getDependents", "get_dependents"),
    ):
        expected = [(r["name"], r["id"]) for r in boss.call(node_reader, "fb", str(theirs["c"]))]

        def read(q: Any, reader: str = reader) -> Any:
            return getattr(q, reader)("fb", theirs["c"])

        got = in_tx(engine, schema, read)
        assert len(expected) == (2 if reader == "get_dependencies" else 1)
        assert [(d.name, str(d.id)) for d in got] == expected
        assert {d.state for d in got} == {"created"}


def test_a_python_flow_is_worked_and_released_by_node(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: (q.create_queue("fa"), q.create_queue("fb")))
    ids = in_tx(engine, schema, lambda q: q.flow(GRAPH))
    boss = node46(schema, supervise=True, flowIntervalSeconds=1)
    for queue in ("fa", "fb"):
        boss.call("work", queue, {"pollingIntervalSeconds": 0.5}, {})
    assert wait_until(
        lambda: (
            states(engine, schema, "fa")["completed"] + states(engine, schema, "fb")["completed"]
            == 4
        ),
        timeout=60,
    )
    assert_dependency_order(engine, schema, ids)
    worked = {str(e["id"]) for e in boss.events_of("job")}
    assert worked == {str(i) for i in ids.values()}


def test_a_node_flow_is_worked_and_released_by_our_worker(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: (q.create_queue("fa"), q.create_queue("fb")))
    boss = node46(schema)
    ids = boss.call("flow", as_node(GRAPH))
    seen: list[str] = []
    worker = Worker(
        engine,
        schema=schema,
        poll_interval=0.2,
        supervisor_options={"flow_interval": 1, "schedule": False, "bam": False},
    )
    worker.register("fa", lambda job: seen.append(str(job.id)))
    worker.register("fb", lambda job: seen.append(str(job.id)))
    worker.start()
    try:
        assert wait_until(
            lambda: (
                states(engine, schema, "fa")["completed"]
                + states(engine, schema, "fb")["completed"]
                == 4
            ),
            timeout=60,
        )
    finally:
        worker.stop(5)
    assert_dependency_order(engine, schema, ids)
    assert sorted(seen) == sorted(str(i) for i in ids.values())
    # Resolved as Node's resolver leaves them: no parent is still marked blocking.
    assert sql(engine, schema, "SELECT count(*) FROM {s}.job WHERE blocking OR blocked")[0][0] == 0
