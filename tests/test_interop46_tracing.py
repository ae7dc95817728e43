"""Interop at schema 46, trace context: a trace crosses the queue between Node pg-boss
12.38.0 and alkstore_sa, both ways (docs/how-to/tracing.md).

Node runs ``tests/interop46/trace.mjs`` with ``openTelemetry.propagateContext`` and a
stand-in for the SDK (it keeps the spans pg-boss starts); Python runs the OpenTelemetry
SDK with an in-memory exporter.

- Node sends in a trace: the job stores Node's producer span as ``{"traceparent": ...}``,
  and a Python worker's ``process`` span is that span's child, in the same trace.
- Python sends in a span: a Node worker's ``process`` span is the child of our producer
  span, with pg-boss's consumer attributes.
"""

from __future__ import annotations

import json
import threading
import uuid

import pytest
from opentelemetry import trace
from sqlalchemy import Engine
from support.interop46 import job_row, schema46_by
from support.node import in_tx, node46_modules, node_url, run_node46
from support.otel import in_memory_tracing

from alkstore_sa import Worker

__all__ = ["node46_modules", "node_url", "schema46_by"]

pytestmark = pytest.mark.interop


def test_a_python_worker_continues_the_trace_of_a_node_send(
    engine: Engine, schema46_by: str, node_url: str
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    trace_id = uuid.uuid4().hex
    sent = json.loads(run_node46("trace.mjs", "send", node_url, schema, "q", trace_id))
    row = job_row(engine, schema, sent["id"], "trace_context")
    assert row["trace_context"] == {"traceparent": f"00-{trace_id}-{sent['spanId']}-01"}
    done = threading.Event()
    with in_memory_tracing() as exporter:
        worker = Worker(engine, schema=schema, poll_interval=0.05, supervise=False)
        worker.register("q", lambda job: done.set())
        worker.start()
        try:
            assert done.wait(30)
        finally:
            worker.stop()
        (span,) = [s for s in exporter.get_finished_spans() if s.name == "process q"]
    assert f"{span.context.trace_id:032x}" == trace_id
    assert span.parent is not None
    assert f"{span.parent.span_id:016x}" == sent["spanId"]
    assert (span.attributes or {})["messaging.message.id"] == sent["id"]


def test_a_node_worker_continues_the_trace_of_a_python_send(
    engine: Engine, schema46_by: str, node_url: str
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    with in_memory_tracing() as exporter:
        with trace.get_tracer("test").start_as_current_span("request"):
            job_id = in_tx(engine, schema, lambda q: q.send("q", {"from": "python"}))
        (producer,) = [s for s in exporter.get_finished_spans() if s.name == "send q"]
    worked = json.loads(run_node46("trace.mjs", "work", node_url, schema, "q"))
    assert worked["id"] == str(job_id)
    assert worked["name"] == "process q"
    assert worked["parent"] == {
        "traceId": f"{producer.context.trace_id:032x}",
        "spanId": f"{producer.context.span_id:016x}",
    }
    assert worked["attributes"] == {
        "messaging.system": "pg-boss",
        "messaging.operation.name": "process",
        "messaging.operation.type": "process",
        "messaging.destination.name": "q",
        "messaging.message.id": str(job_id),
        "pgboss.job.retry_count": 0,
        "pgboss.schema": schema,
        "db.namespace": worked["attributes"]["db.namespace"],
    }
    assert job_row(engine, schema, job_id, "state")["state"] == "completed"
