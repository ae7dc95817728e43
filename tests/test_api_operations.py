"""Every operation of the HTTP API (alkstore_sa.api) succeeds over HTTP, and writes what
it says: each one called as a remote client calls it, its answer checked, and what it
wrote or read checked against the database through the service or plain SQL.

tests/test_api.py has the success tests of the operations a remote worker uses first
(create_queue, send, fetch, complete...) and every refusal; this module has the rest, and
:func:`test_every_operation_has_a_test_of_its_success` keeps the two together covering the
whole operation table: an operation added to the API without a success test fails it.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import test_api
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient
from test_api import client, ok

from alkstore_sa import QueueService
from alkstore_sa.api import openapi_document
from alkstore_sa.api._operations import BY_NAME

T = TypeVar("T")


@pytest.fixture(params=[26, 46], ids=["schema26", "schema46"])
def at(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh schema at 26, then one at 46: an operation both versions have, at both."""
    yield request.getfixturevalue("schema" if request.param == 26 else "schema46")


def read(engine: Engine, schema: str, work: Callable[[QueueService], T]) -> T:
    """``work`` on a service of its own, in a transaction of its own (committed)."""
    with Session(engine) as session, session.begin():
        return work(QueueService(session, schema=schema))


def post(api: TestClient, operation: str, **args: Any) -> Any:
    """``POST /api/<operation>`` with ``args`` as its JSON body; the result of a success."""
    return ok(api.post(f"/api/{operation}", json=args))


def get(api: TestClient, operation: str, params: Any) -> Any:
    """``GET /api/<operation>`` with ``params`` as its query string; the result of a success."""
    return ok(api.get(f"/api/{operation}", params=params))


def rows(engine: Engine, schema: str, sql: str, **params: Any) -> list[Any]:
    """Rows of ``sql`` (``{s}`` stands for the quoted schema)."""
    with engine.connect() as conn:
        return list(conn.execute(text(sql.replace("{s}", f'"{schema}"')), params).all())


def job_state(engine: Engine, schema: str, name: str, job_id: str) -> str | None:
    job = read(engine, schema, lambda q: q.get_job(name, job_id))
    return None if job is None else str(job.state)


def sent(engine: Engine, schema: str, name: str, count: int = 1, **options: Any) -> list[str]:
    """Queue ``name`` made (if missing) with ``options`` and ``count`` jobs sent to it: their
    ids as text, as the API gives them."""

    def work(q: QueueService) -> list[str]:
        q.create_queue(name, **options)
        return [str(q.send(name, {"n": n})) for n in range(count)]

    return read(engine, schema, work)


def fetched(engine: Engine, schema: str, name: str, count: int = 1) -> list[Any]:
    return read(engine, schema, lambda q: q.fetch(name, count))


# ------------------------------------------------------------------ queues


def test_update_queue(engine: Engine, at: str) -> None:
    api = client(engine, at)
    read(engine, at, lambda q: q.create_queue("q", retry_limit=1))
    info = post(api, "update_queue", name="q", options={"retry_limit": 5, "retryDelay": 7})
    assert (info["name"], info["retry_limit"], info["retry_delay"]) == ("q", 5, 7)
    stored = read(engine, at, lambda q: q.get_queue("q"))
    assert stored is not None and (stored.retry_limit, stored.retry_delay) == (5, 7)


def test_delete_queue(engine: Engine, at: str) -> None:
    api = client(engine, at)
    sent(engine, at, "doomed", 2)
    sent(engine, at, "kept", 1)
    assert post(api, "delete_queue", name="doomed") is True
    assert read(engine, at, lambda q: q.get_queue("doomed")) is None
    assert rows(engine, at, "SELECT name FROM {s}.job ORDER BY name") == [("kept",)]


def test_get_queue(engine: Engine, at: str) -> None:
    api = client(engine, at)
    read(engine, at, lambda q: q.create_queue("q", retry_limit=2, dead_letter=None))
    info = get(api, "get_queue", {"name": "q"})
    assert (info["name"], info["retry_limit"], info["policy"]) == ("q", 2, "standard")
    assert get(api, "get_queue", {"name": "other"}) is None


