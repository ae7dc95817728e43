"""A buffer never runs a job twice.

A job claimed ahead (``prefetch``) is ``active`` and its lease runs while it waits
in the worker's buffer. When a running job in front of it runs long, the buffered
job must never be started once its lease may have lapsed: supervision may have
failed it for retry and another worker may have run it meanwhile. The worker gives
such jobs back before their lease runs out (no attempt counted), drops any it finds
lapsed, and stops claiming ahead while a running job is past its expected time.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa import QueueService
from alkstore_sa.records import Job
from alkstore_sa.worker import HandlerSpec
from alkstore_sa.worker._attempt import Attempt
from alkstore_sa.worker._queue_state import QueueState

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def warm(h: Harness, queue: str, n: int = 3) -> None:
    for _ in range(n):
        job_id = send(h, queue)

        def done(job_id: uuid.UUID = job_id) -> bool:
            return state_of(h, queue, job_id) == "completed"

        wait_for(done)


def test_a_buffered_job_whose_lease_may_lapse_is_never_started_after_another_ran_it(
    harness: Harness,
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=2))
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    hang = h.handler(block=lambda job: release if job.data == "hang" else None)
    w.register("q", hang, concurrency=1, prefetch=3)
    h.start(w)
    try:
        warm(h, "q")
        stuck = send(h, "q", "hang", expire_seconds=60)
        wait_for(lambda: stuck in h.started)
        waiting = h.service_tx(
            lambda q: q.send_many("q", [{"data": i, "expire_seconds": 1} for i in range(3)])
        )
        # Whatever the worker did with its buffer, once the buffered jobs' one-second
        # leases are over, supervision returns what is still active and another
        # client runs every one of them to completion.
        done: set[uuid.UUID] = set()

        def others_ran_them() -> bool:
            h.service_tx(lambda q: q.supervise("q", force=True))
            fetched: list[Job] = h.service_tx(lambda q: q.fetch("q", 10))
            for job in fetched:
                if job.id in waiting:

                    def complete(q: QueueService, job: Job = job) -> object:
                        return q.complete("q", job)

                    h.service_tx(complete)
                    done.add(job.id)
            return done == set(waiting)

        wait_for(others_ran_them, timeout=15, interval=0.2)
    finally:
        release.set()
    wait_for(lambda: state_of(h, "q", stuck) == "completed")
    # Give a buffer that wrongly kept them the time to start them, then look.
    wait_for(lambda: w.stats()["q"].running == 0 and w.stats()["q"].buffered == 0)
    assert not set(waiting) & set(h.started), "a job run by another client ran again here"
    assert all(state_of(h, "q", j) == "completed" for j in waiting)
    # Given back before their leases ran out: no attempt was counted for them.
    assert [h.job("q", j).retry_count for j in waiting] == [0, 0, 0]
    assert w.stats()["q"].lost == 0


def _attempt(spec: HandlerSpec, lease_start: float, expire: int = 10) -> Attempt:
    job = Job.__new__(Job)
    for field, value in (("id", uuid.uuid4()), ("name", spec.queue), ("expire_seconds", expire)):
        object.__setattr__(job, field, value)
    return Attempt(job, spec, lease_start=lease_start, deadline=None, lease_seconds=float(expire))


def test_claiming_ahead_stops_while_a_running_job_is_past_its_expected_time() -> None:
    spec = HandlerSpec("q", lambda job: None, concurrency=1, prefetch=4)
    state = QueueState(spec, threading.Event())
    state.ahead_allowed = True
    state.ran(0.01)
    now = time.monotonic()
    running = _attempt(spec, now)
    state.claimed([running], 1)
    assert state.new_runner(now, inline=False) is running
    assert state.ahead(now + 0.05) == 4  # running about as long as expected: claim ahead
    assert state.ahead(now + 5.0) == 0  # far past its expected time: stop
