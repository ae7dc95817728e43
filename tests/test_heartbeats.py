"""Heartbeats at schema 46: ``QueueService.touch`` (pg-boss 12.38's ``touch``), its fence,
its refusal at 26, and supervision failing a job whose heartbeat lapsed, as Node does.

A job with ``heartbeat_seconds`` must have ``heartbeat_on`` moved at least that often while
it is active; supervision fails it otherwise with ``{"value": {"message": "job heartbeat
timeout"}}``. Workers touch their jobs themselves (tests/test_worker_46.py shows the cadence;
here a worker keeps a job alive through supervision passes).
"""

from __future__ import annotations

import datetime as dt
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from support.node import NodeBoss46, node46, node46_modules, node_url
from support.worker import Harness, state_of, wait_for

from alkstore_sa import InvalidOptionsError, Job, QueueNotFoundError, SchemaFeatureError, Settled
from alkstore_sa.sql.v46.fail import HEARTBEAT_OUTPUT

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below


def fetched(env: Any, queue: str, **send: Any) -> Job:
    """Send one job to ``queue`` and fetch it, each in its own transaction."""
    env.tx(lambda q: q.send(queue, {"n": 1}, **send))
    [job] = env.tx(lambda q: q.fetch(queue))
    return job  # type: ignore[no-any-return]


def beat_of(env: Any, job_id: uuid.UUID) -> dt.datetime:
    [(beat,)] = env.sql("SELECT heartbeat_on FROM {s}.job WHERE id = :i", i=job_id)
    return beat  # type: ignore[no-any-return]


def age_heartbeat(env: Any, job_id: uuid.UUID, seconds: int) -> dt.datetime:
    """Move the job's heartbeat ``seconds`` into the past; return the new value."""
    [(beat,)] = env.sql(
        "UPDATE {s}.job SET heartbeat_on = now() - make_interval(secs => :n) "
        "WHERE id = :i RETURNING heartbeat_on",
        n=seconds,
        i=job_id,
    )
    return beat  # type: ignore[no-any-return]


# ------------------------------------------------------------------ touch