def test_get_queue_stats(engine: Engine, at: str) -> None:
    api = client(engine, at)
    sent(engine, at, "q", 2)
    read(engine, at, lambda q: q.send_after("q", {"later": True}, 3600))
    fetched(engine, at, "q")
    stats = get(api, "get_queue_stats", {"name": "q"})
    counts = (stats["queued_count"], stats["deferred_count"], stats["active_count"])
    # As pg-boss counts them: queued is every job not yet active, the deferred one too.
    assert (stats["name"], counts, stats["total_count"]) == ("q", (2, 1, 1), 3)


# ------------------------------------------------------------------ sending


def test_send_throttled(engine: Engine, at: str) -> None:
    api = client(engine, at)
    read(engine, at, lambda q: q.create_queue("q"))
    args = {"name": "q", "seconds": 600, "key": "k"}
    first = post(api, "send_throttled", data={"n": 1}, **args)
    assert post(api, "send_throttled", data={"n": 2}, **args) is None  # the slot is taken
    stored = rows(engine, at, "SELECT id::text, data, singleton_key, singleton_on FROM {s}.job")
    [(job_id, data, key, slot)] = stored
    assert (job_id, data, key) == (first, {"n": 1}, "k") and slot is not None


def test_send_debounced(engine: Engine, at: str) -> None:
    api = client(engine, at)
    read(engine, at, lambda q: q.create_queue("q"))
    args = {"name": "q", "seconds": 600, "key": "k"}
    now = post(api, "send_debounced", data={"n": 1}, **args)
    later = post(api, "send_debounced", data={"n": 2}, **args)  # into the next slot
    assert post(api, "send_debounced", data={"n": 3}, **args) is None  # both slots taken
    assert None not in (now, later) and now != later
    stored = dict(
        rows(
            engine,
            at,
            "SELECT data->>'n', start_after > now() + interval '1 second' FROM {s}.job",
        )
    )
    assert stored == {"1": False, "2": True}


# ------------------------------------------------------------------ working jobs


def test_fail_many(engine: Engine, at: str) -> None:
    api = client(engine, at)
    first, second = sent(engine, at, "q", 2, retry_limit=0)
    jobs = {str(j.id): j for j in fetched(engine, at, "q", 2)}
    fenced = {"id": second, "output": {"e": 2}, "started_on": jobs[second].started_on.isoformat()}
    result = post(api, "fail_many", name="q", items=[[first, {"e": 1}], fenced])
    assert sorted(result["affected"]) == sorted([first, second])
    assert result["states"] == {first: "failed", second: "failed"}
    stored = dict(rows(engine, at, "SELECT id::text, output FROM {s}.job WHERE state = 'failed'"))
    assert stored == {first: {"e": 1}, second: {"e": 2}}


def test_touch(engine: Engine, schema46: str) -> None:  # heartbeats: schema 46 on
    api = client(engine, schema46)
    [job_id] = sent(engine, schema46, "q")
    fetched(engine, schema46, "q")
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{schema46}".job SET heartbeat_on = NULL'))
    assert post(api, "touch", name="q", jobs=[job_id])["affected"] == [job_id]
    [(beat, state)] = rows(engine, schema46, "SELECT heartbeat_on, state::text FROM {s}.job")
    assert beat is not None and state == "active"


def test_extend_leases(engine: Engine, at: str) -> None:
    api = client(engine, at)
    [job_id] = sent(engine, at, "q", expire_seconds=60)
    [job] = fetched(engine, at, "q")
    item = {"id": job_id, "started_on": job.started_on.isoformat()}
    assert post(api, "extend_leases", name="q", items=[item], extend_by=3600) == [job_id]
    [(expire, state)] = rows(engine, at, "SELECT expire_seconds, state::text FROM {s}.job")
    assert expire >= 3600 and state == "active"


def test_cancel(engine: Engine, at: str) -> None:
    api = client(engine, at)
    cancelled, left = sent(engine, at, "q", 2)
    assert post(api, "cancel", name="q", ids=[cancelled])["affected"] == [cancelled]
    assert job_state(engine, at, "q", cancelled) == "cancelled"
    assert job_state(engine, at, "q", left) == "created"


