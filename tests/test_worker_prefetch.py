"""Workers claim ahead of their free handler slots (``prefetch``).

A claimed-ahead job waits in the worker's buffer, ``active`` in the table, until a
runner takes it; a graceful stop gives the buffer back without counting an attempt.
How much is claimed ahead follows the handlers' average run time (about a second
of work at most) and only on ``standard`` queues without group limits.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa import QueueService
from alkstore_sa._engine_cache import execution_options
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.ops import Context, driver, give_back
from alkstore_sa.records import Job
from alkstore_sa.worker import HandlerSpec, Worker
from alkstore_sa.worker._attempt import Attempt
from alkstore_sa.worker._queue_state import QueueState

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def warm(h: Harness, queue: str, n: int = 3) -> None:
    """Run ``n`` jobs one by one, so the queue's handlers are known to be fast."""
    for _ in range(n):
        job_id = send(h, queue)

        def done(job_id: uuid.UUID = job_id) -> bool:
            return state_of(h, queue, job_id) == "completed"

        wait_for(done)


def rows(h: Harness, queue: str) -> dict[uuid.UUID, Any]:
    found = h.sql(
        "SELECT id, state::text AS state, retry_count, started_on FROM {s}.job WHERE name = :q",
        q=queue,
    )
    return {r.id: r for r in found}


def test_jobs_are_claimed_ahead_and_given_back_unstarted_at_a_graceful_stop(
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
        stuck = send(h, "q", "hang")
        wait_for(lambda: stuck in h.started)
        waiting = h.service_tx(lambda q: q.send_many("q", [{"data": i} for i in range(5)]))
        wait_for(lambda: w.stats()["q"].buffered == 3)
        assert w.stats()["q"].running == 1
        assert sum(r.state == "active" for r in rows(h, "q").values()) == 4
        h.stop(w, 0.2)
    finally:
        release.set()
    after = rows(h, "q")
    # The three buffered jobs are queued again as if never claimed; none ran.
    assert all(
        after[j].state == "created" and after[j].retry_count == 0 and after[j].started_on is None
        for j in waiting
    )
    assert not set(waiting) & set(h.started)
    assert after[stuck].state == "retry"  # the running one was failed at shutdown
    assert w.stats()["q"].buffered == 0


def test_with_prefetch_zero_a_worker_claims_only_into_free_slots(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(block=release), concurrency=1, prefetch=0)
    h.start(w)
    try:
        jobs = h.service_tx(lambda q: q.send_many("q", [{"data": i} for i in range(3)]))
        wait_for(lambda: len(h.started) == 1)
        assert w._queues["q"].want() == 0
        assert sum(r.state == "active" for r in rows(h, "q").values()) == 1
        assert w.stats()["q"].buffered == 0
        release.set()
        wait_for(lambda: all(state_of(h, "q", j) == "completed" for j in jobs))
    finally:
        release.set()
        h.stop(w)


def test_a_queue_of_a_keyed_policy_is_never_claimed_ahead(harness: Harness) -> None:
    """Giving a keyed job back could meet its key's unique index: no buffer there."""
    h = harness
    h.service_tx(lambda q: q.create_queue("q", policy="stately"))
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(block=lambda job: release if job.data == "hang" else None))
    h.start(w)
    try:
        warm(h, "q")
        send(h, "q", "hang", singleton_key="a")
        wait_for(lambda: len(h.started) == 4)
        for key in "bcd":
            send(h, "q", key, singleton_key=key)
        state = w._queues["q"]
        assert not state.ahead_allowed and state.ahead() == 0
        assert state.want() == 0  # its one slot runs "hang": nothing to claim ahead into
        assert sum(r.state == "active" for r in rows(h, "q").values()) == 1
    finally:
        release.set()
        h.stop(w)


@pytest.mark.parametrize("version", [26, 46])
def test_a_job_given_back_gets_from_its_next_claim_the_retry_count_it_would_have_had(
    engine: Engine, schema: str, schema46: str, version: int
) -> None:
    name = schema if version == 26 else schema46
    ctx = Context(name, version=version)
    options = execution_options(name)

    def service(fn: Any) -> Any:
        with Session(engine) as session, session.begin():
            return fn(QueueService(session, schema=name))

    def claim() -> Job:
        (job,) = service(lambda q: q.fetch("q", 1))
        return job  # type: ignore[no-any-return]

    def back(job: Job) -> list[uuid.UUID]:
        with engine.begin() as conn:
            return driver.run(conn, give_back(ctx, "q", [job]), options)

    service(lambda q: q.create_queue("q", retry_limit=5, retry_delay=0))
    fresh = service(lambda q: q.send("q", {"n": 1}))
    first = claim()
    assert back(first) == [fresh]
    job = service(lambda q: q.get_job("q", fresh))
    assert (job.state.value, job.retry_count, job.started_on) == ("created", 0, None)
    assert claim().retry_count == 0  # as if never claimed

    # A job that ran once and waits for its retry: back as retry, count kept.
    service(lambda q: q.fail("q", fresh, {"boom": 1}))
    again = claim()
    assert again.retry_count == 1
    assert back(again) == [fresh]
    job = service(lambda q: q.get_job("q", fresh))
    assert (job.state.value, job.retry_count) == ("retry", 0)
    assert claim().retry_count == 1

    # Fenced: an attempt that is not the job's current one gives nothing back.
    assert back(again) == []


def test_prefetch_is_checked_with_the_other_options() -> None:
    with pytest.raises(InvalidOptionsError, match="prefetch"):
        HandlerSpec("q", print, prefetch=-1)
    with pytest.raises(InvalidOptionsError, match="prefetch"):
        HandlerSpec("q", print, prefetch=True)
    assert HandlerSpec("q", print, concurrency=4).ahead == 16  # the default: 4 x concurrency
    assert HandlerSpec("q", print, concurrency=4, prefetch=0).fetch_size == 4
    assert HandlerSpec("q", print, concurrency=60, prefetch=60).fetch_size == 100


def test_claiming_ahead_holds_about_a_second_of_work_at_most() -> None:
    state = QueueState(HandlerSpec("q", print, concurrency=2, prefetch=10), None)
    assert state.ahead() == 0  # no handler has run: nothing known
    state.ahead_allowed = True
    state.ran(0.001)
    assert state.ahead() == 10
    state.run_seconds = 0.5  # two slots, half a second each: four jobs a second
    assert state.ahead() == 4
    state.run_seconds = 5.0
    assert state.ahead() == 0
    state.ahead_allowed = False
    state.run_seconds = 0.001
    assert state.ahead() == 0


def test_a_timeout_counts_from_the_start_and_a_lease_from_the_claim() -> None:
    job = Job.__new__(Job)
    object.__setattr__(job, "expire_seconds", 60)
    timed = Attempt(job, HandlerSpec("q", print, timeout=5), lease_start=100.0, deadline=None)
    timed.start(103.0)
    assert timed.deadline == 108.0
    leased = Attempt(
        job, HandlerSpec("q", print, extend_lease=False), lease_start=100.0, deadline=None
    )
    leased.start(103.0)
    assert leased.deadline == 160.0


def test_a_worker_takes_prefetch_as_a_default_for_its_handlers(engine: Engine) -> None:
    w = Worker(engine, prefetch=7, supervise=False, listen=False)
    assert w.register("q", print).prefetch == 7
    assert w.register("r", print, prefetch=0).prefetch == 0
