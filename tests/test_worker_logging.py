"""What the workers log: one INFO line at start, each failed attempt at WARNING with
what happens next, the last one with its traceback, completions at DEBUG, what a
signal does, a missing queue with how to create it, and fields in ``extra`` for JSON
formatters (the "Logging" page). Every test runs with both runtimes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa.records import Job
from alkstore_sa.worker import _fetching
from alkstore_sa.worker._fetching import create_call, create_command

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def records(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    with caplog.at_level(logging.DEBUG, logger="alkstore_sa"):
        yield caplog


def of(caplog: pytest.LogCaptureFixture, action: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == action]


def boom(job: Job) -> None:
    raise ValueError("no stock\nsecond line")


def run_until(
    h: Harness, queue: str, state: str, handler: Any, **register: Any
) -> tuple[uuid.UUID, Any]:
    """Send one job to ``queue``, work it with ``handler`` until it is in ``state``,
    stop; the job's id and the (stopped) worker."""
    job_id = send(h, queue)
    w = h.worker(poll_interval=0.1)
    w.register(queue, handler, **register)
    h.start(w)
    wait_for(lambda: state_of(h, queue, job_id) == state)
    h.stop(w)
    return job_id, w


def test_a_failed_attempt_with_retries_left_is_a_warning_saying_when_it_runs_again(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("payments", retry_limit=2, retry_delay=30))
    job_id, w = run_until(h, "payments", "retry", h.handler(boom))
    [record] = of(records, "job_failed")
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"job {job_id} of 'payments' failed (attempt 1 of 3): ValueError: no stock; retry in 30 s"
    )
    assert record.exc_info is None
    fields = {k: getattr(record, k) for k in ("queue", "job_id", "attempt", "retry_limit")}
    assert fields == {"queue": "payments", "job_id": str(job_id), "attempt": 1, "retry_limit": 2}
    assert (record.next, record.retry_delay, record.state) == ("retry", 30.0, "retry")  # type: ignore[attr-defined]
    assert (record.error_type, record.error) == ("ValueError", "no stock")  # type: ignore[attr-defined]
    assert record.duration_ms >= 0 and record.worker == w.name  # type: ignore[attr-defined]


def test_with_backoff_the_warning_gives_the_delay_the_backoff_starts_from(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=3, retry_delay=4, retry_backoff=True))
    run_until(h, "q", "retry", h.handler(boom))
    [record] = of(records, "job_failed")
    assert record.getMessage().endswith(
        "(attempt 1 of 4): ValueError: no stock; retry with backoff from 4 s"
    )
    assert (record.next, record.retry_delay) == ("retry", None)  # type: ignore[attr-defined]


def test_the_last_failed_attempt_says_failed_for_good_with_the_traceback(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    run_until(h, "q", "failed", h.handler(boom))
    [record] = of(records, "job_failed")
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith("(attempt 1 of 1): ValueError: no stock; failed for good")
    assert record.next == "failed" and record.exc_info is not None  # type: ignore[attr-defined]
    assert record.exc_info[0] is ValueError and "in boom" in records.text


def test_a_job_failed_for_good_names_the_dead_letter_queue_it_was_copied_to(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("payments-dlq"))
    h.service_tx(lambda q: q.create_queue("payments", retry_limit=1, dead_letter="payments-dlq"))
    run_until(h, "payments", "failed", h.handler(boom))
    first, last = of(records, "job_failed")
    assert first.getMessage().endswith("(attempt 1 of 2): ValueError: no stock; retry in 0 s")
    assert first.exc_info is None
    assert last.getMessage().endswith(
        "(attempt 2 of 2): ValueError: no stock; failed for good, copied to 'payments-dlq'"
    )
    assert (last.next, last.dead_letter) == ("dead_letter", "payments-dlq")  # type: ignore[attr-defined]
    assert last.exc_info is not None


def test_a_handler_past_its_timeout_is_a_warning_naming_the_timeout(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1, retry_delay=60))
    job_id = send(h, "q")
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(block=release), timeout=1)
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "retry")
    release.set()
    h.stop(w)
    [record] = of(records, "job_failed")
    assert record.levelno == logging.WARNING
    assert record.getMessage().endswith(
        "(attempt 1 of 2): JobTimeout: handler ran longer than its 1 s timeout; retry in 1 min"
    )
    assert (record.reason, record.error_type) == ("timeout", "JobTimeout")  # type: ignore[attr-defined]
    assert record.duration_ms >= 900  # type: ignore[attr-defined]
    assert all(r.levelno <= logging.DEBUG for r in of(records, "job_timeout"))