def test_resume(engine: Engine, at: str) -> None:
    api = client(engine, at)
    [job_id] = sent(engine, at, "q")
    read(engine, at, lambda q: q.cancel("q", job_id))
    assert post(api, "resume", name="q", ids=job_id)["affected"] == [job_id]
    assert job_state(engine, at, "q", job_id) == "created"


def test_retry(engine: Engine, at: str) -> None:
    api = client(engine, at)
    [job_id] = sent(engine, at, "q", retry_limit=0)
    fetched(engine, at, "q")
    read(engine, at, lambda q: q.fail("q", job_id, {"e": 1}))
    assert job_state(engine, at, "q", job_id) == "failed"
    assert post(api, "retry", name="q", ids=[job_id])["affected"] == [job_id]
    assert job_state(engine, at, "q", job_id) == "retry"


def test_delete_job(engine: Engine, at: str) -> None:
    api = client(engine, at)
    gone, kept = sent(engine, at, "q", 2)
    assert post(api, "delete_job", name="q", id=gone)["affected"] == [gone]
    assert [r[0] for r in rows(engine, at, "SELECT id::text FROM {s}.job")] == [kept]


def test_delete_jobs(engine: Engine, at: str) -> None:
    api = client(engine, at)
    *gone, kept = sent(engine, at, "q", 3)
    assert sorted(post(api, "delete_jobs", name="q", ids=gone)["affected"]) == sorted(gone)
    assert [r[0] for r in rows(engine, at, "SELECT id::text FROM {s}.job")] == [kept]


def test_get_jobs(engine: Engine, at: str) -> None:
    api = client(engine, at)
    first, second, _ = sent(engine, at, "q", 3)
    jobs = get(api, "get_jobs", [("name", "q"), ("ids", first), ("ids", second)])
    assert sorted((j["id"], j["data"]["n"], j["state"]) for j in jobs) == sorted(
        [(first, 0, "created"), (second, 1, "created")]
    )


def test_redrive(engine: Engine, at: str) -> None:
    api = client(engine, at)
    read(engine, at, lambda q: q.create_queue("dlq"))
    [job_id] = sent(engine, at, "q", retry_limit=0, dead_letter="dlq")
    fetched(engine, at, "q")
    read(engine, at, lambda q: q.fail("q", job_id, {"e": 1}))
    [dead] = rows(engine, at, "SELECT id::text FROM {s}.job WHERE name = 'dlq'")
    [new_id] = post(api, "redrive", dead_letter="dlq", to="q", ids=[dead[0]])
    assert new_id not in (job_id, dead[0])
    moved = read(engine, at, lambda q: q.get_job("q", new_id))
    assert moved is not None and (moved.data, str(moved.state)) == ({"n": 0}, "created")
    waiting = rows(engine, at, "SELECT 1 FROM {s}.job WHERE name = 'dlq' AND state < 'active'")
    assert waiting == []


# ------------------------------------------------------------------ flows (schema 46)


