"""Every public method of AsyncQueueService, called once, answers as QueueService does.

The async service is generated from the sync one (``tools/gen_async.py``) and runs the very
same operation code; only the driver (``ops.driver.arun``) and the ``AsyncSession``
plumbing differ. The full service suite runs both flavours in the slow tier; the fast tier
keeps this walk: one scenario at schema 46 that calls every public method of the service,
run once with each flavour, with literal expectations along the way, and the async
answers compared with the sync ones step by step. A method added to the service without a
step here fails :func:`test_the_scenario_calls_every_public_method`.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from conftest import Env
from sqlalchemy import Engine
from support.schemas import drop_schema, install, random_schema

from alkstore_sa import QueueService

Observed = list[tuple[str, Any]]


def _public_methods() -> set[str]:
    return {
        name
        for name, value in vars(QueueService).items()
        if not name.startswith("_") and (callable(value) or isinstance(value, property))
    }


class Recorder:
    """Calls a service method, records the method's name and a comparable form of the answer."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.called: set[str] = set()
        self.seen: Observed = []

    def __call__(self, method: str, *args: Any, **kwargs: Any) -> Any:
        self.called.add(method)
        value = getattr(self.service, method)
        if callable(value):
            value = value(*args, **kwargs)
        return value

    def note(self, step: str, value: Any) -> Any:
        self.seen.append((step, value))
        return value


def scenario(env: Env) -> Recorder:
    """The walk over the whole service; answers are noted without ids or timestamps."""
    q = Recorder(env.service())
    note = q.note
    note("schema", q("schema") == env.schema)

    note("create_queue", q("create_queue", "smoke", retry_limit=0).name)
    q("create_queue", "dlq")
    q("create_queue", "other")
    q("create_queue", "fifo", policy="key_strict_fifo")
    note("update_queue", q("update_queue", "smoke", dead_letter="dlq").dead_letter)
    note("ensure_queue", q("ensure_queue", "other", retry_delay=3).retry_delay)
    note("get_queue", q("get_queue", "smoke").retry_limit)
    note("get_queues", [info.name for info in q("get_queues")])

    first = q("send", "smoke", {"n": 1})
    note("send", isinstance(first, uuid.UUID))
    many = q("send_many", "smoke", [{"data": {"n": 2}}, {"data": {"n": 3}, "priority": 1}])
    note("send_many", [isinstance(i, uuid.UUID) for i in many])
    later = q("send_after", "smoke", {"n": 4}, dt.timedelta(hours=1))
    note("send_after", isinstance(later, uuid.UUID))
    throttled = [q("send_throttled", "other", {"n": 5}, 60, "t") for _ in range(2)]
    note("send_throttled", [i is not None for i in throttled])
    debounced = [q("send_debounced", "other", {"n": 6}, 60, "d") for _ in range(2)]
    note("send_debounced", [i is not None for i in debounced])

    q("subscribe", "ev", "other")
    note("get_subscriptions", [(s.event, s.name) for s in q("get_subscriptions")])
    note("publish", len(q("publish", "ev", {"e": 1})))
    note("unsubscribe", q("unsubscribe", "ev", "other"))

    flow = q(
        "flow", [{"ref": "p", "name": "other"}, {"ref": "c", "name": "other", "depends_on": ["p"]}]
    )
    note("flow", sorted(flow))
    note("get_dependencies", [d.id == flow["p"] for d in q("get_dependencies", "other", flow["c"])])
    note("get_dependents", [d.id == flow["c"] for d in q("get_dependents", "other", flow["p"])])

    upserted = q("upsert", "other", {"v": 1}, singleton_key="u")
    note("upsert", (upserted.inserted, upserted.updated, upserted.rejected))
    note("update", q("update", "other", {"v": 2}, singleton_key="u").updated)
    note("get_blocked_keys", q("get_blocked_keys", "fifo"))

    jobs = q("fetch", "smoke", 3)
    note("fetch", sorted(job.data["n"] for job in jobs))
    by_n = {job.data["n"]: job for job in jobs}
    note("touch", len(q("touch", "smoke", by_n[1]).affected))
    note("extend_leases", q("extend_leases", "smoke", [by_n[1]], 120) == [by_n[1].id])
    note("complete", len(q("complete", "smoke", by_n[1], {"ok": True}).affected))
    note("fail", len(q("fail", "smoke", by_n[2], {"why": "x"}).affected))
    more = q("fetch", "smoke", 1)
    note("fetch again", more)
    dlq = q("fetch", "dlq", 1)
    note("dead letter", [job.data for job in dlq])
    note("fail_many", len(q("fail_many", "dlq", [(dlq[0], {"again": 1})], per_job=True).affected))
    note(
        "complete_many",
        len(q("complete_many", "smoke", [(by_n[3], {"n": 3})], per_job=True).affected),
    )

    hour_ago = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    note("count_completions", sum(q("count_completions", ["smoke"], since=hour_ago)["smoke"]))
    note("get_job", q("get_job", "smoke", first).state)
    note(
        "get_job_attempts",
        [(a.attempt, a.cause, a.error) for a in q("get_job_attempts", "smoke", by_n[2].id)],
    )
    note("get_jobs", sorted(job.state for job in q("get_jobs", "smoke", [first, *many])))
    note("list_jobs", sorted(job.state for job in q("list_jobs", "smoke")))
    note("find_jobs", len(q("find_jobs", "smoke").jobs))
    note(
        "count_jobs",
        sorted(
            (c.name, sorted(c.counts.items())) for c in q("count_jobs", ["smoke", "dlq", "other"])
        ),
    )
    note("get_queue_stats", q("get_queue_stats", "smoke").name)

    note("cancel", len(q("cancel", "smoke", later).affected))
    note("resume", len(q("resume", "smoke", later).affected))
    note("retry", len(q("retry", "dlq", dlq[0].id).affected))
    note("redrive", len(q("redrive", "dlq", "smoke")))
    note("delete_job", len(q("delete_job", "smoke", later).affected))
    note("delete_jobs", len(q("delete_jobs", "smoke", [first]).affected))

    q("schedule", "smoke", "*/5 * * * *", {"s": 1}, key="k")
    note("get_schedules", [(s.name, s.key, s.cron) for s in q("get_schedules")])
    note("unschedule", q("unschedule", "smoke", "k"))

    report = q("supervise", force=True)
    note("supervise", report.busy)
    note("get_queue_stats_history", q("get_queue_stats_history", "smoke"))
    note("get_warnings", q("get_warnings"))
    note("get_instances", q("get_instances"))

    note("delete_queued_jobs", q("delete_queued_jobs", "other"))
    note("delete_stored_jobs", q("delete_stored_jobs", "smoke"))
    note("delete_all_jobs", q("delete_all_jobs", "dlq"))
    note("delete_queue", q("delete_queue", "fifo"))
    env.commit()
    return q


