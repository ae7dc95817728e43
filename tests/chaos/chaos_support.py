"""Child worker processes, deadlines and database probes for the chaos tests."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from chaos_app import application_name
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

import alkstore_sa
from alkstore_sa import QueueService

HERE = Path(__file__).resolve().parent
ROOT = Path(alkstore_sa.__file__).resolve().parent.parent
T = TypeVar("T")


class Deadline:
    """A hard time budget for one test: every wait draws on it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def wait_for(
        self,
        what: str,
        probe: Callable[[], T | None],
        timeout: float,
        interval: float = 0.05,
        show: Callable[[], object] | None = None,
    ) -> T:
        """Poll ``probe`` until it returns a truthy value, for ``timeout`` s at most.

        ``show`` gives what to print if it never does.
        """
        end = min(self.end, time.monotonic() + timeout)
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > end:
                seen = f" (last: {show()!r})" if show is not None else ""
                raise AssertionError(f"timed out waiting for {what}{seen}")
            time.sleep(interval)


class Sender:
    """Sends a job every few milliseconds in its own transactions, counting failures."""

    def __init__(self, database_url: str, schema: str) -> None:
        self.engine = create_engine(
            database_url,
            pool_pre_ping=True,
            connect_args={"application_name": application_name(schema, "sender")},
        )
        self.schema = schema
        self.sent: list[uuid.UUID] = []
        self.errors = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            try:
                with Session(self.engine) as s, s.begin():
                    job_id = QueueService(s, schema=self.schema).send("chaos", {"n": n})
                assert job_id is not None
                self.sent.append(job_id)
                n += 1
            except DBAPIError:
                self.errors += 1  # the connection was terminated: send again
            self.stop.wait(0.01)

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(10)
        self.engine.dispose()