def test_flow(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    read(engine, schema46, lambda q: q.create_queue("steps"))
    refs = post(
        api,
        "flow",
        jobs=[
            {"ref": "fetch", "name": "steps", "data": {"step": 1}},
            {"ref": "report", "name": "steps", "data": {"step": 2}, "depends_on": ["fetch"]},
        ],
    )
    assert set(refs) == {"fetch", "report"}
    stored = rows(
        engine,
        schema46,
        "SELECT id::text, data->>'step', pending_dependencies FROM {s}.job ORDER BY 2",
    )
    assert stored == [(refs["fetch"], "1", 0), (refs["report"], "2", 1)]
    [(parent, child)] = rows(
        engine, schema46, "SELECT parent_id::text, child_id::text FROM {s}.job_dependency"
    )
    assert (parent, child) == (refs["fetch"], refs["report"])


def _flow(engine: Engine, schema: str) -> dict[str, uuid.UUID]:
    def work(q: QueueService) -> dict[str, uuid.UUID]:
        q.create_queue("steps")
        return q.flow(
            [
                {"ref": "a", "name": "steps"},
                {"ref": "b", "name": "steps", "depends_on": ["a"]},
            ]
        )

    return read(engine, schema, work)


def test_get_dependencies(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    refs = _flow(engine, schema46)
    parents = get(api, "get_dependencies", {"name": "steps", "id": str(refs["b"])})
    assert parents == [{"name": "steps", "id": str(refs["a"]), "state": "created"}]
    assert get(api, "get_dependencies", {"name": "steps", "id": str(refs["a"])}) == []


def test_get_dependents(engine: Engine, schema46: str) -> None:
    api = client(engine, schema46)
    refs = _flow(engine, schema46)
    children = get(api, "get_dependents", {"name": "steps", "id": str(refs["a"]), "limit": 5})
    assert children == [{"name": "steps", "id": str(refs["b"]), "state": "created"}]


# ------------------------------------------------------------------ schedules


def test_schedule(engine: Engine, at: str) -> None:
    api = client(engine, at)
    read(engine, at, lambda q: q.create_queue("q"))
    result = post(
        api,
        "schedule",
        name="q",
        cron="*/5 * * * *",
        data={"report": "daily"},
        key="five",
        tz="Europe/Paris",
        options={"priority": 3},
    )
    assert result is None
    [stored] = read(engine, at, lambda q: q.get_schedules("q"))
    assert (stored.name, stored.key, stored.cron, stored.timezone) == (
        "q",
        "five",
        "*/5 * * * *",
        "Europe/Paris",
    )
    assert stored.data == {"report": "daily"}
    assert stored.options is not None and stored.options["priority"] == 3


def test_unschedule(engine: Engine, at: str) -> None:
    api = client(engine, at)

    def work(q: QueueService) -> None:
        q.create_queue("q")
        q.schedule("q", "0 * * * *", key="gone")
        q.schedule("q", "0 * * * *", key="kept")

    read(engine, at, work)
    assert post(api, "unschedule", name="q", key="gone") is True
    assert [s.key for s in read(engine, at, lambda q: q.get_schedules("q"))] == ["kept"]


def test_get_schedules(engine: Engine, at: str) -> None:
    api = client(engine, at)

    def work(q: QueueService) -> None:
        for name in ("a", "b"):
            q.create_queue(name)
            q.schedule(name, "15 3 * * *", {"of": name}, key="night")

    read(engine, at, work)
    [schedule] = get(api, "get_schedules", {"name": "b", "key": "night"})
    assert (schedule["name"], schedule["key"], schedule["cron"], schedule["data"]) == (
        "b",
        "night",
        "15 3 * * *",
        {"of": "b"},
    )
    assert len(get(api, "get_schedules", {})) == 2


# ------------------------------------------------------------------ events


def test_publish(engine: Engine, at: str) -> None:
    api = client(engine, at)

    def work(q: QueueService) -> None:
        for name in ("a", "b", "deaf"):
            q.create_queue(name)
        q.subscribe("paid", "a")
        q.subscribe("paid", "b")

    read(engine, at, work)
    ids = post(api, "publish", event="paid", data={"order": 7}, options={"priority": 2})
    assert len(ids) == 2 and None not in ids
    stored = rows(engine, at, "SELECT id::text, name, data, priority FROM {s}.job ORDER BY name")
    assert {r[0] for r in stored} == set(ids)
    assert [r[1:] for r in stored] == [("a", {"order": 7}, 2), ("b", {"order": 7}, 2)]


def test_subscribe(engine: Engine, at: str) -> None:
    api = client(engine, at)
    read(engine, at, lambda q: q.create_queue("q"))
    assert post(api, "subscribe", event="paid", name="q") is None
    [found] = read(engine, at, lambda q: q.get_subscriptions())
    assert (found.event, found.name) == ("paid", "q")


def test_unsubscribe(engine: Engine, at: str) -> None:
    api = client(engine, at)

    def work(q: QueueService) -> None:
        q.create_queue("q")
        q.subscribe("paid", "q")
        q.subscribe("refunded", "q")

    read(engine, at, work)
    assert post(api, "unsubscribe", event="paid", name="q") is True
    left = read(engine, at, lambda q: q.get_subscriptions())
    assert [(s.event, s.name) for s in left] == [("refunded", "q")]


def test_get_subscriptions(engine: Engine, at: str) -> None:
    api = client(engine, at)

    def work(q: QueueService) -> None:
        for name in ("a", "b"):
            q.create_queue(name)
            q.subscribe("paid", name)
        q.subscribe("refunded", "a")

    read(engine, at, work)
    found = get(api, "get_subscriptions", {"name": "a"})
    assert [(s["event"], s["name"]) for s in found] == [("paid", "a"), ("refunded", "a")]
    found = get(api, "get_subscriptions", {"event": "paid"})
    assert [(s["event"], s["name"]) for s in found] == [("paid", "a"), ("paid", "b")]


# ------------------------------------------------------------------ the whole table

SUCCESS_TESTS: dict[str, Callable[..., None]] = {
    "create_queue": test_api.test_a_remote_client_sends_fetches_and_completes_a_job,
    "update_queue": test_update_queue,
    "delete_queue": test_delete_queue,
    "get_queue": test_get_queue,
    "get_queues": test_api.test_reads_take_lists_integers_and_booleans_from_the_query,
    "get_queue_stats": test_get_queue_stats,
    "count_jobs": test_api.test_reads_take_lists_integers_and_booleans_from_the_query,
    "send": test_api.test_a_remote_client_sends_fetches_and_completes_a_job,
    "send_many": test_api.test_reads_take_lists_integers_and_booleans_from_the_query,
    "send_after": test_api.test_pgboss_names_reach_the_same_operations_and_options,
    "send_throttled": test_send_throttled,
    "send_debounced": test_send_debounced,
    "fetch": test_api.test_a_remote_client_sends_fetches_and_completes_a_job,
    "complete": test_api.test_a_remote_client_sends_fetches_and_completes_a_job,
    "fail": test_api.test_failures_and_their_attempts_over_http,
    "complete_many": test_api.test_a_remote_worker_settles_fenced_on_the_attempt_it_fetched,
    "fail_many": test_fail_many,
    "touch": test_touch,
    "extend_leases": test_extend_leases,
    "cancel": test_cancel,
    "resume": test_resume,
    "retry": test_retry,
    "delete_job": test_delete_job,
    "delete_jobs": test_delete_jobs,
    "get_job": test_api.test_a_remote_client_sends_fetches_and_completes_a_job,
    "get_jobs": test_get_jobs,
    "find_jobs": test_api.test_a_remote_client_sends_fetches_and_completes_a_job,
    "get_job_attempts": test_api.test_failures_and_their_attempts_over_http,
    "redrive": test_redrive,
    "flow": test_flow,
    "get_dependencies": test_get_dependencies,
    "get_dependents": test_get_dependents,
    "schedule": test_schedule,
    "unschedule": test_unschedule,
    "get_schedules": test_get_schedules,
    "publish": test_publish,
    "subscribe": test_subscribe,
    "unsubscribe": test_unsubscribe,
    "get_subscriptions": test_get_subscriptions,
}
"""Each operation of the API, and the test in which it succeeds."""


def test_every_operation_has_a_test_of_its_success() -> None:
    document = openapi_document()
    operations = {
        entry["operationId"] for path in document["paths"].values() for entry in path.values()
    }
    assert len(operations) == len(document["paths"])  # one operation per path
    missing = sorted(operations - set(SUCCESS_TESTS))
    assert not missing, f"operations without a test of their success: {missing}"
    assert sorted(set(SUCCESS_TESTS) - operations) == []  # no test of a removed operation
    for name, test in SUCCESS_TESTS.items():
        # The test calls the operation by its path, by pg-boss's name or through this
        # module's post/get, and is a test pytest collects.
        source = inspect.getsource(test)
        spellings = (f"/api/{name}", f"/api/{BY_NAME[name].camel}", f'"{name}"')
        assert any(s in source for s in spellings), (name, test.__name__)
        assert test.__name__.startswith("test_"), test.__name__
