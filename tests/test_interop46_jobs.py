"""Interop at schema 46, jobs: sent, claimed and settled on either side by Node pg-boss 12.38.0
and by our runtime, with identical rows.

Every test runs on a schema at 46 made by our migrations and on one made by Node 12.38.0's
own construction plan (``schema46_by``), with the runtime speaking 46. What is compared:
the columns a send derives (including those new since 26: ``heartbeat_seconds``,
``blocked``, ``upsert_by_key``, ``source_*``, ``trace_context``), the claim
(``heartbeat_on``, ``start_after <= now``), the settle paths with pg-boss's attempt fence,
fail/retry/backoff and dead-letter copies carrying provenance, cancel/resume/retry/delete,
reads, queues, and publish/subscribe.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import job_row, schema46_by, sql, states
from support.node import NodeBoss46, in_tx, node46, node46_modules, node_url, to_node_options

__all__ = ["node46", "node46_modules", "node_url", "schema46_by"]  # fixtures

pytestmark = pytest.mark.interop

Node = Any  # the node46 factory

QUEUE_OPTIONS: dict[str, Any] = {
    "retry_limit": 1,
    "retry_delay": 3,
    "retry_backoff": True,
    "retry_delay_max": 20,
    "expire_seconds": 120,
    "retention_seconds": 3600,
    "deletion_seconds": 600,
    "dead_letter": "dlq",
}

EVERY_SEND_OPTION: dict[str, Any] = {
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

DERIVED = (
    "name, priority, data, state::text, retry_limit, retry_count, retry_delay, retry_backoff, "
    "retry_delay_max, expire_seconds, deletion_seconds, dead_letter, policy, "
    "heartbeat_seconds, heartbeat_on, started_on, completed_on, output, "
    "group_id, group_tier, blocked, blocking, pending_dependencies, upsert_by_key, "
    "source_name, source_id, source_created_on, source_retry_count, source_output, "
    "source_root_id, trace_context, "
    "start_after <= now() AS due, "
    "round(extract(epoch FROM start_after - created_on)) AS deferred_by, "
    "round(extract(epoch FROM keep_until - start_after)) AS retained_for, "
    "singleton_on IS NOT NULL AS throttled"
)
"""Columns of a job row that depend only on the options, the queue and the path taken."""


def derived(engine: Engine, schema: str, job_id: Any) -> dict[str, Any]:
    return job_row(engine, schema, job_id, DERIVED)


def make_queues(engine: Engine, schema: str, name: str, **options: Any) -> None:
    def create(q: Any) -> None:
        if q.get_queue("dlq") is None:
            q.create_queue("dlq", retry_limit=5, retention_seconds=100, deletion_seconds=50)
        q.create_queue(name, **{**QUEUE_OPTIONS, **options})

    in_tx(engine, schema, create)


def py(engine: Engine, schema: str, fn: Any) -> Any:
    return in_tx(engine, schema, fn)


def now(engine: Engine, schema: str) -> dt.datetime:
    [(value,)] = sql(engine, schema, "SELECT now()")
    return value  # type: ignore[no-any-return]


# --------------------------------------------------------------- send: the same columns


@pytest.mark.parametrize("options", [EVERY_SEND_OPTION, {}], ids=["every-option", "defaults"])
def test_python_and_node_sends_write_the_same_46_columns(
    engine: Engine, schema46_by: str, node46: Node, options: dict[str, Any]
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    boss = node46(schema)
    ours = py(
        engine, schema, lambda q: q.send("orders", {"n": 1}, **{**options, "singleton_key": "py"})
    )
    theirs = boss.call(
        "send", "orders", {"n": 1}, to_node_options({**options, "singleton_key": "js"})
    )
    assert ours is not None and theirs is not None
    row = derived(engine, schema, ours)
    assert row == derived(engine, schema, theirs)
    assert row["deferred_by"] == options.get("start_after", 0)
    assert row["upsert_by_key"] is None and row["source_id"] is None and not row["blocked"]


def test_python_send_applies_the_queue_heartbeat_like_node(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    boss = node46(schema)
    boss.call("createQueue", "beats", {"heartbeatSeconds": 30, "retryLimit": 4})
    ours = py(engine, schema, lambda q: q.send("beats", {"n": 1}))
    theirs = boss.call("send", "beats", {"n": 2})
    assert derived(engine, schema, ours)["heartbeat_seconds"] == 30
    mine, node_row = derived(engine, schema, ours), derived(engine, schema, theirs)
    mine.pop("data"), node_row.pop("data")
    assert mine == node_row


def test_job_sent_by_python_is_seen_alike_by_node_fetch(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    options = {k: v for k, v in EVERY_SEND_OPTION.items() if k != "start_after"}
    job_id = py(engine, schema, lambda q: q.send("orders", {"n": 1}, **options))
    sent = py(engine, schema, lambda q: q.get_job("orders", job_id))
    boss = node46(schema)
    [fetched] = boss.call("fetch", "orders", {"includeMetadata": True, "batchSize": 5})
    expected = {
        "id": str(job_id),
        "name": "orders",
        "data": {"n": 1},
        "policy": "standard",
        "priority": 7,
        "retryLimit": 3,
        "retryDelay": 4,
        "retryBackoff": True,
        "retryDelayMax": 30,
        "expireInSeconds": 60,
        "deleteAfterSeconds": 300,
        "singletonKey": "order-1",
        "deadLetter": "dlq",
        "state": "active",
        "retryCount": 0,
        "heartbeatSeconds": None,
        "blocked": False,
        "pendingDependencies": 0,
        "sourceName": None,
        "sourceId": None,
    }
    assert {k: fetched.get(k) for k in expected} == expected
    assert sent.singleton_on is not None and fetched["singletonOn"] is not None
    assert fetched["heartbeatOn"] is not None


def test_neither_side_claims_a_job_before_its_start_after(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    boss = node46(schema)
    py(engine, schema, lambda q: q.send("orders", {"n": 1}, start_after=3600))
    boss.call("send", "orders", {"n": 2}, {"startAfter": 3600})
    assert boss.call("fetch", "orders", {"batchSize": 5}) == []
    assert py(engine, schema, lambda q: q.fetch("orders", 5)) == []


# --------------------------------------------------------------- claim


def test_python_and_node_claims_write_the_same_columns(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "py-q")
    make_queues(engine, schema, "js-q")
    boss = node46(schema)
    for_py = boss.call("send", "py-q", {"n": 1}, {"priority": 3})
    for_js = py(engine, schema, lambda q: q.send("js-q", {"n": 1}, priority=3))
    [ours] = py(engine, schema, lambda q: q.fetch("py-q"))
    [theirs] = boss.call("fetch", "js-q", {"includeMetadata": True})
    assert str(ours.id) == for_py and theirs["id"] == str(for_js)
    a, b = derived(engine, schema, for_py), derived(engine, schema, for_js)
    assert a["state"] == b["state"] == "active"
    assert a["heartbeat_on"] is not None and b["heartbeat_on"] is not None
    assert a["started_on"] == a["heartbeat_on"] and b["started_on"] == b["heartbeat_on"]
    for row in (a, b):
        row.pop("name"), row.pop("heartbeat_on"), row.pop("started_on")
    assert a == b


def test_node_fetch_takes_priority_then_age_from_python_sends(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    ids = [
        py(engine, schema, lambda q, p=p: q.send("orders", {"p": p}, priority=p))
        for p in (1, 5, 1, 9)
    ]
    boss = node46(schema)
    # One claim at a time: a batch comes back in no particular order (UPDATE ... RETURNING).
    fetched = [boss.call("fetch", "orders")[0]["id"] for _ in ids]
    assert fetched == [str(ids[3]), str(ids[1]), str(ids[0]), str(ids[2])]


def test_python_fetch_takes_priority_then_age_from_node_inserts(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    boss = node46(schema)
    ids = boss.call(
        "insert",
        "orders",
        [{"data": {"n": 1}}, {"data": {"n": 2}, "priority": 5}],
        {"returnId": True},
    )
    assert len(ids) == 2
    jobs = py(engine, schema, lambda q: q.fetch("orders", 5))
    assert [j.data for j in jobs] == [{"n": 2}, {"n": 1}]
    assert all(j.policy == "standard" and j.dead_letter == "dlq" for j in jobs)


# --------------------------------------------------------------- settle


@pytest.mark.smoke  # one Node round trip each way stays in the fast tier
def test_node_completes_and_fails_jobs_python_sent(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders", retry_limit=0)
    first = py(engine, schema, lambda q: q.send("orders", {"n": 1}))
    second = py(engine, schema, lambda q: q.send("orders", {"n": 2}))
    boss = node46(schema)
    fetched = boss.call("fetch", "orders", {"batchSize": 2})
    assert sorted(j["id"] for j in fetched) == sorted([str(first), str(second)])
    attempt = {j["id"]: {"id": j["id"], "retryCount": j["retryCount"]} for j in fetched}
    done = boss.call("complete", "orders", attempt[str(first)], {"ok": True})
    failed = boss.call("fail", "orders", attempt[str(second)], {"reason": "no stock"})
    assert done["affected"] == 1 and failed["affected"] == 1
    completed = py(engine, schema, lambda q: q.get_job("orders", first))
    dead = py(engine, schema, lambda q: q.get_job("orders", second))
    assert completed.state == "completed" and completed.output == {"ok": True}
    assert dead.state == "failed" and dead.output == {"reason": "no stock"}
    # Node's fail knows nothing of our attempt history: the job has none recorded.
    assert py(engine, schema, lambda q: q.get_job_attempts("orders", second)) == []


@pytest.mark.smoke  # one Node round trip each way stays in the fast tier
def test_python_completes_a_node_job_and_node_reads_the_output(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    boss = node46(schema)
    job_id = boss.call("send", "orders", {"n": 1}, {"priority": 2})
    [job] = py(engine, schema, lambda q: q.fetch("orders"))
    assert py(engine, schema, lambda q: q.complete("orders", job.id, "shipped")).count == 1
    seen = boss.call("getJobById", "orders", job_id)
    assert seen["state"] == "completed" and seen["output"] == {"value": "shipped"}


def test_node_fence_refuses_to_settle_an_attempt_python_took_over(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(
        engine,
        schema,
        "orders",
        retry_limit=3,
        retry_delay=0,
        retry_backoff=False,
        retry_delay_max=None,
    )
    boss = node46(schema)
    job_id = boss.call("send", "orders", {"n": 1})
    [stale] = boss.call("fetch", "orders")
    # The attempt is lost (failed by someone else) and Python claims the retry.
    py(engine, schema, lambda q: q.fail("orders", job_id, {"lost": True}))
    [mine] = py(engine, schema, lambda q: q.fetch("orders"))
    assert mine.retry_count == stale["retryCount"] + 1
    late = boss.call(
        "complete", "orders", {"id": job_id, "retryCount": stale["retryCount"]}, {"late": 1}
    )
    assert late["affected"] == 0
    assert job_row(engine, schema, job_id, "state::text")["state"] == "active"
    assert py(engine, schema, lambda q: q.complete("orders", job_id, "mine")).count == 1


# --------------------------------------------------------------- fail, retry, dead letter


def _fail_until_dead(
    engine: Engine, schema: str, fetch: Any, fail: Any, job_id: str
) -> list[tuple[str, int, int]]:
    """Fetch (once due) and fail one job until it is failed; per attempt: state,
    retry_count and the retry delay in whole seconds (database clock)."""
    history: list[tuple[str, int, int]] = []
    for _ in range(10):
        # Make the retry due now: 12.38 has no ignoreStartAfter, and both sides must wait.
        sql(engine, schema, "UPDATE {s}.job SET start_after = now() WHERE id = :id", id=job_id)
        assert fetch(), f"nothing to fetch after {history}"
        before = now(engine, schema)
        fail()
        row = job_row(engine, schema, job_id, "state::text, retry_count, start_after, heartbeat_on")
        assert row["heartbeat_on"] is None  # a failed attempt leaves no heartbeat behind
        history.append(
            (
                row["state"],
                row["retry_count"],
                math.floor((row["start_after"] - before).total_seconds()),
            )
        )
        if row["state"] == "failed":
            return history
    raise AssertionError(f"job {job_id} never failed: {history}")


def test_retries_backoff_and_dead_letter_are_the_same_for_python_and_node(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    settings = {"retry_limit": 2, "retry_delay": 1, "retry_backoff": True, "retry_delay_max": 4}
    make_queues(engine, schema, "py-orders", **settings)
    make_queues(engine, schema, "js-orders", **settings)
    boss: NodeBoss46 = node46(schema)
    for_python = boss.call(
        "send", "py-orders", {"worker": "python"}, {"priority": 4, "singletonKey": "k"}
    )
    for_node = py(
        engine,
        schema,
        lambda q: q.send("js-orders", {"worker": "node"}, priority=4, singleton_key="k"),
    )
    for_node = str(for_node)

    py_history = _fail_until_dead(
        engine, schema,
        lambda: py(engine, schema, lambda q: q.fetch("py-orders")),
        lambda: py(engine, schema, lambda q: q.fail("py-orders", for_python, {"error": "boom"})),
        for_python,
    )  # fmt: skip
    js_history = _fail_until_dead(
        engine, schema,
        lambda: boss.call("fetch", "js-orders"),
        lambda: boss.call("fail", "js-orders", for_node, {"error": "boom"}),
        for_node,
    )  # fmt: skip
    assert [(s, n) for s, n, _ in py_history] == [(s, n) for s, n, _ in js_history]
    # At 46 a claim counts the attempt (retry_count + 1 once started_on is set), not the fail.
    assert [(s, n) for s, n, _ in py_history] == [("retry", 0), ("retry", 1), ("failed", 2)]
    # Backoff: retry_delay * 2^(n+1)/2 * (1 + random()), capped at retry_delay_max = 4:
    # attempt 0 -> 1..2 s, attempt 1 -> 2..4 s.
    for history in (py_history, js_history):
        first, second, _ = (d for _, _, d in history)
        assert 1 <= first <= 2 and 2 <= second <= 4, history

    copies = sql(
        engine, schema,
        "SELECT data->>'worker' AS worker, name, priority, singleton_key, output, source_output, "
        "source_name, source_id::text, source_retry_count, source_root_id::text, "
        "source_created_on IS NOT NULL AS has_created, retry_limit, deletion_seconds, policy, "
        "dead_letter, heartbeat_seconds, start_after <= now() AS due "
        "FROM {s}.job WHERE name = 'dlq' ORDER BY 1",
    )  # fmt: skip
    by_worker = {c.worker: dict(c._mapping) for c in copies}
    assert set(by_worker) == {"node", "python"}
    for worker, original, queue in (
        ("python", for_python, "py-orders"),
        ("node", for_node, "js-orders"),
    ):
        copy = by_worker[worker]
        assert copy["source_id"] == copy["source_root_id"] == original
        assert copy["source_name"] == queue and copy["source_retry_count"] == 2
        assert copy["output"] is None and copy["source_output"] == {"error": "boom"}
        assert (copy["priority"], copy["singleton_key"], copy["retry_limit"]) == (4, "k", 5)
        assert copy["policy"] is None and copy["dead_letter"] is None and copy["due"]
    strip = ("worker", "source_id", "source_root_id", "source_name")
    assert {k: v for k, v in by_worker["python"].items() if k not in strip} == {
        k: v for k, v in by_worker["node"].items() if k not in strip
    }


def test_a_dead_letter_copy_failed_again_keeps_its_provenance_on_both_sides(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by

    def create(q: Any) -> None:
        q.create_queue("dlq2")
        q.create_queue("dlq1", retry_limit=0, dead_letter="dlq2")
        q.create_queue("orders", retry_limit=0, dead_letter="dlq1")

    py(engine, schema, create)
    boss = node46(schema)
    by_node = py(engine, schema, lambda q: q.send("orders", {"first": "node"}))
    by_python = py(engine, schema, lambda q: q.send("orders", {"first": "python"}))
    boss.call("fail", "orders", str(by_node), {"first": True})
    py(engine, schema, lambda q: q.fail("orders", by_python, {"first": True}))
    copies = {j.data["first"]: j for j in py(engine, schema, lambda q: q.fetch("dlq1", 2))}
    # Each side fails the copy the other side made.
    py(engine, schema, lambda q: q.fail("dlq1", copies["node"].id, {"second": True}))
    boss.call("fail", "dlq1", str(copies["python"].id), {"second": True})

    columns = (
        "state::text, output, source_name, source_id, source_root_id, source_output, "
        "source_retry_count, dead_letter"
    )
    rows = {first: job_row(engine, schema, copy.id, columns) for first, copy in copies.items()}
    for first, original in (("node", by_node), ("python", by_python)):
        assert rows[first] == {
            "state": "failed",
            "output": {"second": True},
            "source_name": "orders",
            "source_id": original,
            "source_root_id": original,
            "source_output": {"first": True},
            "source_retry_count": 0,
            "dead_letter": None,  # a copy is not dead-lettered again (pg-boss 12.38)
        }
    assert states(engine, schema, "dlq2") == {}


def test_node_and_python_fail_honour_a_per_job_dead_letter(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders", retry_limit=0)
    py(engine, schema, lambda q: q.create_queue("vip-dlq"))
    boss = node46(schema)
    a = py(engine, schema, lambda q: q.send("orders", {"n": 1}, dead_letter="vip-dlq"))
    b = boss.call("send", "orders", {"n": 2}, {"deadLetter": "vip-dlq"})
    boss.call("fail", "orders", str(a), {"reason": "boom"})
    py(engine, schema, lambda q: q.fail("orders", b, {"reason": "boom"}))
    assert states(engine, schema, "vip-dlq")["created"] == 2
    assert states(engine, schema, "dlq") == {}


# --------------------------------------------------------------- cancel, resume, retry, delete


def test_cancel_resume_retry_and_delete_cross_sides(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders", retry_limit=0)
    boss = node46(schema)
    job_id = boss.call("send", "orders", {"n": 1}, {"startAfter": 3600})
    assert py(engine, schema, lambda q: q.cancel("orders", job_id)).count == 1
    assert boss.call("getJobById", "orders", job_id)["state"] == "cancelled"
    assert boss.call("resume", "orders", job_id)["affected"] == 1
    assert job_row(engine, schema, job_id, "state::text")["state"] == "created"

    # Python's resume brings start_after up to now, as Node's does (GREATEST).
    boss.call("cancel", "orders", job_id)
    sql(
        engine,
        schema,
        "UPDATE {s}.job SET start_after = now() - interval '1 hour' WHERE id = :i",
        i=job_id,
    )
    assert py(engine, schema, lambda q: q.resume("orders", job_id)).count == 1
    row = job_row(
        engine,
        schema,
        job_id,
        "state::text, start_after >= now() - interval '5 s' AS fresh, completed_on",
    )
    assert row == {"state": "created", "fresh": True, "completed_on": None}

    [job] = py(engine, schema, lambda q: q.fetch("orders"))
    boss.call("fail", "orders", job_id, {"reason": "boom"})
    assert py(engine, schema, lambda q: q.retry("orders", job_id)).count == 1
    [again] = boss.call("fetch", "orders", {"includeMetadata": True})
    assert again["id"] == job_id == str(job.id)
    assert (again["retryLimit"], again["retryCount"]) == (1, 1)

    other = py(engine, schema, lambda q: q.send("orders", {"n": 2}))
    assert boss.call("deleteJob", "orders", str(other))["affected"] == 1
    assert py(engine, schema, lambda q: q.get_job("orders", other)) is None
    assert py(engine, schema, lambda q: q.delete_job("orders", job_id)).count == 1
    assert boss.call("getJobById", "orders", job_id) is None


def test_python_resume_of_a_node_upsert_clears_upsert_by_key(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    boss = node46(schema)
    boss.call("upsert", "orders", {"n": 1}, {"singletonKey": "k"})
    [(job_id, flag)] = sql(
        engine, schema, "SELECT id, upsert_by_key FROM {s}.job WHERE name = 'orders'"
    )
    assert flag is True
    py(engine, schema, lambda q: q.cancel("orders", job_id))
    py(engine, schema, lambda q: q.resume("orders", job_id))
    assert job_row(engine, schema, job_id, "upsert_by_key")["upsert_by_key"] is None
    # Node's next upsert of the key finds the resumed job, queued again, and edits it.
    boss.call("upsert", "orders", {"n": 2}, {"singletonKey": "k"})
    assert sql(engine, schema, "SELECT id, state::text, data FROM {s}.job") == [
        (job_id, "created", {"n": 2})
    ]


def test_python_fail_of_a_node_upsert_drops_upsert_by_key_as_node_fail_does(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(
        engine,
        schema,
        "orders",
        retry_limit=1,
        retry_delay=0,
        retry_backoff=False,
        retry_delay_max=None,
    )
    boss = node46(schema)
    for key in ("py", "js"):
        boss.call("upsert", "orders", {"key": key}, {"singletonKey": key})
    jobs = py(engine, schema, lambda q: q.fetch("orders", 2))
    by_key = {j.singleton_key: j.id for j in jobs}
    py(engine, schema, lambda q: q.fail("orders", by_key["py"], {"e": 1}))
    boss.call("fail", "orders", str(by_key["js"]), {"e": 1})
    rows = sql(
        engine,
        schema,
        "SELECT singleton_key, state::text, upsert_by_key FROM {s}.job "
        "WHERE name = 'orders' ORDER BY 1",
    )
    assert [tuple(r) for r in rows] == [("js", "retry", None), ("py", "retry", None)]


# --------------------------------------------------------------- reads


def test_python_reads_node_jobs_and_node_reads_python_jobs(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    boss = node46(schema)
    theirs = boss.call("send", "orders", {"by": "node"}, {"singletonKey": "a"})
    ours = py(engine, schema, lambda q: q.send("orders", {"by": "python"}, singleton_key="b"))
    job = py(engine, schema, lambda q: q.get_job("orders", theirs))
    assert (str(job.id), job.data, job.singleton_key, job.state) == (
        theirs,
        {"by": "node"},
        "a",
        "created",
    )
    listed = py(engine, schema, lambda q: q.list_jobs("orders"))
    assert sorted(str(j.id) for j in listed) == sorted([theirs, str(ours)])
    many = py(engine, schema, lambda q: q.get_jobs("orders", [theirs, ours]))
    assert len(many) == 2
    found = boss.call("findJobs", "orders", {"key": "b"})
    assert [j["id"] for j in found] == [str(ours)]
    seen = boss.call("getJobById", "orders", str(ours))
    assert seen["data"] == {"by": "python"} and seen["state"] == "created"


# --------------------------------------------------------------- queues


def test_queue_created_by_python_is_read_alike_by_node(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders", partition=True)
    boss = node46(schema)
    seen = boss.call("getQueue", "orders")
    assert (
        seen["retryLimit"],
        seen["retryDelay"],
        seen["retryBackoff"],
        seen["retryDelayMax"],
    ) == (1, 3, True, 20)
    assert (seen["expireInSeconds"], seen["retentionSeconds"], seen["deleteAfterSeconds"]) == (
        120,
        3600,
        600,
    )
    assert (seen["deadLetter"], seen["partition"], seen["policy"]) == ("dlq", True, "standard")
    job_id = boss.call("send", "orders", {"n": 1})
    assert [str(j.id) for j in py(engine, schema, lambda q: q.fetch("orders"))] == [job_id]


def test_queue_created_by_node_is_read_alike_by_python(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    boss = node46(schema)
    boss.call("createQueue", "dlq")
    boss.call(
        "createQueue", "orders",
        {"retryLimit": 1, "retryDelay": 3, "retryBackoff": True, "retryDelayMax": 20,
         "expireInSeconds": 120, "retentionSeconds": 3600, "deleteAfterSeconds": 600,
         "deadLetter": "dlq", "partition": True, "notify": True, "heartbeatSeconds": 40},
    )  # fmt: skip
    info = py(engine, schema, lambda q: q.get_queue("orders"))
    assert (info.retry_limit, info.retry_delay, info.retry_backoff, info.retry_delay_max) == (
        1,
        3,
        True,
        20,
    )
    assert (info.expire_seconds, info.retention_seconds, info.deletion_seconds) == (120, 3600, 600)
    assert (info.dead_letter, info.partition, info.policy) == ("dlq", True, "standard")
    job_id = py(engine, schema, lambda q: q.send("orders", {"n": 1}))
    assert derived(engine, schema, job_id)["heartbeat_seconds"] == 40
    assert [j["id"] for j in boss.call("fetch", "orders")] == [str(job_id)]


def test_queue_updates_on_either_side_apply_to_the_other_sides_next_send(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    make_queues(engine, schema, "orders")
    boss = node46(schema)
    boss.call("send", "orders", None)  # Node has the queue cached now
    py(engine, schema, lambda q: q.update_queue("orders", retry_limit=9, expire_seconds=30))
    job = py(engine, schema, lambda q: q.get_job("orders", boss.call("send", "orders", None)))
    assert (job.retry_limit, job.expire_seconds) == (9, 30)
    boss.call("updateQueue", "orders", {"retryLimit": 7, "deleteAfterSeconds": 99})
    info = py(engine, schema, lambda q: q.get_queue("orders"))
    job = py(engine, schema, lambda q: q.get_job("orders", q.send("orders", None)))
    assert (info.retry_limit, info.deletion_seconds) == (7, 99)
    assert (job.retry_limit, job.deletion_seconds) == (7, 99)


def test_queues_deleted_on_either_side_are_gone_for_the_other(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    boss = node46(schema)
    boss.call("createQueue", "by-node", {"partition": True})
    py(engine, schema, lambda q: q.create_queue("by-python", partition=True))
    boss.call("send", "by-node", {"n": 1})
    py(engine, schema, lambda q: q.send("by-python", {"n": 1}))
    assert py(engine, schema, lambda q: q.delete_queue("by-node"))
    boss.call("deleteQueue", "by-python")
    assert boss.call("getQueue", "by-node") is None
    assert py(engine, schema, lambda q: q.get_queue("by-python")) is None
    assert sql(engine, schema, "SELECT count(*) FROM {s}.job")[0][0] == 0
    assert sorted(q["name"] for q in boss.call("getQueues")) == []


# --------------------------------------------------------------- publish / subscribe


def test_publish_from_either_side_reaches_queues_subscribed_from_both(
    engine: Engine, schema46_by: str, node46: Node
) -> None:
    schema = schema46_by
    for name in ("billing", "audit"):
        py(engine, schema, lambda q, n=name: q.create_queue(n))
    boss = node46(schema)
    boss.call("subscribe", "order.paid", "billing")
    py(engine, schema, lambda q: q.subscribe("order.paid", "audit"))

    py(engine, schema, lambda q: q.publish("order.paid", {"order": 7}))
    boss.call("publish", "order.paid", {"order": 8})

    billed = sorted(j["data"]["order"] for j in boss.call("fetch", "billing", {"batchSize": 5}))
    audited = sorted(j.data["order"] for j in py(engine, schema, lambda q: q.fetch("audit", 5)))
    assert billed == audited == [7, 8]
    assert py(engine, schema, lambda q: q.unsubscribe("order.paid", "billing"))
    boss.call("publish", "order.paid", {"order": 9})
    assert boss.call("fetch", "billing") == []