class Child:
    """One ``alkstore worker`` process, its output in a file."""

    def __init__(self, label: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.label = label
        self.proc = proc
        self.log = log

    @property
    def pid(self) -> int:
        return self.proc.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def signal(self, signum: int) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def kill(self) -> None:
        """SIGKILL (which also ends a stopped process) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)


class Children:
    """Starts chaos workers; leaving the ``with`` block kills every one still alive."""

    def __init__(self, database_url: str, schema: str, workdir: Path, **env: str) -> None:
        self.database_url = database_url
        self.schema = schema
        self.workdir = workdir
        self.env = env
        self.started: list[Child] = []

    def __enter__(self) -> Children:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        for child in self.started:
            child.kill()
        if exc_type is not None:
            # Shown by pytest with the failure: what each process was doing.
            for child in self.started:
                print(f"--- {child.label} (pid {child.pid}):\n{child.output()[-3000:]}")

    def start(self, label: str, **env: str) -> Child:
        log = self.workdir / f"{label}.log"
        environ = {
            **os.environ,
            "CHAOS_DATABASE_URL": self.database_url,
            "CHAOS_SCHEMA": self.schema,
            "CHAOS_LABEL": label,
            "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]),
            **self.env,
            **env,
        }
        cmd = [
            sys.executable,
            "-m",
            "alkstore_sa.cli",
            "worker",
            "--app",
            "chaos_app:build",
            "--log-level",
            "INFO",
        ]
        with log.open("wb") as out:
            proc = subprocess.Popen(cmd, cwd=HERE, env=environ, stdout=out, stderr=out)
        child = Child(label, proc, log)
        self.started.append(child)
        return child

    def stop_gracefully(self, child: Child, timeout: float = 10) -> str:
        """SIGTERM, wait for a clean exit, return the output."""
        child.signal(signal.SIGTERM)
        try:
            code = child.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise AssertionError(f"{child.label} did not stop:\n{child.output()}") from None
        assert code == 0, child.output()
        return child.output()


@contextlib.contextmanager
def stopped(child: Child) -> Iterator[None]:
    """Freeze ``child`` (SIGSTOP) for the block, so the database shows what it holds."""
    child.signal(signal.SIGSTOP)
    try:
        yield
    finally:
        child.signal(signal.SIGCONT)


def rows(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    """Run ``statement`` (``{s}`` is the quoted schema) in its own transaction."""
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def states(engine: Engine, schema: str, queue: str) -> dict[str, int]:
    """Jobs of ``queue`` by state."""
    found = rows(
        engine,
        schema,
        "SELECT state::text, count(*) FROM {s}.job WHERE name = :q GROUP BY 1",
        q=queue,
    )
    return {state: n for state, n in found}


def in_flight(engine: Engine, schema: str, label: str) -> set[Any]:
    """Ids of active jobs whose current attempt (same ``started_on``) is ``label``'s."""
    found = rows(
        engine,
        schema,
        "SELECT j.id FROM {s}.job j JOIN {s}.chaos_attempt a"
        " ON a.job_id = j.id AND a.started_on = j.started_on"
        " WHERE j.state = 'active' AND a.label = :label",
        label=label,
    )
    return {r.id for r in found}


# psycopg quotes the channel as an identifier, always.
LISTENER_OF = (
    "application_name = 'alkstore-listener'"
    " AND query = 'LISTEN \"' || replace(:channel, '\"', '\"\"') || '\"'"
)


def terminate(engine: Engine, schema: str, app_prefix: str, listener: bool) -> int:
    """``pg_terminate_backend`` this test's backends only; returns how many.

    Pooled connections are found by their ``application_name`` prefix (unique per
    test schema); the shared listening connection carries the library's fixed name,
    so it is found by the channel of this test's schema in its last statement.
    """
    found = rows(
        engine,
        schema,
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE pid <> pg_backend_pid() AND datname = current_database() AND ("
        " starts_with(application_name, :prefix)"
        f" OR (:listener AND {LISTENER_OF}))",
        prefix=app_prefix,
        listener=listener,
        channel=f"alkstore_{schema}",
    )
    return int(found[0][0])


def listeners(engine: Engine, schema: str) -> list[int]:
    """Backend pids of the listening connections on this test schema's channel."""
    found = rows(
        engine,
        schema,
        f"SELECT pid FROM pg_stat_activity WHERE {LISTENER_OF}",
        channel=f"alkstore_{schema}",
    )
    return [r.pid for r in found]


def open_transactions(engine: Engine, schema: str, label: str) -> int:
    """Backends of the process ``label`` in a transaction or running a statement."""
    found = rows(
        engine,
        schema,
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE application_name = :app AND state IS DISTINCT FROM 'idle'",
        app=f"chaos-{schema}-{label}",
    )
    return int(found[0][0])


def freeze_between_transactions(engine: Engine, schema: str, child: Child, tries: int = 50) -> int:
    """SIGSTOP ``child`` at a moment none of its connections is in a transaction.

    A process frozen inside a transaction keeps that transaction's locks until
    PostgreSQL ends the session (docs/concepts/guarantees.md); tests of what a frozen
    worker's *job* becomes freeze it between transactions. Returns the tries it took.
    """
    for attempt in range(1, tries + 1):
        child.signal(signal.SIGSTOP)
        time.sleep(0.05)  # a statement it had sent finishes on the server
        if open_transactions(engine, schema, child.label) == 0:
            return attempt
        child.signal(signal.SIGCONT)
        time.sleep(0.01 * attempt)
    raise AssertionError(f"{child.label} was never between transactions")


@dataclass
class Race:
    """What :func:`race` saw: every attempt (``job_id``, ``label``) and each process's output."""

    attempts: list[Any]
    outputs: list[str]

    def check_each_job_ran_once(self, jobs: int, processes: int) -> None:
        per_job = Counter(a.job_id for a in self.attempts)
        duplicates = {i: n for i, n in per_job.items() if n > 1}
        assert len(per_job) == jobs, f"{jobs - len(per_job)} jobs never ran"
        assert duplicates == {}
        assert len(self.attempts) == jobs
        labels = {a.label for a in self.attempts}
        assert len(labels) == processes, "not every process took part: no race happened"


def race(
    database_url: str,
    engine: Engine,
    schema: str,
    workdir: Path,
    *,
    jobs: int,
    processes: int,
    sending_url: str | None = None,
    backend: str | None = None,
    **env: str,
) -> Race:
    """``jobs`` no-op jobs (queue ``chaos``, no retries) sent through ``sending_url``
    (default: ``engine``'s database), then worked by ``processes`` chaos workers
    connected to ``database_url`` (``env`` configures them) until all are completed;
    ``backend`` names the profile the jobs are sent under (the workers' is ``env``'s)."""
    from chaos_app import create_tables

    deadline = Deadline(120)
    create_tables(engine, schema)
    sender = engine if sending_url is None else create_engine(sending_url)
    try:
        with Session(sender) as s, s.begin():
            svc = QueueService(s, schema=schema, backend=backend)
            svc.create_queue("chaos", retry_limit=0)
            assert all(svc.send_many("chaos", [{"data": {"n": i}} for i in range(jobs)]))
    finally:
        if sender is not engine:
            sender.dispose()
    with Children(database_url, schema, workdir, **env) as kids:
        workers = [kids.start(f"w{i}") for i in range(processes)]
        deadline.wait_for(
            "every job to complete",
            lambda: states(engine, schema, "chaos") == {"completed": jobs},
            100,
            interval=0.25,
            show=lambda: states(engine, schema, "chaos"),
        )
        outputs = [kids.stop_gracefully(w) for w in workers]
    attempts = rows(engine, schema, "SELECT job_id, label FROM {s}.chaos_attempt")
    return Race(attempts, outputs)
