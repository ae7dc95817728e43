"""Trace context across the queue, with OpenTelemetry when it is installed.

What pg-boss 12.38 does with OpenTelemetry, done the same way so that a trace
crosses the queue whichever client sent the job and whichever works it
(the "Trace jobs with OpenTelemetry" page):

* an operation that creates jobs (``send``, ``send_many``, ``upsert``, ``flow``)
  runs a PRODUCER span named ``"<operation> <queue>"`` (``send``, ``insert``,
  ``upsert``, ``flow``), a child of the caller's current span; ``publish`` runs a
  ``"publish <event>"`` span, the parent of its sends' spans;
* at schema 46 every job it inserts stores that span's context in the job's
  ``trace_context`` column: the W3C Trace Context carrier as a JSON object,
  ``{"traceparent": ..., "tracestate": ...}`` (``tracestate`` only when there is
  one), NULL when the span context is not valid (no SDK and no current span);
* a worker runs each handler in a CONSUMER span ``"process <queue>"`` whose parent
  is the context the job stored (never the worker's own current context: a job has
  nothing to do with the trace ``work()`` was called in), a root span when it
  stored none or one that does not parse. The span is current inside the handler,
  so the handler's own spans are its children.

Spans carry the messaging attributes pg-boss gives them (``messaging.system`` is
``"pg-boss"``: the same queue whichever client works it).

Without OpenTelemetry nothing here does anything and ``opentelemetry`` is never
imported; the package is only imported on the first send or job. Below schema 46
the spans are still made, but nothing is stored (the column does not exist).
Tracing is ambient: it never makes an operation or a job fail.
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from . import versions

MESSAGING_SYSTEM = "pg-boss"
"""The ``messaging.system`` of every span (pg-boss's own, as both clients share the queue)."""

INSTRUMENTATION_SCOPE = "alkstore_sa"
"""The name of the tracer the spans are made with."""

_ATTR_SYSTEM = "messaging.system"
_ATTR_OPERATION = "messaging.operation.name"
_ATTR_TYPE = "messaging.operation.type"
_ATTR_DESTINATION = "messaging.destination.name"
_ATTR_MESSAGE_ID = "messaging.message.id"
_ATTR_BATCH = "messaging.batch.message_count"
_ATTR_ERROR = "error.type"
_ATTR_SCHEMA = "pgboss.schema"
_ATTR_RETRY = "pgboss.job.retry_count"


@functools.cache
def _otel() -> Any:
    """The OpenTelemetry API modules, or ``None`` when it is not installed."""
    try:
        from opentelemetry import context, propagate, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None

    try:
        from importlib.metadata import version

        ours: str | None = version("alkstore_sa")
    except Exception:
        ours = None
    return SimpleNamespace(
        context=context,
        propagate=propagate,
        trace=trace,
        w3c=TraceContextTextMapPropagator(),
        version=ours,
    )


_tracers: tuple[Any, Any] = (None, None)


def _tracer(api: Any) -> Any:
    # The provider is looked up on each use, so that one set after the first send still
    # gets the spans; its tracer is kept while it stays the same.
    global _tracers
    provider = api.trace.get_tracer_provider()
    known, tracer = _tracers
    if provider is not known:
        tracer = provider.get_tracer(INSTRUMENTATION_SCOPE, api.version)
        _tracers = (provider, tracer)
    return tracer


_provider_seen: tuple[float, bool] = (-1.0, False)

PROVIDER_RECHECK_SECONDS = 1.0
"""How long the answer "is a tracer provider set?" is kept: the per-job check
reads the environment inside OpenTelemetry, so it runs about once a second; a
provider set later is seen within that time."""


def _provider_set(api: Any) -> bool:
    """Whether a tracer provider (an SDK) is set, looked at again every
    :data:`PROVIDER_RECHECK_SECONDS`."""
    global _provider_seen
    now = time.monotonic()
    seen_at, answer = _provider_seen
    if now - seen_at >= PROVIDER_RECHECK_SECONDS or now < seen_at:
        answer = not isinstance(api.trace.get_tracer_provider(), api.trace.ProxyTracerProvider)
        _provider_seen = (now, answer)
    return answer


def _name(operation: str, queue: str | None) -> str:
    return f"{operation} {queue}" if queue else operation


def _attributes(operation: str, kind: str, queue: str | None, schema: str) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        _ATTR_SYSTEM: MESSAGING_SYSTEM,
        _ATTR_OPERATION: operation,
        _ATTR_TYPE: kind,
        _ATTR_SCHEMA: schema,
    }
    if queue:
        attributes[_ATTR_DESTINATION] = queue
    return attributes


def _record_error(api: Any, span: Any, exc: BaseException) -> None:
    try:
        span.set_attribute(_ATTR_ERROR, type(exc).__name__)
        span.record_exception(exc)
        span.set_status(api.trace.Status(api.trace.StatusCode.ERROR, str(exc)))
    except Exception:  # never in place of the error being recorded
        pass


