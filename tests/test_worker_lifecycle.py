"""Fencing, leases, timeouts and graceful shutdown, for both worker flavours."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa import AsyncWorker, Worker, backends
from alkstore_sa.records import Job

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def expire_and_refetch(h: Harness, job: Job) -> Job:
    """What a supervisor plus a second worker do to a stalled job: fail it, fetch it again."""
    h.service_tx(lambda q: q.fail(job.name, job.id, {"message": "job timed out"}))
    time.sleep(0.01)  # the re-fetch must run at a later now() than the fail
    [again] = h.service_tx(lambda q: q.fetch(job.name))
    assert again.id == job.id and again.started_on != job.started_on
    assert isinstance(again, Job)
    return again


# --------------------------------------------------------------------- fencing


def test_job_expired_and_refetched_cannot_be_completed_by_the_first_worker(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    second: list[Job] = []
    w = h.worker(poll_interval=30)
    w.register("q", h.handler(on_start=lambda job: second.append(expire_and_refetch(h, job))))
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.worker"):
        h.start(w)
        wait_for(lambda: w.stats()["q"].lost == 1)
        h.stop(w)
    job = h.job("q", job_id)
    # Still the second attempt's: active, with its start time, not completed twice.
    assert job.state.value == "active" and job.started_on == second[0].started_on
    assert w.stats()["q"].completed == 0
    assert [r for r in caplog.records if getattr(r, "action", None) == "job_lost"]


def test_transactional_handler_of_a_lost_job_rolls_back_its_writes(harness: Harness) -> None:
    h = harness
    h.sql("CREATE TABLE {s}.effects (job_id uuid PRIMARY KEY)")
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    w = h.worker(poll_interval=30)
    w.register(
        "q",
        h.handler(
            on_start=lambda job: expire_and_refetch(h, job),
            sql="INSERT INTO {s}.effects VALUES (:id)",
        ),
        transactional=True,
    )
    h.start(w)
    wait_for(lambda: w.stats()["q"].lost == 1)
    h.stop(w)
    assert h.sql("SELECT * FROM {s}.effects") == []  # exactly once: the other attempt owns it
    assert state_of(h, "q", job_id) == "active"


# --------------------------------------------------------------------- leases


def test_long_job_gets_its_lease_extended_and_does_not_expire(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", expire_seconds=2))
    job_id = send(h, "q")
    release = threading.Event()
    w = h.worker(poll_interval=30)
    w.register("q", h.handler(block=release))
    h.start(w)
    wait_for(lambda: h.started)
    time.sleep(2.3)  # past the original expiry
    [(expire_seconds, lease_left)] = h.sql(
        "SELECT expire_seconds, extract(epoch FROM started_on + expire_seconds * interval '1s' "
        "- now()) FROM {s}.job WHERE id = :id",
        id=job_id,
    )
    release.set()
    wait_for(lambda: state_of(h, "q", job_id) == "completed")
    h.stop(w)
    assert expire_seconds > 2 and lease_left > 0
    assert h.job("q", job_id).retry_count == 0


def test_without_lease_extension_the_expiry_is_the_job_timeout(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", expire_seconds=1, retry_limit=0))
    job_id = send(h, "q")
    release = threading.Event()
    w = h.worker(poll_interval=30)
    w.register("q", h.handler(block=release), extend_lease=False)
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "failed", timeout=5)
    release.set()
    h.stop(w)
    job = h.job("q", job_id)
    assert job.output["name"] == "JobTimeout" and job.expire_seconds == 1


# --------------------------------------------------------------------- timeouts


def test_handler_past_its_timeout_is_failed_and_cannot_complete_later(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    job_id = send(h, "q")
    release = threading.Event()
    w = h.worker(poll_interval=30)
    w.register("q", h.handler(block=release, body=lambda job: "late"), timeout=0.3)
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "failed", timeout=5)
    job = h.job("q", job_id)
    assert job.output == {
        "name": "JobTimeout",
        "message": "handler ran longer than its 0.3 s timeout",
    }
    release.set()  # a sync handler was abandoned, not killed: let it return now
    if h.is_async:
        wait_for(lambda: h.cancelled == [job_id])
    else:
        wait_for(lambda: h.active == 0)
    h.stop(w)
    assert state_of(h, "q", job_id) == "failed"
    assert w.stats()["q"].completed == 0


def test_a_timed_out_handler_gives_its_concurrency_slot_to_the_next_job(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    stuck = send(h, "q", "stuck")
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    w.register(
        "q",
        h.handler(block=lambda job: release if job.data == "stuck" else None),
        concurrency=1,
        timeout=0.3,
    )
    h.start(w)
    wait_for(lambda: h.started == [stuck])
    quick = send(h, "q", "quick")
    # The stuck sync handler still runs (threads cannot be killed), yet the
    # queue moves on: its thread was replaced when the job timed out.
    wait_for(lambda: state_of(h, "q", quick) == "completed", timeout=5)
    assert state_of(h, "q", stuck) == "failed"
    release.set()
    h.stop(w)


def test_a_handler_whose_lease_is_lost_is_abandoned_and_gives_its_slot_to_the_next_job(
    harness: Harness,
) -> None:
    # One behaviour for both workers: the attempt is counted lost, nothing is
    # written for it, its handler is cut loose (an async one cancelled, a sync
    # one left to finish with its result ignored) and the queue moves on.
    h = harness
    h.service_tx(lambda q: q.create_queue("q", expire_seconds=1))
    stuck = send(h, "q", "stuck")
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    w.register(
        "q",
        h.handler(
            on_start=lambda job: (
                h.service_tx(lambda q: q.cancel("q", job.id)) if job.data == "stuck" else None
            ),
            block=lambda job: release if job.data == "stuck" else None,
        ),
        concurrency=1,
    )
    h.start(w)
    wait_for(lambda: w.stats()["q"].lost == 1, timeout=5)
    assert w.stats()["q"].running == 0
    if h.is_async:
        wait_for(lambda: h.cancelled == [stuck])
    quick = send(h, "q", "quick")
    wait_for(lambda: state_of(h, "q", quick) == "completed", timeout=5)
    release.set()
    if not h.is_async:
        wait_for(lambda: h.active == 0)  # the abandoned handler returned: ignored
    h.stop(w)
    assert state_of(h, "q", stuck) == "cancelled"
    stats = w.stats()["q"]
    assert (stats.completed, stats.failed, stats.lost) == (1, 0, 1)


# --------------------------------------------------------------------- shutdown


def test_stop_lets_a_running_job_finish_within_the_timeout(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    w = h.worker(poll_interval=30)
    w.register("q", h.handler(sleep=0.4, body=lambda job: "finished"))
    h.start(w)
    wait_for(lambda: h.started)
    took = h.stop(w, timeout=5)
    assert state_of(h, "q", job_id) == "completed"
    assert h.job("q", job_id).output == {"value": "finished"}
    assert took < 3


def test_stop_fails_jobs_still_running_at_the_timeout_so_they_are_retried(
    harness: Harness,
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    running = send(h, "q", "running")
    release = threading.Event()
    w = h.worker(poll_interval=30)
    w.register("q", h.handler(block=release))
    h.start(w)
    wait_for(lambda: h.started)
    queued = send(h, "q", "queued", start_after=60)
    took = h.stop(w, timeout=0.3)
    release.set()
    job = h.job("q", running)
    assert job.state.value == "retry"
    assert job.output == {"name": "WorkerShutdown", "message": "worker shut down while active"}
    assert state_of(h, "q", queued) == "created"  # never fetched: still queued
    assert took < 3
    if h.is_async:
        assert h.cancelled == [running]


def test_stop_with_zero_timeout_fails_running_jobs_at_once(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    release = threading.Event()
    w = h.worker(poll_interval=30)
    w.register("q", h.handler(block=release))
    h.start(w)
    wait_for(lambda: h.started)
    took = h.stop(w, timeout=0)
    release.set()
    assert state_of(h, "q", job_id) == "retry"
    assert took < 2


def test_stopped_worker_fetches_nothing_more(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.worker(poll_interval=0.05)
    w.register("q", h.handler())
    h.start(w)
    h.stop(w)
    job_id = send(h, "q")
    time.sleep(0.3)
    assert state_of(h, "q", job_id) == "created" and h.started == []


def test_supervisor_starts_and_stops_with_the_worker(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    events: list[tuple[str, Any]] = []

    class FakeSupervisor:
        def __init__(self, engine: Any, *, schema: str, **settings: Any) -> None:
            events.append(("init", (schema, settings)))

        def start(self) -> Any:
            events.append(("start", None))
            return _maybe_async(h)

        def stop(self, timeout: float | None = None) -> Any:
            events.append(("stop", None))
            return _maybe_async(h)

    monkeypatch.setattr(
        Worker if not h.is_async else AsyncWorker, "_supervisor_class", FakeSupervisor
    )
    w = h.worker(supervise=True, supervisor_options={"monitor_interval": 5})
    w.register("q", h.handler())
    h.start(w)
    h.stop(w)
    assert events == [
        # The worker hands its backend profile to its supervisor.
        ("init", (h.schema, {"backend": backends.POSTGRES, "monitor_interval": 5})),
        ("start", None),
        ("stop", None),
    ]


def _maybe_async(h: Harness) -> Any:
    if not h.is_async:
        return None

    async def done() -> None:
        return None

    return done()