def test_touch_of_the_fetched_job_refreshes_its_heartbeat(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", heartbeat_seconds=30))
    job = fetched(env46, "q")
    old = age_heartbeat(env46, job.id, 20)
    result = env46.tx(lambda q: q.touch("q", job))
    assert result == Settled(1, [job.id])
    assert beat_of(env46, job.id) > old + dt.timedelta(seconds=19)


def test_touch_moves_the_heartbeat_only_not_the_lease(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", heartbeat_seconds=30, expire_seconds=60))
    job = fetched(env46, "q")
    age_heartbeat(env46, job.id, 20)
    env46.tx(lambda q: q.touch("q", [job]))
    [(expire, state)] = env46.sql(
        "SELECT expire_seconds, state::text FROM {s}.job WHERE id = :i", i=job.id
    )
    assert (expire, state) == (60, "active")


def test_extend_leases_also_stamps_the_heartbeat(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", heartbeat_seconds=30, expire_seconds=60))
    job = fetched(env46, "q")
    old = age_heartbeat(env46, job.id, 20)
    assert env46.tx(lambda q: q.extend_leases("q", [job], 120)) == [job.id]
    assert beat_of(env46, job.id) > old


def test_touch_of_a_job_fetched_again_by_another_worker_is_refused_without_effect(
    env46: Any,
) -> None:
    env46.tx(lambda q: q.create_queue("q", heartbeat_seconds=30))
    job = fetched(env46, "q")
    # The lease lapsed and another worker claimed the job: a new attempt.
    env46.sql(
        "UPDATE {s}.job SET started_on = started_on + interval '5 minutes', "
        "heartbeat_on = now() - interval '20 seconds' WHERE id = :i",
        i=job.id,
    )
    before = beat_of(env46, job.id)
    result = env46.tx(lambda q: q.touch("q", job))
    assert (result.requested, result.affected) == (1, [])
    assert beat_of(env46, job.id) == before


def test_touch_of_a_job_no_longer_active_changes_nothing(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", heartbeat_seconds=30))
    job = fetched(env46, "q")
    env46.tx(lambda q: q.complete("q", job))
    before = beat_of(env46, job.id)
    assert env46.tx(lambda q: q.touch("q", job)).affected == []
    assert env46.tx(lambda q: q.touch("q", job.id)).affected == []
    assert beat_of(env46, job.id) == before


def test_touch_by_id_is_unfenced_and_touches_the_active_attempt(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", heartbeat_seconds=30))
    job = fetched(env46, "q")
    env46.sql(
        "UPDATE {s}.job SET started_on = started_on + interval '5 minutes' WHERE id = :i", i=job.id
    )
    old = age_heartbeat(env46, job.id, 20)
    assert env46.tx(lambda q: q.touch("q", str(job.id))).affected == [job.id]
    assert beat_of(env46, job.id) > old


def test_touch_of_an_unknown_id_touches_nothing(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    assert env46.tx(lambda q: q.touch("q", uuid.uuid4())) == Settled(1, [])
    assert env46.tx(lambda q: q.touch("q", [])) == Settled(0, [])


def test_touch_of_a_missing_queue_raises_and_bad_input_is_refused_before_sql(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    env46.tx(lambda q: q.create_queue("other"))
    job = fetched(env46, "other")
    never_fetched = env46.tx(lambda q: q.get_job("other", q.send("other", {})))
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match="belongs to queue 'other'"):
        svc.touch("q", job)
    with pytest.raises(InvalidOptionsError, match="no started_on"):
        svc.touch("other", never_fetched)
    with pytest.raises(InvalidOptionsError):
        svc.touch("q", "not-a-uuid")
    with pytest.raises(InvalidOptionsError):
        svc.touch("q", 42)
    # The caller's transaction is intact after every refusal.
    assert svc.send("q", {"after": True}) is not None
    env46.commit()
    with pytest.raises(QueueNotFoundError, match="'missing'"):
        env46.tx(lambda q: q.touch("missing", uuid.uuid4()))


def test_touch_at_schema_26_is_refused_before_any_statement(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    svc = env.service()
    with pytest.raises(SchemaFeatureError, match=r"touch needs .* 46") as raised:
        svc.touch("q", uuid.uuid4())
    assert (raised.value.feature, raised.value.needed, raised.value.found) == ("touch", 46, 26)
    # The transaction is still usable.
    assert svc.send("q", {"after": True}) is not None
    env.commit()


@pytest.mark.parametrize("seconds", [9, 0, -1, 1.5, "10"])
def test_a_heartbeat_below_pgboss_minimum_of_10_seconds_is_refused(
    env46: Any, seconds: Any
) -> None:
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match="heartbeat_seconds"):
        svc.create_queue("q", heartbeat_seconds=seconds)
    svc.create_queue("ok", heartbeat_seconds=10)
    with pytest.raises(InvalidOptionsError, match="heartbeat_seconds"):
        svc.send("ok", {}, heartbeat_seconds=seconds)
    assert svc.get_queue("ok").heartbeat_seconds == 10
    env46.commit()


# ------------------------------------------------------------------ supervision


def test_supervision_fails_a_lapsed_heartbeat_and_spares_a_touched_one(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", heartbeat_seconds=10, retry_limit=0))
    env46.tx(lambda q: q.send_many("q", [{"data": {"n": 1}}, {"data": {"n": 2}}]))
    lapsed, touched = env46.tx(lambda q: q.fetch("q", 2))
    age_heartbeat(env46, lapsed.id, 30)
    age_heartbeat(env46, touched.id, 30)
    env46.tx(lambda q: q.touch("q", touched))
    report = env46.tx(lambda q: q.supervise("q", force=True))
    assert report.expired == {"q": 1}
    rows = dict(env46.sql("SELECT id, state::text FROM {s}.job WHERE name = 'q'"))
    assert rows == {lapsed.id: "failed", touched.id: "active"}
    [(output,)] = env46.sql("SELECT output FROM {s}.job WHERE id = :i", i=lapsed.id)
    assert output == HEARTBEAT_OUTPUT


@pytest.mark.interop
def test_a_lapsed_heartbeat_is_failed_alike_by_node_1238_and_by_us(
    env46_sync: Any, node46: Callable[..., NodeBoss46]
) -> None:
    for name in ("by_node", "by_us"):
        env46_sync.tx(lambda q, n=name: q.create_queue("dlq_" + n))
        env46_sync.tx(
            lambda q, n=name: q.create_queue(
                n, heartbeat_seconds=10, retry_limit=1, retry_delay=5, dead_letter="dlq_" + n
            )
        )
    jobs = {}
    for name in ("by_node", "by_us"):
        env46_sync.tx(lambda q, n=name: q.send(n, {"work": 1}, priority=3))
        [jobs[name]] = env46_sync.tx(lambda q, n=name: q.fetch(n))
        age_heartbeat(env46_sync, jobs[name].id, 30)
    boss = node46(env46_sync.schema)

    def clock() -> Any:
        [(now,)] = env46_sync.sql("SELECT clock_timestamp()")
        return now

    # Each side's retry starts retry_delay after its own pass: bracket each pass in time.
    passes = {"by_node": [clock()]}
    boss.call("supervise", "by_node")
    passes["by_node"].append(clock())
    passes["by_us"] = [clock()]
    env46_sync.tx(lambda q: q.supervise("by_us", force=True))
    passes["by_us"].append(clock())

    columns = (
        "state::text, retry_count, retry_limit, output, heartbeat_on, heartbeat_seconds, "
        "started_on IS NOT NULL AS started, completed_on IS NULL AS open, "
        "start_after"
    )

    def row(name: str, retried: bool) -> dict[str, Any]:
        [r] = env46_sync.sql(f"SELECT {columns} FROM {{s}}.job WHERE id = :i", i=jobs[name].id)
        found = dict(r._mapping)
        start_after = found.pop("start_after")
        if retried:
            before, after = passes[name]
            delay = dt.timedelta(seconds=5)
            assert before + delay <= start_after <= after + delay, name
        return found

    ours, theirs = row("by_us", retried=True), row("by_node", retried=True)
    assert ours == theirs
    assert (ours["state"], ours["output"], ours["heartbeat_on"]) == (
        "retry",
        HEARTBEAT_OUTPUT,
        None,
    )
    # The last attempt lapses too: both end failed, with a dead-letter copy alike.
    for name in ("by_node", "by_us"):
        env46_sync.sql("UPDATE {s}.job SET start_after = now() WHERE id = :i", i=jobs[name].id)
        [jobs[name]] = env46_sync.tx(lambda q, n=name: q.fetch(n))
        age_heartbeat(env46_sync, jobs[name].id, 30)
    # Node's monitor turn for the queue comes once per interval: make it due again.
    env46_sync.sql("UPDATE {s}.queue SET monitor_claim_on = NULL, monitor_on = NULL")
    boss.call("supervise", "by_node")
    env46_sync.tx(lambda q: q.supervise("by_us", force=True))
    ours, theirs = row("by_us", retried=False), row("by_node", retried=False)
    assert ours == theirs and ours["state"] == "failed"
    copies = {}
    for name in ("by_node", "by_us"):
        [copies[name]] = env46_sync.sql(
            "SELECT data, priority, source_name = :n AS from_source, source_id, source_root_id, "
            "source_output, source_retry_count, heartbeat_seconds, output "
            "FROM {s}.job WHERE name = :d",
            n=name,
            d="dlq_" + name,
        )
    for name, copy in copies.items():
        assert (copy.source_id, copy.source_root_id) == (jobs[name].id, jobs[name].id)
    drop = ("source_id", "source_root_id")
    assert {k: v for k, v in copies["by_us"]._asdict().items() if k not in drop} == {
        k: v for k, v in copies["by_node"]._asdict().items() if k not in drop
    }
    assert copies["by_us"].source_output == HEARTBEAT_OUTPUT


# ------------------------------------------------------------------ workers


def test_a_worker_keeps_a_long_job_alive_through_supervision_by_its_heartbeat(
    harness46: Harness,
) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("slow", retry_limit=0, expire_seconds=300))
    # A 2-second heartbeat (written as Node could, below the API's 10 s minimum) keeps
    # the test short: the worker touches every second.
    h.sql("UPDATE {s}.queue SET heartbeat_seconds = 2 WHERE name = 'slow'")
    job_id = h.service_tx(lambda q: q.send("slow", {}))
    release = threading.Event()
    w = h.start(
        h.worker(poll_interval=0.2, extend_lease=False, handlers={"slow": h.handler(block=release)})
    )
    wait_for(lambda: state_of(h, "slow", job_id) == "active")
    beats: set[Any] = set()

    def supervised_while_beating() -> bool:
        report = h.service_tx(lambda q: q.supervise("slow", force=True))
        assert not report.expired, report  # never failed for its heartbeat
        [(beat,)] = h.sql("SELECT heartbeat_on FROM {s}.job WHERE id = :i", i=job_id)
        beats.add(beat)
        return len(beats) >= 4  # over three heartbeats' worth of touches

    wait_for(supervised_while_beating, timeout=20, interval=0.3)
    assert state_of(h, "slow", job_id) == "active"
    release.set()
    wait_for(lambda: state_of(h, "slow", job_id) == "completed")
    h.stop(w)