@pytest.fixture
def pair(engine: Engine, database_url: str, spoken46: None) -> Iterator[Callable[[str], Env]]:
    """``pair(flavour)``: an :class:`Env` of that flavour on its own fresh schema at 46."""
    made: list[Env] = []

    def make(flavour: str) -> Env:
        name = random_schema()
        install(database_url, name, 46)
        made.append(Env(flavour, engine, name, database_url))
        return made[-1]

    yield make
    for e in made:
        e.close()
        drop_schema(engine, e.schema)


def test_async_service_answers_every_call_as_the_sync_one(pair: Callable[[str], Env]) -> None:
    sync, aio = scenario(pair("sync")), scenario(pair("async"))
    expected = dict(sync.seen)
    # Literal expectations, so that both flavours being wrong the same way still fails.
    assert expected["create_queue"] == "smoke"
    assert expected["update_queue"] == "dlq"
    assert expected["get_queues"] == ["dlq", "fifo", "other", "smoke"]
    assert expected["send_many"] == [True, True]
    assert expected["send_throttled"] == [True, False]
    assert expected["get_subscriptions"] == [("ev", "other")]
    assert expected["publish"] == 1
    assert expected["flow"] == ["c", "p"]
    assert expected["get_dependencies"] == [True]
    assert expected["upsert"] == (1, 0, False)
    assert expected["update"] == 1
    assert expected["fetch"] == [1, 2, 3]
    assert expected["complete"] == 1
    assert expected["dead letter"] == [{"n": 2}]
    assert (expected["touch"], expected["fail"], expected["fail_many"]) == (1, 1, 1)
    assert (expected["cancel"], expected["resume"], expected["retry"]) == (1, 1, 0)
    assert expected["get_job"] == "completed"
    assert expected["get_job_attempts"] == [(1, "failed", {"why": "x"})]
    assert expected["redrive"] == 1
    assert expected["get_schedules"] == [("smoke", "k", "*/5 * * * *")]
    assert (expected["delete_queued_jobs"], expected["delete_stored_jobs"]) == (7, 2)
    assert expected["delete_queue"] is True
    assert aio.seen == sync.seen


def test_the_scenario_calls_every_public_method(pair: Callable[[str], Env]) -> None:
    walked = scenario(pair("async"))
    assert _public_methods() - walked.called == set()
