"""Prometheus metrics: queue gauges read from the database, and worker counters.

Needs the ``metrics`` extra (``pip install 'alkstore_sa[metrics]'``, which brings
``prometheus-client``). Importing :mod:`alkstore_sa` never imports
``prometheus_client``; this module does.

- :func:`queue_metrics_collector`: a collector to register in a
  :class:`~prometheus_client.CollectorRegistry`; each scrape (at most one database
  read per ``cache_seconds``) reports every queue of the given schemas.
- Workers count what they do (claimed, completed, failed, retried, lost jobs;
  handler duration; pickup latency) into the default registry when
  ``prometheus_client`` is installed, or the one given as ``Worker(metrics=...)``.
- :func:`render` and :func:`metrics_asgi_app` serve a registry.

Example::

    from prometheus_client import CollectorRegistry
    from alkstore_sa.metrics import queue_metrics_collector, render

    registry = CollectorRegistry()
    registry.register(queue_metrics_collector(engine, ["pgboss"]))
    body, content_type = render(registry)

See the "Export Prometheus metrics" page for the metric names and what each number means.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ._extras import missing_extra

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.exposition import choose_encoder
    from prometheus_client.registry import Collector
except ModuleNotFoundError as exc:
    raise missing_extra("alkstore_sa.metrics", "metrics", exc) from exc
from sqlalchemy import Engine, func, select

from . import names, versions
from .errors import InvalidOptionsError, shown
from .names import DEFAULT_SCHEMA, validate_schema
from .ops import driver, read_version
from .records import Job
from .sql.statements import statements_for

__all__ = [
    "QueueMetricsCollector",
    "metrics_asgi_app",
    "queue_metrics_collector",
    "render",
]

log = logging.getLogger(__name__)

DEFAULT_CACHE_SECONDS = 5.0
DEFAULT_STATEMENT_TIMEOUT_MS = 5000

LATENCY_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
"""Histogram buckets (seconds) of handler durations and pickup latencies: from a few
milliseconds (a busy worker) to an hour (a job that waited for a free slot)."""


# ---------------------------------------------------------------- queue metrics


def queue_metrics_collector(
    engine: Engine,
    schemas: Sequence[str] | str = (DEFAULT_SCHEMA,),
    *,
    cache_seconds: float = DEFAULT_CACHE_SECONDS,
    statement_timeout_ms: int = DEFAULT_STATEMENT_TIMEOUT_MS,
) -> QueueMetricsCollector:
    """A Prometheus collector of every queue's numbers in ``schemas``.

    Register it in a registry (``registry.register(collector)``); each scrape then
    reports, per schema: ``alkstore_queue_jobs`` by queue and state, the age of
    the oldest ready job, and whether the read worked. One read per schema and
    ``cache_seconds`` at most (scrapes in between get the same numbers), each in
    its own short transaction with a ``statement_timeout`` of
    ``statement_timeout_ms``. A read that fails (database down, schema missing, a
    version this release does not speak) is not raised to the scraper: it sets
    ``alkstore_queue_metrics_up{schema}`` to 0 and counts
    ``alkstore_queue_metrics_errors_total{schema}``.

    :param engine: a sync :class:`~sqlalchemy.engine.Engine` (scrapes are
        synchronous; with an ``AsyncEngine``, make a sync engine for the same
        URL). Give it a ``connect_timeout`` so a scrape of an unreachable host
        ends quickly.
    :param schemas: the queue schemas to report (a name or a list of names).
    :param cache_seconds: how long a read is reused (0: every scrape reads).
    :param statement_timeout_ms: the longest a read's statements may run.
    :raises InvalidOptionsError: for a bad argument, before any SQL.
    """
    if not isinstance(engine, Engine):
        raise InvalidOptionsError(
            "engine",
            f"expected a sync sqlalchemy Engine, not {type(engine).__name__} "
            "(scrapes are synchronous; for an AsyncEngine, create_engine() the same URL)",
        )
    names = [schemas] if isinstance(schemas, str) else list(schemas)
    if not names:
        raise InvalidOptionsError("schemas", "name at least one schema")
    names = [validate_schema(name) for name in names]
    if len(set(names)) != len(names):
        raise InvalidOptionsError("schemas", f"a schema is named twice in {shown(names)}")
    if (
        isinstance(cache_seconds, bool)
        or not isinstance(cache_seconds, int | float)
        or not 0 <= cache_seconds < float("inf")
    ):
        raise InvalidOptionsError(
            "cache_seconds", f"must be 0 or more seconds, not {shown(cache_seconds)}"
        )
    if (
        isinstance(statement_timeout_ms, bool)
        or not isinstance(statement_timeout_ms, int)
        or statement_timeout_ms < 1
    ):
        raise InvalidOptionsError(
            "statement_timeout_ms",
            f"must be a positive whole number of milliseconds, not {shown(statement_timeout_ms)}",
        )
    return QueueMetricsCollector(engine, names, float(cache_seconds), statement_timeout_ms)


@dataclass(frozen=True)
class _Reading:
    """One schema's read: its version and rows, or the error met."""

    schema: str
    version: int | None = None
    rows: tuple[Any, ...] = ()
    error: str | None = None


