"""A crashed worker's jobs come back within about a minute (schema 46).

A worker's claim gives each job without a heartbeat its ``liveness_seconds`` (20 by
default) and the worker renews it while the job is in hand; every half of it, the
worker sweeps its queues for jobs whose heartbeat stopped (a worker that died or
froze) and fails them for retry, as the supervisor's heartbeat expiry and Node's
monitor do. The kill -9 runs of it are in tests/chaos/test_chaos_rescue.py.
"""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa import Worker
from alkstore_sa.errors import InvalidOptionsError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def heartbeat_of(h: Harness, job_id: uuid.UUID) -> int | None:
    [(seconds,)] = h.sql("SELECT heartbeat_seconds FROM {s}.job WHERE id = :i", i=job_id)
    return None if seconds is None else int(seconds)


def test_a_workers_claim_gives_a_job_without_a_heartbeat_its_liveness(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q"))
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(block=release), concurrency=2)
    h.start(w)
    try:
        plain = send(h, "q")
        own = send(h, "q", heartbeat_seconds=30)
        wait_for(lambda: {plain, own} <= set(h.started))
        assert heartbeat_of(h, plain) == 20  # liveness_seconds, by default
        assert heartbeat_of(h, own) == 30  # a job's own heartbeat is kept
    finally:
        release.set()
    wait_for(lambda: state_of(h, "q", plain) == "completed")


def test_without_liveness_a_claim_leaves_the_heartbeat_alone(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q"))
    release = threading.Event()
    w = h.worker(poll_interval=0.1, liveness_seconds=None)
    w.register("q", h.handler(block=release))
    h.start(w)
    try:
        job_id = send(h, "q")
        wait_for(lambda: job_id in h.started)
        assert heartbeat_of(h, job_id) is None
    finally:
        release.set()


def test_a_worker_fails_for_retry_the_jobs_of_a_worker_that_stopped_answering(
    harness46: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1))
    job_id = send(h, "q")
    # A worker claimed it (as ours do, with a heartbeat) and died eleven seconds ago:
    # its last touch is older than the job's heartbeat.
    [claimed] = h.service_tx(lambda q: q.fetch("q"))
    h.sql(
        "UPDATE {s}.job SET heartbeat_seconds = 10, heartbeat_on = now() - interval '11 s',"
        " started_on = now() - interval '11 s' WHERE id = :i",
        i=job_id,
    )
    assert claimed.id == job_id
    w = h.worker(poll_interval=0.1, liveness_seconds=10)  # its supervisor is off (harness)
    w.register("q", h.handler(body=lambda job: "again"))
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.worker"):
        h.start(w)
        wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=10)
    job = h.job("q", job_id)
    assert job.retry_count == 1 and job.output == {"value": "again"}
    assert h.started == [job_id]
    rescued = [r for r in caplog.records if getattr(r, "action", None) == "jobs_rescued"]
    assert rescued and "stopped answering" in rescued[0].getMessage()


@pytest.mark.parametrize("bad", [9, 3601, 1.5, True, "20"])
def test_liveness_seconds_is_checked(engine: object, bad: object) -> None:
    with pytest.raises(InvalidOptionsError, match="liveness_seconds"):
        Worker(engine, liveness_seconds=bad)  # type: ignore[arg-type]
