"""Interop at schema 46, by key: ``getBlockedKeys`` and ``upsert`` with Node pg-boss 12.38.0.

Node's ``getBlockedKeys`` and our ``get_blocked_keys`` list the same keys, whoever failed
the jobs; a job Node upserted by key is edited by our ``upsert`` and the other way round,
with one job per key throughout, also when both sides upsert the same keys at once
(docs/how-to/upserts.md, docs/how-to/key-strict-fifo.md).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import Shared46, on46, shared46_by, sql
from support.node import in_tx, node46_modules

__all__ = ["node46_modules", "on46", "shared46_by"]  # fixtures

pytestmark = pytest.mark.interop


def _jobs(engine: Engine, schema: str, name: str) -> list[Any]:
    return [
        row._asdict()
        for row in sql(
            engine,
            schema,
            "SELECT id::text AS id, state::text AS state, data, singleton_key, upsert_by_key "
            "FROM {s}.job WHERE name = :n ORDER BY created_on, id",
            n=name,
        )
    ]


@pytest.mark.parametrize("creator", ["python", "node"])
def test_node_get_blocked_keys_agrees_with_ours(
    engine: Engine, on46: Shared46, creator: str
) -> None:
    boss, schema, name = on46.boss, on46.schema, on46.queue()
    if creator == "python":
        in_tx(
            engine, schema, lambda q: q.create_queue(name, policy="key_strict_fifo", retry_limit=0)
        )
    else:
        boss.call("createQueue", name, {"policy": "key_strict_fifo", "retryLimit": 0})
    keys = ["d", "a", "c", "b", "e"]
    for key in keys:
        in_tx(engine, schema, lambda q, k=key: q.send(name, {"k": k}, singleton_key=k))  # type: ignore[misc]
    # Node fails two heads, we fail two; "e" completes.
    node_jobs = boss.call("fetch", name, {"batchSize": 2})
    ours = in_tx(engine, schema, lambda q: q.fetch(name, 3))
    for job in node_jobs:
        assert boss.call("fail", name, job["id"], {"e": 1})["affected"] == 1
    failed_here = [j for j in ours if j.singleton_key != "e"]
    done = [j for j in ours if j.singleton_key == "e"]
    in_tx(engine, schema, lambda q: q.fail(name, failed_here))
    in_tx(engine, schema, lambda q: q.complete(name, done))
    expected = sorted({j["data"]["k"] for j in node_jobs} | {j.singleton_key for j in failed_here})
    assert len(expected) == 4
    assert in_tx(engine, schema, lambda q: q.get_blocked_keys(name)) == expected
    assert boss.call("getBlockedKeys", name) == expected
    # Paging agrees too.
    assert boss.call("getBlockedKeys", name, {"limit": 2, "after": expected[0]}) == in_tx(
        engine, schema, lambda q: q.get_blocked_keys(name, limit=2, after=expected[0])
    )
    # A retried key is no longer blocked, on either side.
    [retried] = [j["id"] for j in _jobs(engine, schema, name) if j["singleton_key"] == expected[0]]
    in_tx(engine, schema, lambda q: q.retry(name, retried))
    assert boss.call("getBlockedKeys", name) == expected[1:]
    assert in_tx(engine, schema, lambda q: q.get_blocked_keys(name)) == expected[1:]
    assert boss.errors() == []


@pytest.mark.parametrize("first", ["python", "node"])
def test_a_job_upserted_by_one_side_is_updated_by_the_others_upsert(
    engine: Engine, on46: Shared46, first: str
) -> None:
    boss, schema, name = on46.boss, on46.schema, on46.queue()
    in_tx(engine, schema, lambda q: q.create_queue(name))

    def node_upsert(data: Any) -> dict[str, Any]:
        result: dict[str, Any] = boss.call("upsert", name, data, {"singletonKey": "k"})
        return result

    def python_upsert(data: Any) -> dict[str, Any]:
        r = in_tx(engine, schema, lambda q: q.upsert(name, data, singleton_key="k"))
        return {"jobs": [str(j) for j in r.jobs], "updated": r.updated, "inserted": r.inserted}

    sides = [python_upsert, node_upsert] if first == "python" else [node_upsert, python_upsert]
    made = sides[0]({"v": 1})
    assert (made["updated"], made["inserted"]) == (0, 1)
    edited = sides[1]({"v": 2})
    assert (edited["jobs"], edited["updated"], edited["inserted"]) == (made["jobs"], 1, 0)
    back = sides[0]({"v": 3})
    assert (back["jobs"], back["updated"]) == (made["jobs"], 1)
    [job] = _jobs(engine, schema, name)
    assert (job["id"], job["data"], job["upsert_by_key"]) == (made["jobs"][0], {"v": 3}, True)
    # Once the job has started, the other side's upsert inserts a new one.
    [taken] = (
        boss.call("fetch", name)
        if first == "python"
        else in_tx(engine, schema, lambda q: q.fetch(name))
    )
    again = sides[1]({"v": 4})
    assert again["inserted"] == 1 and again["jobs"] != made["jobs"]
    assert sorted(j["state"] for j in _jobs(engine, schema, name)) == ["active", "created"]
    assert taken is not None
    assert boss.errors() == []


def test_node_update_and_our_update_edit_the_same_jobs(engine: Engine, on46: Shared46) -> None:
    boss, schema, name = on46.boss, on46.schema, on46.queue()
    in_tx(engine, schema, lambda q: q.create_queue(name))
    ids = [
        str(in_tx(engine, schema, lambda q, i=i: q.send(name, i, singleton_key="k")))  # type: ignore[misc]
        for i in range(3)
    ]
    ours = in_tx(
        engine, schema, lambda q: q.update(name, singleton_key="k", match="oldest", priority=4)
    )
    theirs = boss.call(
        "update", name, None, {"singletonKey": "k", "match": "oldest", "priority": 5}
    )
    assert [str(j) for j in ours.jobs] == theirs["jobs"] == [ids[0]]
    rows = sql(engine, schema, "SELECT data, priority FROM {s}.job WHERE id = :i", i=ids[0])
    assert rows == [(None, 5)]  # Node's update given null data clears it, as ours does
    assert boss.errors() == []


def test_node_and_python_upserting_the_same_keys_at_once_end_on_one_job_per_key(
    engine: Engine, on46: Shared46
) -> None:
    import threading

    boss, schema, name = on46.boss, on46.schema, on46.queue()
    in_tx(engine, schema, lambda q: q.create_queue(name))
    keys = ["a", "b", "c"]
    errors: list[BaseException] = []

    def python_side() -> None:
        try:
            for i in range(20):
                for key in keys:
                    r = in_tx(
                        engine,
                        schema,
                        lambda q, k=key, i=i: q.upsert(name, f"py{i}", singleton_key=k),  # type: ignore[misc]
                    )
                    assert not r.rejected
        except BaseException as exc:  # reported below
            errors.append(exc)

    thread = threading.Thread(target=python_side)
    thread.start()
    for i in range(20):
        for key in keys:
            result = boss.call("upsert", name, f"js{i}", {"singletonKey": key})
            assert result["updated"] + result["inserted"] == 1
    thread.join(120)
    assert errors == []
    rows = _jobs(engine, schema, name)
    assert sorted(r["singleton_key"] for r in rows) == keys  # one job per key, no duplicate
    assert all(r["data"] in ("py19", "js19") for r in rows)  # each key's last write wins
    assert boss.errors() == []