class QueueMetricsCollector(Collector):
    """The collector made by :func:`queue_metrics_collector` (see there).

    :ivar reads: how many times it has read the database (once per schema per
        refresh), for tests and for the curious.
    """

    def __init__(
        self, engine: Engine, schemas: list[str], cache_seconds: float, statement_timeout_ms: int
    ) -> None:
        self.engine = engine
        self.schemas = tuple(schemas)
        self.cache_seconds = cache_seconds
        self.statement_timeout_ms = statement_timeout_ms
        self.reads = 0
        self._lock = threading.Lock()  # one refresh at a time; concurrent scrapes share it
        self._readings: list[_Reading] | None = None
        self._read_at = 0.0
        self._errors = dict.fromkeys(self.schemas, 0)
        self._failing: set[str] = set()

    def describe(self) -> Iterable[Metric]:
        """The metric names, without reading the database (used at registration)."""
        return _families([], {})

    def collect(self) -> Iterable[Metric]:
        """The metrics of the last read, reading again once it is ``cache_seconds`` old."""
        with self._lock:
            now = time.monotonic()
            if self._readings is None or now - self._read_at >= self.cache_seconds:
                self._readings = [self._read(schema) for schema in self.schemas]
                self._read_at = time.monotonic()
            readings, errors = self._readings, dict(self._errors)
        return _families(readings, errors)

    def _read(self, schema: str) -> _Reading:
        self.reads += 1
        try:
            with self.engine.connect() as conn, conn.begin():
                # SET LOCAL, as a function call: it ends with this transaction.
                conn.execute(
                    select(
                        func.set_config("statement_timeout", str(self.statement_timeout_ms), True)
                    )
                )
                # The version row read directly, not through ``migrate``: that module
                # imports Alembic, which a worker with metrics has no use for.
                version = driver.run(
                    conn, read_version(schema), {"schema_translate_map": {DEFAULT_SCHEMA: schema}}
                )
                if version is None:
                    raise LookupError(f"schema {shown(schema)} is not installed")
                spoken = names.SPOKEN_SCHEMA_VERSIONS
                if version not in spoken:
                    raise LookupError(
                        f"schema {shown(schema)} is at version {version}, "
                        f"not {' or '.join(map(str, sorted(spoken)))}"
                    )
                stmt = statements_for(version).queue_metrics()
                rows = conn.execution_options(
                    schema_translate_map={DEFAULT_SCHEMA: schema}
                ).execute(stmt)
                reading = _Reading(schema, version, tuple(rows.all()))
        except Exception as exc:
            self._errors[schema] += 1
            lines = str(exc).strip().splitlines()
            reason = type(exc).__name__ + (f": {lines[0]}" if lines else "")
            # Said once per outage, not at every scrape.
            level = logging.DEBUG if schema in self._failing else logging.WARNING
            self._failing.add(schema)
            log.log(
                level,
                "queue metrics of schema %r not read: %s",
                schema,
                reason,
                extra={"action": "metrics_read_error", "schema": schema},
            )
            return _Reading(schema, error=reason)
        self._failing.discard(schema)
        return reading