class Producing:
    """The PRODUCER span of one operation that creates jobs (see :func:`producing`)."""

    __slots__ = ("_api", "_span", "carrier")

    def __init__(self, api: Any = None, span: Any = None, carrier: str | None = None) -> None:
        self._api = api
        self._span = span
        self.carrier = carrier
        """The JSON text to store in ``trace_context``, or ``None``."""

    def sent(self, ids: Sequence[Any]) -> None:
        """The ids of the jobs created: one is the span's ``messaging.message.id``."""
        if self._span is not None and len(ids) == 1 and ids[0] is not None:
            self._span.set_attribute(_ATTR_MESSAGE_ID, str(ids[0]))

    def failed(self, exc: BaseException) -> None:
        """The operation raised ``exc``."""
        if self._span is not None:
            _record_error(self._api, self._span, exc)

    def end(self) -> None:
        """End the span (once; later calls do nothing)."""
        if self._span is not None:
            self._span.end()
            self._span = None


_NOTHING = Producing()


def producing(
    operation: str,
    queue: str | None,
    count: int,
    schema: str,
    version: int,
    parent: Producing | None = None,
) -> Producing:
    """Start the PRODUCER span of ``operation`` creating ``count`` jobs in ``queue``,
    a child of ``parent`` if given (a publish's sends), else of the current span.

    Its ``carrier`` is what the jobs store at schema 46 (``None`` below it, or when
    the span's context is not valid). The caller ends it with :meth:`Producing.end`.
    """
    api = _otel()
    if api is None:
        return _NOTHING
    try:
        attributes = _attributes(operation, "send", queue, schema)
        if count > 1:
            attributes[_ATTR_BATCH] = count
        context = None
        if parent is not None and parent._span is not None:
            context = api.trace.set_span_in_context(parent._span)
        span = _tracer(api).start_span(
            _name(operation, queue),
            context=context,
            kind=api.trace.SpanKind.PRODUCER,
            attributes=attributes,
        )
        carrier = None
        if versions.has(version, "a trace context on jobs"):
            injected: dict[str, str] = {}
            api.w3c.inject(injected, context=api.trace.set_span_in_context(span))
            if injected:
                carrier = json.dumps(injected, separators=(",", ":"))
    except Exception:  # tracing never makes a send fail
        return _NOTHING
    return Producing(api, span, carrier)


def _parent(api: Any, stored: Any) -> Any:
    """The context a job's stored ``trace_context`` names, or an empty (root) one."""
    root = api.context.Context()
    if not isinstance(stored, Mapping):
        return root
    carrier = {k: v for k, v in stored.items() if isinstance(k, str) and isinstance(v, str)}
    if not carrier:
        return root
    try:
        # The global propagator, as pg-boss extracts: baggage a sender stored arrives too.
        return api.propagate.extract(carrier, context=root)
    except Exception:
        return root


def processing(
    fn: Callable[..., Any], queue: str, job_id: Any, retry_count: int, stored: Any, schema: str
) -> Callable[..., Any]:
    """``fn`` run in the CONSUMER ``process`` span of one job (``fn`` itself without
    OpenTelemetry, and when no tracer provider is set and the job stored no trace
    context: that span would record nothing and carry no context to the handler).
    An awaitable ``fn`` returns is awaited inside the span."""
    api = _otel()
    if api is None:
        return fn
    if stored is None and isinstance(
        api.trace.get_tracer_provider(), api.trace.ProxyTracerProvider
    ):
        return fn

    def call(*args: Any) -> Any:
        try:
            attributes = _attributes("process", "process", queue, schema)
            attributes[_ATTR_MESSAGE_ID] = str(job_id)
            attributes[_ATTR_RETRY] = retry_count
            parent = _parent(api, stored)
            span = _tracer(api).start_span(
                _name("process", queue),
                context=parent,
                kind=api.trace.SpanKind.CONSUMER,
                attributes=attributes,
            )
            current = api.trace.set_span_in_context(span, parent)
        except Exception:  # tracing never makes a job fail
            return fn(*args)
        token = api.context.attach(current)
        try:
            value = fn(*args)
        except BaseException as exc:
            _record_error(api, span, exc)
            span.end()
            raise
        finally:
            api.context.detach(token)
        if inspect.isawaitable(value):
            return _awaiting(api, span, current, value)
        span.end()
        return value

    return call


async def _awaiting(api: Any, span: Any, current: Any, value: Awaitable[Any]) -> Any:
    token = api.context.attach(current)
    try:
        return await value
    except BaseException as exc:
        _record_error(api, span, exc)
        raise
    finally:
        api.context.detach(token)
        span.end()
