"""Trace context across the queue (alkstore_sa/tracing.py, docs/how-to/tracing.md).

With the OpenTelemetry SDK (an in-memory exporter, tests/support/otel.py):

- a send, send_many, upsert and flow in a span run PRODUCER spans (pg-boss's names and
  attributes) under it, and each job stores its producer span as a W3C carrier;
- no valid span (no SDK, no current span): nothing stored;
- a worker, threaded and asyncio, runs the handler in a CONSUMER span that continues the
  stored trace and is current inside the handler; a stored context that is not one
  (wrong shapes, a bad traceparent, JSON nested too deep to read) is a root span and
  the job completes;
- below schema 46 the send works and stores nothing;
- without OpenTelemetry, sending and working a job never imports it (a subprocess).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from support.otel import in_memory_tracing
from support.worker import Harness, send, wait_for

from alkstore_sa.records import Job

ROOT = Path(__file__).resolve().parent.parent


def traceparent(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"


def stored(env: Any, job_id: uuid.UUID) -> Any:
    rows = env.sql("SELECT trace_context FROM {s}.job WHERE id = :id", id=job_id)
    return rows[0][0]


def only(spans: Any, name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    span: ReadableSpan = found[0]
    return span


def test_jobs_store_the_context_of_their_producer_span(env46: Any) -> None:
    env46.tx(lambda q: [q.create_queue(n) for n in ("q", "r", "p1", "p2")])
    with in_memory_tracing() as exporter:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("request") as request:

            def sends(q: Any) -> Any:
                one = q.send("q", {"n": 1})
                many = q.send_many("q", [{"data": 2}, {"data": 3}])
                upserted = q.upsert("q", {"n": 4}, singleton_key="k")
                flow = q.flow(
                    [{"ref": "a", "name": "q"}, {"ref": "b", "name": "r", "depends_on": ["a"]}]
                )
                return one, many, upserted.jobs[0], flow

            one, many, upserted, flow = env46.tx(sends)
            env46.tx(lambda q: [q.subscribe("ev", n) for n in ("p1", "p2")])
            published = env46.tx(lambda q: q.publish("ev", {"n": 6}))
        spans = exporter.get_finished_spans()
    trace_id = request.get_span_context().trace_id
    send_span = only(spans, "send q")
    assert send_span.kind == SpanKind.PRODUCER
    assert send_span.parent is not None
    assert send_span.parent.span_id == request.get_span_context().span_id
    assert dict(send_span.attributes or {}) == {
        "messaging.system": "pg-boss",
        "messaging.operation.name": "send",
        "messaging.operation.type": "send",
        "messaging.destination.name": "q",
        "messaging.message.id": str(one),
        "pgboss.schema": env46.schema,
    }
    assert stored(env46, one) == {"traceparent": traceparent(send_span)}
    insert_span = only(spans, "insert q")
    assert (insert_span.attributes or {})["messaging.batch.message_count"] == 2
    for job_id in many:
        assert stored(env46, job_id) == {"traceparent": traceparent(insert_span)}
    assert stored(env46, upserted) == {"traceparent": traceparent(only(spans, "upsert q"))}
    flow_span = only(spans, "flow")  # two queues: no destination in the name
    for job_id in flow.values():
        assert stored(env46, job_id) == {"traceparent": traceparent(flow_span)}
    # A publish is a span of its own, the parent of its sends.
    publish = only(spans, "publish ev")
    assert publish.parent is not None
    assert publish.parent.span_id == request.get_span_context().span_id
    for job_id in published:
        [sent] = [
            s for s in spans if (s.attributes or {}).get("messaging.message.id") == str(job_id)
        ]
        assert sent.parent is not None and sent.parent.span_id == publish.context.span_id
        assert stored(env46, job_id) == {"traceparent": traceparent(sent)}
    assert {s.context.trace_id for s in spans} == {trace_id}

    # An upsert that edits the job keeps the trace of the send that made it.
    with in_memory_tracing(), tracer.start_as_current_span("later"):
        env46.tx(lambda q: q.upsert("q", {"n": 5}, singleton_key="k"))
    assert stored(env46, upserted) == {"traceparent": traceparent(only(spans, "upsert q"))}


def test_no_valid_span_stores_nothing_and_an_sdk_makes_the_send_a_root(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    # The API alone (no SDK) and no current span: no span context to store, as in Node.
    plain = env46.tx(lambda q: q.send("q"))
    assert stored(env46, plain) is None
    # With an SDK, a send outside any span is the root of its own trace, as in Node.
    with in_memory_tracing() as exporter:
        rooted = env46.tx(lambda q: q.send("q"))
        (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert stored(env46, rooted) == {"traceparent": traceparent(span)}


def test_below_46_a_send_in_a_span_stores_nothing_and_works(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    with in_memory_tracing() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            job_id = env.tx(lambda q: q.send("q", {"n": 1}))
        assert {s.name for s in exporter.get_finished_spans()} == {"request", "send q"}
    job = env.tx(lambda q: q.get_job("q", job_id))
    assert job.trace_context is None


def test_a_worker_continues_the_trace_in_a_consumer_span(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: [q.create_queue(n) for n in ("q", "t")])
    seen: dict[str, Any] = {}
    done = threading.Event()
    with in_memory_tracing() as exporter:
        tracer = trace.get_tracer("test")
        with tracer.start_as_current_span("request"):
            job_id = send(h, "q", {"n": 1})
            failing = send(h, "q", {"fail": True}, retry_limit=0)
            in_tx = send(h, "t")
        producers = {
            (s.attributes or {}).get("messaging.message.id"): s
            for s in exporter.get_finished_spans()
        }

        def body(job: Job) -> None:
            with tracer.start_as_current_span("inside handler"):
                seen[str(job.id)] = job.trace_context
            if job.data.get("fail"):
                raise ValueError("no")
            done.set()

        w = h.worker(poll_interval=0.05)
        w.register("q", h.handler(body), batch_size=1)
        w.register("t", h.handler(sql="SELECT 1"), transactional=True)
        h.start(w)
        wait_for(lambda: done.is_set() and h.job("q", failing).state.value == "failed")
        wait_for(lambda: h.job("t", in_tx).state.value == "completed")
        h.stop(w)
        spans = exporter.get_finished_spans()
    processes = {
        (s.attributes or {}).get("messaging.message.id"): s for s in spans if s.name == "process q"
    }
    span = processes[str(job_id)]
    send_span = producers[str(job_id)]
    assert send_span.name == "send q"
    assert span.kind == SpanKind.CONSUMER
    assert span.context.trace_id == send_span.context.trace_id
    assert span.parent is not None and span.parent.span_id == send_span.context.span_id
    assert dict(span.attributes or {}) == {
        "messaging.system": "pg-boss",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "q",
        "messaging.message.id": str(job_id),
        "pgboss.job.retry_count": 0,
        "pgboss.schema": h.schema,
    }
    # Current inside the handler, sync or async: the handler's span is its child.
    inner = [s for s in spans if s.name == "inside handler"]
    assert {s.parent.span_id for s in inner if s.parent} == {
        p.context.span_id for p in processes.values()
    }
    assert seen[str(job_id)] == {"traceparent": traceparent(send_span)}
    # The transactional path too.
    (t_span,) = [s for s in spans if s.name == "process t"]
    assert t_span.parent is not None
    assert t_span.parent.span_id == producers[str(in_tx)].context.span_id
    failed = processes[str(failing)]
    assert failed.status.status_code == StatusCode.ERROR
    assert (failed.attributes or {})["error.type"] == "ValueError"


@pytest.mark.parametrize(
    "garbage",
    [
        {"traceparent": "not a traceparent"},
        {"traceparent": "00-00000000000000000000000000000000-0000000000000000-01"},
        {"traceparent": 17, "tracestate": ["x"]},
        [1, 2, 3],
        "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        json.loads("[" * 300 + "]" * 300),  # deeper than Python reads JSON
    ],
    ids=["text", "zero-ids", "wrong-types", "array", "string", "too-deep"],
)
def test_a_stored_context_that_is_not_one_is_a_root_span(harness46: Harness, garbage: Any) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    h.sql("UPDATE {s}.job SET trace_context = CAST(:t AS jsonb)", t=json.dumps(garbage))
    with in_memory_tracing() as exporter:
        w = h.worker(poll_interval=0.05)
        w.register("q", h.handler())
        h.start(w)
        wait_for(lambda: h.job("q", job_id).state.value == "completed")
        h.stop(w)
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "process q"]
    assert span.parent is None


BLOCKED = """
import sys, threading

