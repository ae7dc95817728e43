"""Prometheus metrics: the queue collector (schemas 26 and 46) and the workers' counters."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.orm import Session
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa import QueueService, Worker
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.metrics import queue_metrics_collector, render
from alkstore_sa.records import Job

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(registry: CollectorRegistry) -> Samples:
    """Every sample of the registry by name and sorted labels."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float | None:
    return found.get((name, tuple(sorted(labels.items()))))


def tx(engine: Engine, schema: str, fn: Callable[[QueueService], Any]) -> Any:
    with Session(engine) as session, session.begin():
        return fn(QueueService(session, schema=schema))


@pytest.mark.parametrize("version", [26, 46])
def test_queue_metrics_count_jobs_by_state_and_age_the_oldest_ready_job(
    engine: Engine, request: pytest.FixtureRequest, version: int
) -> None:
    schema = request.getfixturevalue("schema" if version == 26 else "schema46")
    tx(engine, schema, lambda q: q.create_queue("q"))
    tx(engine, schema, lambda q: q.create_queue("idle"))
    for _ in range(3):
        tx(engine, schema, lambda q: q.send("q", {}))
    tx(engine, schema, lambda q: q.send("q", {}, start_after=3600))
    assert len(tx(engine, schema, lambda q: q.fetch("q"))) == 1
    # The ready jobs have been due for a minute.
    with engine.begin() as conn:
        conn.execute(
            text(
                f"UPDATE \"{schema}\".job SET start_after = now() - interval '60 seconds', "
                "created_on = now() - interval '60 seconds' "
                "WHERE state = 'created' AND start_after <= now()"
            )
        )
    tx(engine, schema, lambda q: q.supervise(force=True))

    registry = CollectorRegistry()
    registry.register(queue_metrics_collector(engine, [schema]))
    found = samples(registry)

    def jobs(state: str, queue: str = "q") -> float | None:
        return value(found, "alkstore_queue_jobs", schema=schema, queue=queue, state=state)

    assert (jobs("ready"), jobs("deferred"), jobs("active")) == (2, 1, 1)
    assert jobs("ready", "idle") == 0
    if version == 46:
        assert (jobs("blocked"), jobs("failed")) == (0, 0)
    else:
        assert jobs("blocked") is None
    assert value(found, "alkstore_queue_stored_jobs", schema=schema, queue="q") == 4
    oldest = value(found, "alkstore_queue_oldest_ready_job_age_seconds", schema=schema, queue="q")
    assert oldest is not None and 59 <= oldest < 3600
    idle = "alkstore_queue_oldest_ready_job_age_seconds"
    assert value(found, idle, schema=schema, queue="idle") == 0
    counted = value(found, "alkstore_queue_counts_age_seconds", schema=schema, queue="q")
    assert counted is not None and counted >= 0
    assert value(found, "alkstore_queue_metrics_up", schema=schema) == 1
    assert value(found, "alkstore_queue_schema_version", schema=schema) == version
    assert value(found, "alkstore_queue_metrics_errors_total", schema=schema) == 0


def test_a_read_is_reused_for_cache_seconds(engine: Engine, schema: str) -> None:
    tx(engine, schema, lambda q: q.create_queue("q"))
    cached = queue_metrics_collector(engine, schema, cache_seconds=3600)
    registry = CollectorRegistry()
    registry.register(cached)  # registering reads nothing (describe)
    assert cached.reads == 0
    before = samples(registry)
    tx(engine, schema, lambda q: q.send("q", {}))
    after = samples(registry)
    assert cached.reads == 1
    # The job sent in between is not seen: the first read was served again.
    name = "alkstore_queue_oldest_ready_job_age_seconds"
    assert value(before, name, schema=schema, queue="q") == 0
    assert value(after, name, schema=schema, queue="q") == 0

    fresh = queue_metrics_collector(engine, schema, cache_seconds=0)
    list(fresh.collect())
    list(fresh.collect())
    assert fresh.reads == 2


def test_an_unreachable_database_is_reported_as_a_metric_not_raised() -> None:
    down = create_engine(
        "postgresql+psycopg://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 2}
    )
    registry = CollectorRegistry()
    registry.register(queue_metrics_collector(down, ["pgboss", "other"], cache_seconds=0))
    body, content_type = render(registry)  # what a scrape does: no exception
    assert content_type.startswith("text/plain")
    assert b'alkstore_queue_metrics_up{schema="pgboss"} 0.0' in body
    found = samples(registry)
    assert value(found, "alkstore_queue_metrics_errors_total", schema="other") == 2
    assert not any(name == "alkstore_queue_jobs" for name, _ in found)


