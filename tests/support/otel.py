"""OpenTelemetry for the tracing tests: an SDK tracer provider with an in-memory exporter,
installed as the global provider for one test and taken away after it.

The API lets a process set its global provider once; the tests put back the unset
state themselves (private attributes of ``opentelemetry.trace``) so that no other
test runs with an SDK it did not ask for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from alkstore_sa import tracing


@contextlib.contextmanager
def in_memory_tracing() -> Iterator[InMemorySpanExporter]:
    """A global SDK tracer provider whose finished spans the yielded exporter keeps."""
    provider = TracerProvider()
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = trace._TRACER_PROVIDER
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace.set_tracer_provider(provider)
    # The library looks at the provider about once a second: make it look now.
    tracing._provider_seen = (-1.0, False)
    try:
        yield exporter
    finally:
        trace._TRACER_PROVIDER_SET_ONCE = Once()
        trace._TRACER_PROVIDER = previous
        tracing._provider_seen = (-1.0, False)
        provider.shutdown()