class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("opentelemetry is not installed here")
        return None

sys.meta_path.insert(0, Blocker())

from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from alkstore_sa import QueueService, Worker

url, schema = sys.argv[1], sys.argv[2]
engine = create_engine(url)
with Session(engine) as session, session.begin():
    q = QueueService(session, schema=schema)
    q.create_queue("q")
    job_id = q.send("q", {"n": 1})
done = threading.Event()
worker = Worker(engine, schema=schema, poll_interval=0.05, supervise=False)
worker.register("q", lambda job: done.set())
worker.start()
assert done.wait(30)
worker.stop()
with engine.connect() as conn:
    row = conn.execute(
        text(f'SELECT trace_context, state FROM "{schema}".job WHERE id = :id'), {"id": job_id}
    ).one()
print(row.trace_context, row.state, "opentelemetry" in sys.modules)
"""


@pytest.mark.subprocess
def test_without_opentelemetry_it_is_never_imported(database_url: str, schema46: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED, database_url, schema46],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["None", "completed", "False"]


def test_without_a_tracer_provider_a_job_without_a_stored_context_runs_bare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing to record and no context to carry: the handler runs without a span
    (what an unconfigured OpenTelemetry costs per job is nothing)."""
    from alkstore_sa import tracing

    api = tracing._otel()
    monkeypatch.setattr(api.trace, "get_tracer_provider", lambda: trace.ProxyTracerProvider())
    monkeypatch.setattr(tracing, "_provider_seen", (-1.0, False))  # look again now

    def handler(job: Any) -> None:
        return None

    assert tracing.processing(handler, "q", uuid.uuid4(), 0, None, "s") is handler
    carrier = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    assert tracing.processing(handler, "q", uuid.uuid4(), 0, carrier, "s") is not handler
