"""Worker and AsyncWorker: outcomes, retries, transactions, batching, concurrency.

Every test runs twice, with the threaded and with the asyncio worker (see
``support.worker.Harness``).
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.records import Job

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_returning_handler_completes_job_with_its_value_as_output(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q", {"n": 21})
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(lambda job: job.data["n"] * 2))
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "completed")
    h.stop(w)
    assert h.job("q", job_id).output == {"value": 42}
    assert w.stats()["q"].completed == 1


def test_handler_receives_the_job_record_with_its_metadata(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q", {"k": "v"}, priority=3, retry_limit=4)
    seen: list[Job] = []
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(seen.append))
    h.start(w)
    wait_for(lambda: seen)
    h.stop(w)
    [job] = seen
    assert (job.id, job.queue, job.data) == (job_id, "q", {"k": "v"})
    assert (job.priority, job.retry_limit, job.retry_count) == (3, 4, 0)
    assert job.state.value == "active" and job.started_on is not None


def test_raising_handler_fails_job_for_retry_with_error_output(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1, retry_delay=30))
    job_id = send(h, "q")

    def boom(job: Job) -> None:
        raise ValueError("no stock")

    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(boom))
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "retry")
    h.stop(w)
    job = h.job("q", job_id)
    assert job.output["name"] == "ValueError" and job.output["message"] == "no stock"
    assert "Traceback" in job.output["stack"]
    [[delay]] = h.sql(
        "SELECT extract(epoch FROM start_after - now()) FROM {s}.job WHERE id = :id", id=job_id
    )
    assert 20 < delay <= 30  # the queue's retry delay applies
    assert w.stats()["q"].failed == 1


def test_async_handler_leaking_a_cancelled_error_fails_its_job_instead_of_hanging(
    harness_async: Harness,
) -> None:
    # Only coroutines can let a CancelledError of their own escape.
    h = harness_async
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1, retry_delay=30))
    job_id = send(h, "q")

    async def awaits_a_cancelled_future(job: Job) -> None:
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        await future  # raises CancelledError inside the handler, not a cancellation of it

    w = h.worker(poll_interval=0.1)
    w.register("q", awaits_a_cancelled_future)
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "retry")
    h.stop(w)
    assert h.job("q", job_id).output["name"] == "CancelledError"
    assert w.stats()["q"].failed == 1


def test_raising_handler_with_backoff_waits_the_additive_backoff_delay(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=3, retry_delay=2, retry_backoff=True))
    job_id = send(h, "q")

    def boom(job: Job) -> None:
        raise ValueError("later")

    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(boom))
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "retry")
    h.stop(w)
    [[delay]] = h.sql(
        "SELECT extract(epoch FROM start_after - now()) FROM {s}.job WHERE id = :id", id=job_id
    )
    # pg-boss's additive backoff for the first retry: 2 + 2^1/2 * (1 + random()) s
    assert 2.5 < delay <= 4


def test_failing_past_retry_limit_moves_job_to_dead_letter(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("dlq"))
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1, dead_letter="dlq"))
    job_id = send(h, "q", {"order": 7})

    def boom(job: Job) -> None:
        raise RuntimeError(f"attempt {job.retry_count}")

    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(boom))
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "failed")
    h.stop(w)
    assert h.started == [job_id, job_id]  # retry_limit=1: two attempts
    [dead] = h.sql("SELECT data, output FROM {s}.job WHERE name = 'dlq'")
    assert dead.data == {"order": 7} and dead.output["message"] == "attempt 1"


def test_on_error_is_called_with_the_exception_and_the_job(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    job_id = send(h, "q")
    errors: list[tuple[BaseException, Job | None]] = []

    def boom(job: Job) -> None:
        raise KeyError("missing")

    w = h.worker(poll_interval=0.1, on_error=lambda exc, job: errors.append((exc, job)))
    w.register("q", h.handler(boom))
    h.start(w)
    wait_for(lambda: errors)
    h.stop(w)
    [(exc, job)] = errors
    assert isinstance(exc, KeyError) and job is not None and job.id == job_id


def test_unencodable_return_value_fails_the_job_instead_of_losing_it(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    job_id = send(h, "q")
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(lambda job: {"when": object()}))
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "failed")
    h.stop(w)
    assert "JSON" in h.job("q", job_id).output["message"]


def test_transactional_handler_writes_commit_with_the_completion(harness: Harness) -> None:
    h = harness
    h.sql("CREATE TABLE {s}.effects (job_id uuid PRIMARY KEY)")
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    w = h.worker(poll_interval=0.1)
    w.register(
        "q",
        h.handler(sql="INSERT INTO {s}.effects VALUES (:id)", body=lambda job: "done"),
        transactional=True,
    )
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "completed")
    h.stop(w)
    assert h.sql("SELECT job_id FROM {s}.effects") == [(job_id,)]
    assert h.job("q", job_id).output == {"value": "done"}


def test_transactional_handler_that_raises_rolls_back_its_writes_and_fails(
    harness: Harness,
) -> None:
    h = harness
    h.sql("CREATE TABLE {s}.effects (job_id uuid PRIMARY KEY)")
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    job_id = send(h, "q")

    def boom(job: Job) -> None:
        raise RuntimeError("after the write")

    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(boom, sql="INSERT INTO {s}.effects VALUES (:id)"), transactional=True)
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "failed")
    h.stop(w)
    assert h.sql("SELECT job_id FROM {s}.effects") == []
    assert h.job("q", job_id).output["message"] == "after the write"


def test_a_full_batch_is_claimed_with_one_fetch_and_completed_with_one_statement(
    harness: Harness,
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    h.service_tx(lambda q: q.send_many("q", [{"data": i} for i in range(10)]))
    release = threading.Event()
    w = h.worker(poll_interval=30, flush_interval=0.05)
    w.register("q", h.handler(block=release), concurrency=10, batch_size=10)
    with h.statements() as seen:
        h.start(w)
        wait_for(lambda: len(h.started) == 10)
        fetches = [s for s in seen if "SKIP LOCKED" in s]
        assert len(fetches) == 1
        release.set()
        wait_for(lambda: w.stats()["q"].completed == 10)
        completes = [s for s in seen if "'completed'" in s and s.lstrip().startswith("UPDATE")]
        assert len(completes) <= 2  # jobs ending together share a statement
    h.stop(w)


def test_worker_never_runs_more_handlers_than_the_queue_concurrency(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    h.service_tx(lambda q: q.send_many("q", [{"data": i} for i in range(12)]))
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(sleep=0.05), concurrency=3, batch_size=10)
    with h.statements() as seen:
        h.start(w)
        wait_for(lambda: w.stats()["q"].completed == 12)
    h.stop(w)
    assert h.max_active == 3
    # never claims more than the free slots
    assert all("LIMIT" in s for s in seen if "SKIP LOCKED" in s)


def test_full_batches_are_followed_by_an_immediate_fetch(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    h.service_tx(lambda q: q.send_many("q", [{"data": i} for i in range(6)]))
    # No LISTEN and a 30 s poll: only the loop's own re-fetch after a full batch
    # can get past the first two jobs in time.
    w = h.worker(poll_interval=30, listen=False)
    w.register("q", h.handler(), concurrency=2, batch_size=2)
    with h.statements() as seen:
        h.start(w)
        wait_for(lambda: w.stats()["q"].completed == 6, timeout=5)
        h.stop(w)
    claims = [sql for sql in seen if "FOR UPDATE SKIP LOCKED" in sql]
    assert 3 <= len(claims) <= 7  # batches of at most two, then one empty claim at most


def test_registering_a_handler_of_the_wrong_flavour_is_refused(harness: Harness) -> None:
    h = harness
    w = h.worker()

    if h.is_async:

        def wrong(job: Job) -> None: ...

    else:

        async def wrong(job: Job) -> None: ...  # type: ignore[misc]

    with pytest.raises(InvalidOptionsError, match="Worker"):
        w.register("q", wrong)


def test_bad_handler_options_are_refused_before_anything_runs(harness: Harness) -> None:
    w = harness.worker()
    fn = harness.handler()
    with pytest.raises(InvalidOptionsError, match="concurrency"):
        w.register("q", fn, concurrency=0)
    with pytest.raises(InvalidOptionsError, match="poll_interval"):
        w.register("q", fn, poll_interval=-1)
    with pytest.raises(InvalidOptionsError, match="unknown"):
        w.register("q", fn, concurency=2)
    w.register("q", fn)
    with pytest.raises(InvalidOptionsError, match="already has a handler"):
        w.register("q", fn)


def test_handlers_can_be_given_as_a_mapping_and_narrowed_by_configure(harness: Harness) -> None:
    h = harness
    w = h.worker(handlers={"a": h.handler(), "b": h.handler()}, concurrency=2)
    w.configure(queues=["b"], concurrency=5)
    assert list(w.specs) == ["b"] and w.specs["b"].concurrency == 5
    with pytest.raises(InvalidOptionsError, match="no handler registered for 'c'"):
        w.configure(queues=["c"])


def test_worker_built_from_a_sessionmaker_gives_its_sessions_to_handlers(
    harness: Harness,
) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker
    from sqlalchemy.orm import sessionmaker

    from alkstore_sa import AsyncWorker, Worker

    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    seen: list[Any] = []
    if h.is_async:
        assert h.async_engine is not None
        w: Any = AsyncWorker(
            async_sessionmaker(h.async_engine, info={"app": "shop"}),
            schema=h.schema,
            supervise=False,
            poll_interval=0.1,
        )

        async def handler(job: Job, session: Any) -> None:
            seen.append(session.info.get("app"))

    else:
        w = Worker(
            sessionmaker(h.engine, info={"app": "shop"}),
            schema=h.schema,
            supervise=False,
            poll_interval=0.1,
        )

        def handler(job: Job, session: Any) -> None:  # type: ignore[misc]
            seen.append(session.info.get("app"))

    h.workers.append(w)
    w.register("q", handler, transactional=True)
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "completed")
    h.stop(w)
    assert seen == ["shop"]


def test_worker_refuses_something_that_is_not_an_engine(harness: Harness) -> None:
    from alkstore_sa import AsyncWorker, Worker

    cls: Any = AsyncWorker if harness.is_async else Worker
    with pytest.raises(InvalidOptionsError, match="bind"):
        cls("postgresql://nowhere/db")


def test_errors_of_the_fetch_loop_reach_on_error_and_the_loop_carries_on(
    harness: Harness,
) -> None:
    from alkstore_sa.errors import QueueNotFoundError

    h = harness
    errors: list[tuple[BaseException, Job | None]] = []
    w = h.worker(poll_interval=0.1, on_error=lambda exc, job: errors.append((exc, job)))
    w.register("missing", h.handler())
    h.start(w)
    wait_for(lambda: errors)
    h.service_tx(lambda q: q.create_queue("missing"))
    job_id = send(h, "missing")
    wait_for(lambda: state_of(h, "missing", job_id) == "completed", timeout=10)
    h.stop(w)
    exc, job = errors[0]
    assert isinstance(exc, QueueNotFoundError) and job is None