def _families(readings: list[_Reading], errors: dict[str, int]) -> list[Metric]:
    jobs = GaugeMetricFamily(
        "alkstore_queue_jobs",
        "Jobs per queue and state (ready, deferred, active; at schema 46 also blocked and "
        "failed), from the counters supervision caches in the queue table.",
        labels=["schema", "queue", "state"],
    )
    stored = GaugeMetricFamily(
        "alkstore_queue_stored_jobs",
        "Jobs of the queue in the job table, finished ones included (cached counter).",
        labels=["schema", "queue"],
    )
    counted = GaugeMetricFamily(
        "alkstore_queue_counts_age_seconds",
        "Seconds since supervision last counted the queue (absent: never counted).",
        labels=["schema", "queue"],
    )
    oldest = GaugeMetricFamily(
        "alkstore_queue_oldest_ready_job_age_seconds",
        "Seconds the longest-waiting ready job has been due (now - start_after); 0 when "
        "none is ready. Read from the job table at each refresh, exact.",
        labels=["schema", "queue"],
    )
    up = GaugeMetricFamily(
        "alkstore_queue_metrics_up",
        "1 if the last read of the schema's queue numbers worked, else 0.",
        labels=["schema"],
    )
    version = GaugeMetricFamily(
        "alkstore_queue_schema_version",
        "The pg-boss schema version found at the last read.",
        labels=["schema"],
    )
    failed_reads = CounterMetricFamily(
        "alkstore_queue_metrics_errors",
        "Reads of the schema's queue numbers that failed (the database down, a statement "
        "timeout, no schema or an unspoken version).",
        labels=["schema"],
    )
    for r in readings:
        up.add_metric([r.schema], 0.0 if r.error else 1.0)
        if r.version is not None:
            version.add_metric([r.schema], float(r.version))
        for row in r.rows:
            labels = [r.schema, row.name]
            extra = "ready, blocked and failed counts"
            if r.version is not None and versions.has(r.version, extra):
                states = {
                    "ready": row.ready,
                    "deferred": row.deferred,
                    "blocked": row.blocked,
                    "active": row.active,
                    "failed": row.failed,
                }
            else:
                # Schema 26 caches queued (created + retry) and deferred (due later).
                states = {
                    "ready": max(row.queued - row.deferred, 0),
                    "deferred": row.deferred,
                    "active": row.active,
                }
            for state, value in states.items():
                jobs.add_metric([*labels, state], float(value))
            stored.add_metric(labels, float(row.total))
            if row.counted_age is not None:
                counted.add_metric(labels, max(float(row.counted_age), 0.0))
            age = row.oldest_ready_age
            oldest.add_metric(labels, 0.0 if age is None else max(float(age), 0.0))
    for schema, n in errors.items():
        failed_reads.add_metric([schema], float(n))
    return [jobs, stored, counted, oldest, up, version, failed_reads]


# ---------------------------------------------------------------- serving


def render(registry: CollectorRegistry = REGISTRY, accept: str | None = None) -> tuple[bytes, str]:
    """The registry's metrics as ``(body, content_type)``, in the exposition format
    the ``accept`` header (an HTTP ``Accept`` value) asks for; text by default.

    For a web framework's own ``/metrics`` route::

        body, content_type = render(registry, request.headers.get("accept"))
    """
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[dict[str, Any]], Awaitable[None]]],
    Awaitable[None],
]