def test_a_completed_job_is_a_debug_record_with_its_duration(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id, _w = run_until(h, "q", "completed", h.handler(sleep=0.05))
    [record] = of(records, "job_completed")
    assert record.levelno == logging.DEBUG
    assert record.getMessage().startswith(f"job {job_id} of 'q' completed (attempt 1 of 3) in ")
    assert (record.queue, record.job_id, record.attempt) == ("q", str(job_id), 1)  # type: ignore[attr-defined]
    assert record.duration_ms >= 40  # type: ignore[attr-defined]


def test_a_transactional_completion_is_a_debug_record_with_its_duration(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    run_until(h, "q", "completed", h.handler(), transactional=True)
    [record] = of(records, "job_completed")
    assert record.levelno == logging.DEBUG and record.duration_ms >= 0  # type: ignore[attr-defined]


def test_start_says_one_info_line_and_a_clean_stop_nothing_above_debug(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    start_work_and_stop(harness, records, version=26)


def test_start_says_one_info_line_and_a_clean_stop_at_46_nothing_above_debug(
    harness46: Harness, records: pytest.LogCaptureFixture
) -> None:
    # At 46 the worker also listens on Node pg-boss's channel and supervises more turns.
    start_work_and_stop(harness46, records, version=46)


def start_work_and_stop(h: Harness, records: pytest.LogCaptureFixture, *, version: int) -> None:
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    w = h.worker(poll_interval=0.1, supervise=True)
    w.register("q", h.handler())
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "completed")
    h.stop(w)
    loud = [r for r in records.records if r.levelno > logging.DEBUG]
    assert [(r.name, r.levelname, r.action) for r in loud] == [  # type: ignore[attr-defined]
        ("alkstore_sa.worker", "INFO", "worker_started")
    ]
    [started] = loud
    assert started.getMessage().startswith(
        f"worker {w.name} started on schema {h.schema!r} (version {version}): "
        "q (concurrency 1, prefetch 4, batch 5); listener on (LISTEN "
    )
    assert started.schema_version == version  # type: ignore[attr-defined]
    assert of(records, "worker_stopped")


def test_the_start_line_names_each_queue_and_says_when_the_listener_is_off(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    w = h.worker(poll_interval=2, listen=False, concurrency=3, prefetch=0)
    w.register("a", h.handler())
    w.register("b", h.handler(), concurrency=8, prefetch=2, batch_size=4)
    h.start(w)
    h.stop(w)
    [started] = of(records, "worker_started")
    assert started.levelno == logging.INFO
    assert started.getMessage() == (
        f"worker {w.name} started on schema {h.schema!r} (version 26): "
        "a (concurrency 3, prefetch 0, batch 3), b (concurrency 8, prefetch 2, batch 4); "
        "listener off (listen=False): polling every 2 s; supervisor off"
    )
    fields = {
        k: getattr(started, k)
        for k in ("queues", "concurrency", "prefetch", "batch_size", "listening", "supervise")
    }
    assert fields == {
        "queues": ["a", "b"],
        "concurrency": {"a": 3, "b": 8},
        "prefetch": {"a": 0, "b": 2},
        "batch_size": {"a": 3, "b": 4},
        "listening": None,
        "supervise": False,
    }


def test_signals_say_how_long_the_worker_waits_and_that_a_second_stops_at_once(
    harness: Harness, records: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1, retry_delay=60))
    job_id = send(h, "q")
    w = h.worker(poll_interval=0.1, shutdown_timeout=30)
    w.register("q", h.handler(block=threading.Event()))  # never released
    h.start(w)
    wait_for(lambda: h.started)

    def deliver(signum: int) -> None:  # as the runtime delivers it: on the loop, if any
        if h.loop is None:
            w._signal(signum)
        else:
            h.loop.call_soon_threadsafe(w._signal, signum)

    deliver(signal.SIGTERM)
    [first] = wait_for(lambda: of(records, "worker_signal"))
    assert first.levelno == logging.INFO
    assert first.getMessage() == (
        f"worker {w.name}: SIGTERM received: stopping; waiting up to 30 s (shutdown_timeout) "
        "for 1 running job(s), then failing those still running as WorkerShutdown; a second "
        "SIGINT or SIGTERM stops at once"
    )
    took: list[float] = []
    stopping = threading.Thread(target=lambda: took.append(h.stop(w)))
    stopping.start()
    time.sleep(0.3)
    deliver(signal.SIGINT)
    stopping.join(20)
    [second] = of(records, "worker_force_stop")
    assert second.levelno == logging.WARNING
    assert second.getMessage() == (
        f"worker {w.name}: second signal (SIGINT): stopping now; 1 running job(s) are failed "
        "as WorkerShutdown (retried if they have retries left)"
    )
    # At once: not the 30 s the first signal offered the handler.
    assert took and took[0] < 10
    assert state_of(h, "q", job_id) == "retry"
    assert h.job("q", job_id).output["name"] == "WorkerShutdown"


def test_a_missing_queue_is_said_once_with_how_to_create_it_then_at_a_low_rate(
    harness: Harness, records: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = harness
    errors: list[BaseException] = []
    w = h.worker(poll_interval=0.1, on_error=lambda exc, job: errors.append(exc))
    w.register("orders", h.handler())
    h.start(w)
    [said] = wait_for(lambda: [r for r in of(records, "queue_missing") if r.levelno > 10])
    time.sleep(1.0)  # several more claims fail meanwhile (backoff from 0.1 s)
    warnings = [r for r in of(records, "queue_missing") if r.levelno == logging.WARNING]
    assert warnings == [said]
    assert len(of(records, "queue_missing")) >= 3  # the looks between said at DEBUG
    assert said.getMessage() == (
        f"worker {w.name}: queue 'orders' does not exist in schema {h.schema!r}, so its "
        f"handler gets no jobs; create it with `alkstore queue create orders --schema "
        f"{h.schema}` or QueueService(session, schema={h.schema!r}).create_queue('orders'); "
        "the worker looks again every few seconds and repeats this every 5 min while it is "
        "missing"
    )
    assert not of(records, "fetch_error")  # not the bare error, again and again
    assert len(errors) == 1 and type(errors[0]).__name__ == "QueueNotFoundError"

    # Past the repeat interval it is said again, with how long it has been missing.
    monkeypatch.setattr(_fetching, "MISSING_QUEUE_REPEAT_SECONDS", 0.5)
    wait_for(lambda: len([r for r in of(records, "queue_missing") if r.levelno > 10]) == 2)
    again = [r for r in of(records, "queue_missing") if r.levelno > 10][-1]
    assert "does not exist in schema" in again.getMessage() and " (for " in again.getMessage()

    h.service_tx(lambda q: q.create_queue("orders"))
    job_id = send(h, "orders")
    wait_for(lambda: state_of(h, "orders", job_id) == "completed")
    h.stop(w)
    [found] = of(records, "queue_found")
    assert found.levelno == logging.INFO
    assert found.getMessage().startswith(f"worker {w.name}: queue 'orders' exists now (missing")


def test_the_create_hint_quotes_for_the_shell_and_leaves_out_the_default_schema() -> None:
    assert create_command("orders", "pgboss") == "alkstore queue create orders"
    assert create_command("big orders", "app") == "alkstore queue create 'big orders' --schema app"
    assert create_call("orders", "pgboss") == "QueueService(session).create_queue('orders')"


CONSTRUCT = """
import sys
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session
from alkstore_sa import AsyncQueueService, AsyncWorker, QueueService, Worker

url = sys.argv[1]
engine = sa.create_engine(url)
with Session(engine) as session:
    QueueService(session)
Worker(engine).register("q", lambda job: None)


async def handler(job):
    pass


AsyncWorker(create_async_engine(url)).register("q", handler)
print(sorted(m for m in sys.modules if m == "alembic" or m.startswith("alembic.")))
"""


def test_importing_the_package_and_building_workers_and_services_does_not_import_alembic(
    database_url: str,
) -> None:
    # A fresh interpreter: in this one the migration tests have imported Alembic long ago.
    # Alembic logs at INFO as it loads its plugins, into the host app's log.
    done = subprocess.run(
        [sys.executable, "-c", CONSTRUCT, database_url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
