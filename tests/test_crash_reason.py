"""An expired attempt says which it was: the worker stopped answering (its heartbeat
stopped: killed, frozen) or the handler ran past its timeout, in the attempt history,
on the job page and in the log."""

from __future__ import annotations

import logging
import re

import pytest
from starlette.testclient import TestClient
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa.dashboard import create_app

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

LOCAL = "http://127.0.0.1"


def reasons(h: Harness, job_id: object) -> list[tuple[str, str]]:
    app = create_app(h.engine, schemas=[h.schema])
    client = TestClient(app, base_url=LOCAL, headers={"origin": LOCAL})
    page = client.get(f"/s/{h.schema}/jobs/{job_id}?queue=q").text
    return re.findall(
        r'data-cause="(\w+)">.*?(?:<span class="attempt-reason">([^<]*)</span>)', page, re.S
    )


def test_a_job_whose_worker_stopped_answering_says_so(
    harness46: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1, retry_delay=60))
    job_id = send(h, "q")
    h.service_tx(lambda q: q.fetch("q"))  # claimed by a worker that then died
    h.sql(
        "UPDATE {s}.job SET heartbeat_seconds = 10, heartbeat_on = now() - interval '11 s'"
        " WHERE id = :i",
        i=job_id,
    )
    w = h.worker(poll_interval=0.1, liveness_seconds=10)
    w.register("q", h.handler())
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.worker"):
        h.start(w)
        wait_for(lambda: state_of(h, "q", job_id) == "retry")
    [attempt] = h.service_tx(lambda q: q.get_job_attempts("q", job_id))
    assert attempt.cause == "heartbeat"
    assert reasons(h, job_id) == [("heartbeat", "the worker stopped answering (no heartbeat)")]
    assert any("stopped answering" in r.getMessage() for r in caplog.records)


def test_a_job_whose_handler_ran_past_its_timeout_says_so(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1, retry_delay=60))
    job_id = send(h, "q")
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(sleep=2), timeout=0.3)
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.worker"):
        h.start(w)
        wait_for(lambda: state_of(h, "q", job_id) == "retry")
    [attempt] = h.service_tx(lambda q: q.get_job_attempts("q", job_id))
    assert attempt.error_type == "JobTimeout"
    assert reasons(h, job_id) == [("failed", "the handler ran past its timeout")]
    assert any("timeout" in r.getMessage() for r in caplog.records)