def metrics_asgi_app(registry: CollectorRegistry = REGISTRY) -> ASGIApp:
    """An ASGI app answering every GET/HEAD with ``registry``'s metrics.

    Unlike ``prometheus_client.make_asgi_app``, the registry is collected in a
    thread, so a scrape that reads the database (:func:`queue_metrics_collector`)
    never blocks the event loop. Mount it, e.g. with Starlette:
    ``Mount("/metrics", app=metrics_asgi_app(registry))``.
    """

    async def app(
        scope: dict[str, Any],
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[dict[str, Any]], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed\n", "text/plain; charset=utf-8")
            return
        accept = ""
        for key, value in scope.get("headers") or ():
            if key.lower() == b"accept":
                accept = value.decode("latin-1")
        body, content_type = await asyncio.to_thread(render, registry, accept)
        await _respond(send, 200, b"" if scope["method"] == "HEAD" else body, content_type)

    return app


async def _respond(
    send: Callable[[dict[str, Any]], Awaitable[None]], status: int, body: bytes, content_type: str
) -> None:
    headers = [(b"content-type", content_type.encode("latin-1"))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# ---------------------------------------------------------------- worker metrics


@dataclass(frozen=True)
class _WorkerFamilies:
    claimed: Counter
    completed: Counter
    failed: Counter
    retried: Counter
    lost: Counter
    handler: Histogram
    pickup: Histogram


_families_lock = threading.Lock()
_worker_families: dict[int, tuple[CollectorRegistry, _WorkerFamilies]] = {}


def _families_in(registry: CollectorRegistry) -> _WorkerFamilies:
    """The worker metrics registered in ``registry``, registered there once per
    process: every worker of the process counts into the same objects."""
    with _families_lock:
        found = _worker_families.get(id(registry))
        if found is not None:
            return found[1]
        labels = ("schema", "queue")

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        families = _WorkerFamilies(
            claimed=counter("alkstore_worker_jobs_claimed", "Jobs claimed by workers."),
            completed=counter("alkstore_worker_jobs_completed", "Jobs workers completed."),
            failed=counter(
                "alkstore_worker_jobs_failed",
                "Failed attempts (handler error, timeout, shutdown), retried or not.",
            ),
            retried=counter(
                "alkstore_worker_jobs_retried",
                "Failed attempts the database put back to retry (part of jobs_failed).",
            ),
            lost=counter(
                "alkstore_worker_jobs_lost",
                "Attempts whose job was taken away (expired, cancelled, deleted) first.",
            ),
            handler=Histogram(
                "alkstore_worker_handler_duration_seconds",
                "Seconds handlers ran (until they returned or raised).",
                labels,
                registry=registry,
                buckets=LATENCY_BUCKETS,
            ),
            pickup=Histogram(
                "alkstore_worker_pickup_latency_seconds",
                "Seconds from a job being due (start_after) to its claim (started_on), "
                "both by the database clock.",
                labels,
                registry=registry,
                buckets=LATENCY_BUCKETS,
            ),
        )
        _worker_families[id(registry)] = (registry, families)
        return families


class _QueueSeries:
    """One queue's series, bound once: the hot path only increments and observes."""

    __slots__ = ("claimed", "completed", "failed", "handler", "lost", "pickup", "retried")

    def __init__(self, families: _WorkerFamilies, schema: str, queue: str) -> None:
        self.claimed = families.claimed.labels(schema, queue)
        self.completed = families.completed.labels(schema, queue)
        self.failed = families.failed.labels(schema, queue)
        self.retried = families.retried.labels(schema, queue)
        self.lost = families.lost.labels(schema, queue)
        self.handler = families.handler.labels(schema, queue)
        self.pickup = families.pickup.labels(schema, queue)


class WorkerMetrics:
    """What one worker counts (internal: made by the worker from its ``metrics``
    option; its methods are called from the worker's loops)."""

    def __init__(self, schema: str, registry: CollectorRegistry) -> None:
        self.schema = schema
        self.registry = registry
        self._families = _families_in(registry)
        self._series: dict[str, _QueueSeries] = {}

    def _queue(self, queue: str) -> _QueueSeries:
        series = self._series.get(queue)
        if series is None:
            series = self._series[queue] = _QueueSeries(self._families, self.schema, queue)
        return series

    def claimed(self, queue: str, jobs: Sequence[Job]) -> None:
        series = self._queue(queue)
        series.claimed.inc(len(jobs))
        for job in jobs:
            if job.started_on is not None:
                wait = (job.started_on - job.start_after).total_seconds()
                series.pickup.observe(wait if wait > 0 else 0.0)

    def ran(self, queue: str, seconds: float) -> None:
        self._queue(queue).handler.observe(seconds)

    def completed(self, queue: str, n: int = 1) -> None:
        self._queue(queue).completed.inc(n)

    def failed(self, queue: str, retried: bool) -> None:
        series = self._queue(queue)
        series.failed.inc()
        if retried:
            series.retried.inc()

    def lost(self, queue: str) -> None:
        self._queue(queue).lost.inc()


def worker_metrics(option: object, schema: str) -> WorkerMetrics:
    """The worker's metrics for its ``metrics`` option (``True``/``None``: the default
    registry; a :class:`~prometheus_client.CollectorRegistry`: that one)."""
    if option is None or option is True:
        return WorkerMetrics(schema, REGISTRY)
    if isinstance(option, CollectorRegistry):
        return WorkerMetrics(schema, option)
    raise InvalidOptionsError(
        "metrics", f"must be True, False, None or a prometheus_client registry, not {shown(option)}"
    )


def serve(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> Any:
    """Serve ``registry`` over HTTP on ``addr:port`` from a daemon thread
    (``prometheus_client.start_http_server``); what ``alkstore worker
    --metrics-port`` runs. Returns what that function returns (with
    prometheus-client 0.20 and later, ``(server, thread)``)."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr, registry=registry)
