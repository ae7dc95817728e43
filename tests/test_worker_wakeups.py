"""Wake-ups (NOTIFY and polling), listener loss, database outages, supervision."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from support.worker import Harness, claims, send, settled_claims, state_of, wait_for

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def insert_like_node(h: Harness, queue: str) -> uuid.UUID:
    """A job inserted without NOTIFY, as Node pg-boss (or plain SQL) does."""
    [(job_id,)] = h.sql("INSERT INTO {s}.job (name, data) VALUES (:q, '{}') RETURNING id", q=queue)
    assert isinstance(job_id, uuid.UUID)
    return job_id


def test_committed_job_wakes_a_worker_that_polls_once_a_minute(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.worker(poll_interval=60)
    w.register("q", h.handler())
    h.start(w)
    settled_claims(w, "q")  # the first (empty) claim is behind us; the next in a minute
    job_id = send(h, "q")
    # Within 5 s, with polls 60 s apart: the send's notification woke it.
    wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=5)
    h.stop(w)


def test_notification_for_another_queue_does_not_wake_this_one(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    h.service_tx(lambda q: q.create_queue("other"))
    w = h.worker(poll_interval=60)
    w.register("q", h.handler())
    h.start(w)
    looked = settled_claims(w, "q")
    quiet = insert_like_node(h, "q")
    send(h, "other")
    time.sleep(0.3)  # time to claim, were the other queue's notification to wake it
    assert (claims(w, "q"), state_of(h, "q", quiet)) == (looked, "created")
    send(h, "q")  # its own queue's, on the same connection after the other: read in order
    wait_for(lambda: state_of(h, "q", quiet) == "completed", timeout=5)
    h.stop(w)


def test_job_inserted_without_notify_is_picked_up_by_polling(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.worker(poll_interval=0.3)
    w.register("q", h.handler())
    h.start(w)
    settled_claims(w, "q", quiet=0.05)  # polls come 0.3 s apart: a short quiet spell
    job_id = insert_like_node(h, "q")
    wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=3)
    h.stop(w)


def test_without_listen_jobs_are_still_processed_by_polling(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.worker(poll_interval=0.2, listen=False)
    w.register("q", h.handler())
    h.start(w)
    job_id = send(h, "q")
    wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=3)
    h.stop(w)
    assert w.listener is None


def test_notifications_resume_after_the_listening_connection_is_killed(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.worker(poll_interval=60)
    w.register("q", h.handler())
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.worker.listener"):
        h.start(w)
        listener = w.listener
        assert listener is not None and listener.backend_pid is not None
        before = listener.connects
        h.sql("SELECT pg_terminate_backend(:pid)", pid=listener.backend_pid)
        wait_for(lambda: listener.connects > before, timeout=5)
        assert listener.wait_listening(w.channel, 5)
        job_id = send(h, "q")
        wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=3)
        h.stop(w)
    assert any(getattr(r, "action", None) == "listener_lost" for r in caplog.records)


def test_jobs_are_processed_while_the_listener_is_down(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.worker(poll_interval=0.2)
    w.register("q", h.handler())
    h.start(w)
    listener = w.listener
    assert listener is not None
    h.sql("SELECT pg_terminate_backend(:pid)", pid=listener.backend_pid)
    job_ids = [send(h, "q", i) for i in range(3)]
    wait_for(lambda: all(state_of(h, "q", j) == "completed" for j in job_ids), timeout=5)
    h.stop(w)


def test_worker_survives_the_database_dropping_all_its_connections(
    harness: Harness, database_url: str
) -> None:
    """A PostgreSQL restart, as the worker sees it: every connection dies at once."""
    h = harness
    tag = f"alkstore-test-{uuid.uuid4().hex[:8]}"
    args = {"connect_args": {"application_name": tag}}
    if h.is_async:
        engine: Any = create_async_engine(database_url, **args)
    else:
        engine = create_engine(database_url, **args)
    h.service_tx(lambda q: q.create_queue("q"))
    # A worker of its own engine, so only its connections are killed.
    if h.is_async:
        from alkstore_sa import AsyncWorker

        w: Any = AsyncWorker(engine, schema=h.schema, supervise=False, poll_interval=0.2)
    else:
        from alkstore_sa import Worker

        w = Worker(engine, schema=h.schema, supervise=False, poll_interval=0.2)
    h.workers.append(w)
    w.register("q", h.handler(sleep=0.02), concurrency=4, batch_size=4)
    h.start(w)
    first = [send(h, "q", i) for i in range(10)]
    wait_for(lambda: len(h.started) >= 3)
    killed = h.sql(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE application_name = :tag OR pid = :listener",
        tag=tag,
        listener=w.listener.backend_pid if w.listener else -1,
    )
    assert killed
    second = [send(h, "q", i) for i in range(10, 20)]
    wait_for(lambda: all(state_of(h, "q", j) == "completed" for j in first + second), timeout=20)
    h.stop(w)
    runs = Counter(h.started)
    assert set(runs) == set(first + second)
    assert max(runs.values()) == 1  # nothing ran twice
    if h.is_async:
        h.call(engine.dispose())
    else:
        engine.dispose()


def test_supervising_worker_expires_a_dead_workers_job_and_runs_it_again(
    harness: Harness,
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", expire_seconds=1))
    job_id = send(h, "q")
    [dead] = h.service_tx(lambda q: q.fetch("q"))  # a worker that then died
    assert dead.id == job_id
    done = threading.Event()
    w = h.worker(
        poll_interval=0.2,
        supervise=True,
        supervisor_options={"supervise_interval": 0.2, "monitor_interval": 0.2, "schedule": False},
    )
    w.register("q", h.handler(body=lambda job: done.set()))
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=10)
    h.stop(w)
    job = h.job("q", job_id)
    assert job.retry_count == 1  # the second attempt completed it