def test_a_schema_that_is_not_installed_is_an_error_metric(engine: Engine, schema: str) -> None:
    registry = CollectorRegistry()
    registry.register(queue_metrics_collector(engine, [schema, "t_not_there"]))
    found = samples(registry)
    assert value(found, "alkstore_queue_metrics_up", schema=schema) == 1
    assert value(found, "alkstore_queue_metrics_up", schema="t_not_there") == 0


@pytest.mark.parametrize(
    ("option", "arguments"),
    [
        ("engine", {"engine": create_async_engine("postgresql+psycopg://x@localhost/x")}),
        ("schemas", {"schemas": []}),
        ("schema", {"schemas": ["bad.name"]}),
        ("cache_seconds", {"cache_seconds": -1}),
        ("statement_timeout_ms", {"statement_timeout_ms": 0}),
    ],
)
def test_bad_collector_arguments_are_refused_before_any_sql(
    option: str, arguments: dict[str, Any]
) -> None:
    kwargs: dict[str, Any] = {"engine": create_engine("postgresql+psycopg://x@localhost/x")}
    kwargs.update(arguments)
    with pytest.raises(InvalidOptionsError) as info:
        queue_metrics_collector(**kwargs)
    assert info.value.option == option


def test_workers_count_claims_completions_failures_and_retries(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("ok"))
    h.service_tx(lambda q: q.create_queue("boom", retry_limit=1, retry_delay=0))
    h.service_tx(lambda q: q.create_queue("tx"))
    done = [send(h, "ok") for _ in range(2)]
    committed = send(h, "tx")
    doomed = send(h, "boom")
    registry = CollectorRegistry()
    w = h.worker(poll_interval=0.1, metrics=registry)
    # A second worker in the process counts into the same metric objects.
    h.worker(metrics=registry)

    def fail(job: Job) -> None:
        raise RuntimeError("no")

    w.register("ok", h.handler(lambda job: None))
    w.register("boom", h.handler(fail))
    w.register("tx", h.handler(lambda job: None), transactional=True)
    h.start(w)
    wait_for(lambda: state_of(h, "boom", doomed) == "failed")
    wait_for(lambda: all(state_of(h, "ok", i) == "completed" for i in done))
    wait_for(lambda: state_of(h, "tx", committed) == "completed")
    h.stop(w)
    assert w.metrics_registry is registry

    found = samples(registry)

    def counted(name: str, queue: str) -> float | None:
        return value(found, name, schema=h.schema, queue=queue)

    assert counted("alkstore_worker_jobs_claimed_total", "ok") == 2
    assert counted("alkstore_worker_jobs_completed_total", "ok") == 2
    assert counted("alkstore_worker_jobs_failed_total", "ok") == 0
    assert counted("alkstore_worker_jobs_claimed_total", "boom") == 2
    assert counted("alkstore_worker_jobs_failed_total", "boom") == 2
    assert counted("alkstore_worker_jobs_retried_total", "boom") == 1
    assert counted("alkstore_worker_jobs_completed_total", "tx") == 1
    assert counted("alkstore_worker_handler_duration_seconds_count", "ok") == 2
    assert counted("alkstore_worker_pickup_latency_seconds_count", "boom") == 2
    pickup = counted("alkstore_worker_pickup_latency_seconds_sum", "ok")
    assert pickup is not None and pickup >= 0


def test_worker_metrics_option(engine: Engine) -> None:
    assert Worker(engine, metrics=False).metrics_registry is None
    assert Worker(engine).metrics_registry is REGISTRY  # installed: on by default
    assert Worker(engine).metrics_registry is REGISTRY  # twice: no duplicate registration
    with pytest.raises(InvalidOptionsError) as info:
        Worker(engine, metrics="yes")
    assert info.value.option == "metrics"


@pytest.mark.subprocess
def test_importing_alkstore_sa_does_not_import_prometheus_client() -> None:
    code = (
        "import sys, alkstore_sa, alkstore_sa.cli, alkstore_sa.worker\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
        "import alkstore_sa.metrics\n"
        "assert 'prometheus_client' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_the_asgi_app_serves_the_registry_and_refuses_other_methods() -> None:
    from prometheus_client import Counter

    from alkstore_sa.metrics import metrics_asgi_app

    registry = CollectorRegistry()
    Counter("seen", "a counter", registry=registry).inc()
    app = metrics_asgi_app(registry)

    async def call(method: str) -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "headers": [(b"accept", b"text/plain")]}
        await app(scope, receive, send)
        return sent

    start, body = await call("GET")
    assert start["status"] == 200 and b"seen_total 1.0" in body["body"]
    start, _ = await call("POST")
    assert start["status"] == 405
