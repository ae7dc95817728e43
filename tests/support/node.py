"""Drive Node pg-boss 11.1.2 (and 12.38.0, schema 46) from the interop tests.

Each :class:`NodeBoss` is one ``node tests/interop/rpc.js`` process holding one
started ``PgBoss`` instance. The process is started ahead of need and waits, pg-boss loaded,
for its config on stdin (``_take_spare``): starting Node is off each test's clock. Calls go
over stdin as JSON lines and come back on stdout; unprompted lines (``error``/``warning``
events, jobs seen by a Node worker) are kept in :attr:`NodeBoss.events`.

The fixtures here are imported by the ``test_interop*`` modules:

- ``node_modules`` (session): installs ``tests/interop/node_modules`` with
  ``npm ci`` when it is missing; skips when Node is absent, fails under ``CI=true``.
- ``node_url``: the libpq URL Node connects with, derived from ``database_url``.
- ``node``: a factory ``node(schema, **options)`` returning a started
  :class:`NodeBoss`; every instance is stopped at the end of the test.

Node pg-boss 12.38.0 (schema 46) lives in ``tests/interop46`` with the Node 22 it needs
(the npm package ``node``, so no system install): ``node46_modules`` installs it with
``npm ci`` on demand, ``node46`` starts :class:`NodeBoss46` instances, and
:func:`pgboss46_migrate` runs its own ``pg-boss migrate`` command line.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

from .npm import npm_ci
from .skips import unavailable

INTEROP_DIR = Path(__file__).resolve().parents[1] / "interop"
RPC_SCRIPT = INTEROP_DIR / "rpc.js"
PGBOSS_VERSION = "11.1.2"

INTEROP46_DIR = Path(__file__).resolve().parents[1] / "interop46"
BOSS46_SCRIPT = INTEROP46_DIR / "boss.mjs"
PGBOSS46_VERSION = "12.38.0"
NODE46_BINARY = INTEROP46_DIR / "node_modules" / "node" / "bin" / "node"
"""The Node 22 binary the npm package ``node`` installs (pg-boss 12.38 needs >= 22.12)."""
PGBOSS46_CLI = INTEROP46_DIR / "node_modules" / "pg-boss" / "dist" / "cli.js"


class NodeError(RuntimeError):
    """Node pg-boss refused a call (the message is Node's), or the process died."""


def node_connection_string(database_url: str) -> str:
    """The ``postgres://`` URL for Node's ``pg`` driver (no SQLAlchemy driver suffix)."""
    url = make_url(database_url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def installed_pgboss_version() -> str | None:
    package = INTEROP_DIR / "node_modules" / "pg-boss" / "package.json"
    if not package.exists():
        return None
    return str(json.loads(package.read_text())["version"])


def ensure_node_modules() -> None:
    """Install the pinned ``pg-boss`` with ``npm ci`` unless it is already there."""
    npm_ci(INTEROP_DIR, lambda: installed_pgboss_version() == PGBOSS_VERSION, timeout=300)
    found = installed_pgboss_version()
    if found != PGBOSS_VERSION:
        raise NodeError(f"npm ci installed pg-boss {found}, expected {PGBOSS_VERSION}")


def installed_pgboss46_version() -> str | None:
    """The pg-boss version in ``tests/interop46/node_modules`` (``None`` if absent)."""
    package = INTEROP46_DIR / "node_modules" / "pg-boss" / "package.json"
    if not package.exists() or not NODE46_BINARY.exists():
        return None
    return str(json.loads(package.read_text())["version"])


def ensure_node46_modules() -> None:
    """Install pg-boss 12.38.0 and Node 22 with ``npm ci`` unless they are there already."""
    npm_ci(INTEROP46_DIR, lambda: installed_pgboss46_version() == PGBOSS46_VERSION, timeout=600)
    found = installed_pgboss46_version()
    if found != PGBOSS46_VERSION:
        raise NodeError(f"npm ci installed pg-boss {found}, expected {PGBOSS46_VERSION}")


def run_node46(*args: str, timeout: float = 120) -> str:
    """Run ``node`` 22 with ``args`` in ``tests/interop46``; return its standard output.

    :raises NodeError: if it exits with a non-zero status.
    """
    done = subprocess.run(
        [str(NODE46_BINARY), *args],
        cwd=INTEROP46_DIR,
        env={**os.environ, "TZ": "UTC"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise NodeError(
            f"node {' '.join(args[:2])} exited with {done.returncode}: "
            f"{(done.stderr or done.stdout)[-4000:]}"
        )
    return done.stdout


def pgboss46_migrate(connection_string: str, schema: str, timeout: float = 300) -> str:
    """Migrate ``schema`` with pg-boss 12.38.0's ``pg-boss migrate`` command line.

    It runs pg-boss's own migrations to 46 and then, one at a time, the index builds a
    started instance would leave to its background runner (CONCURRENTLY, on
    ``job_common`` and every partition); it enqueues nothing. Returns its output.
    """
    return run_node46(
        str(PGBOSS46_CLI),
        "migrate",
        "--connection-string",
        connection_string,
        "--schema",
        schema,
        timeout=timeout,
    )


def run_script(script: str, *args: str, timeout: float = 60) -> str:
    """Run ``node tests/interop/<script> ARGS...`` and return its standard output.

    :raises NodeError: if the script exits with a non-zero status.
    """
    done = subprocess.run(
        ["node", str(INTEROP_DIR / script), *args],
        cwd=INTEROP_DIR,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise NodeError(f"{script} exited with {done.returncode}: {done.stderr[-4000:]}")
    return done.stdout


NODE_OPTION_NAMES = {
    "priority": "priority",
    "start_after": "startAfter",
    "singleton_key": "singletonKey",
    "singleton_seconds": "singletonSeconds",
    "expire_seconds": "expireInSeconds",
    "retention_seconds": "retentionSeconds",
    "deletion_seconds": "deleteAfterSeconds",
    "retry_limit": "retryLimit",
    "retry_delay": "retryDelay",
    "retry_backoff": "retryBackoff",
    "retry_delay_max": "retryDelayMax",
}
"""Our send option names and Node pg-boss's, for the same job."""


def to_node_options(options: dict[str, Any]) -> dict[str, Any]:
    """Our send options under Node's names."""
    return {NODE_OPTION_NAMES[k]: v for k, v in options.items()}


def wait_until(predicate: Callable[[], bool], timeout: float = 10, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; return the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


def iso(value: dt.datetime) -> dict[str, str]:
    """A Python datetime as an argument Node turns into a ``Date``."""
    return {"$date": value.isoformat()}


def parse_time(value: str | None) -> dt.datetime | None:
    """A timestamp as Node's JSON prints it (ISO-8601, ``Z``)."""
    if value is None:
        return None
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def node_schema(schema: str) -> str:
    """``schema`` as a Node pg-boss configuration names it: a lower-case word as it is,
    any other name in double quotes (unless it is given in them already)."""
    if re.fullmatch(r"[a-z_][a-z0-9_]*", schema) or schema.startswith('"'):
        return schema
    return f'"{schema}"'


class NodeBoss:
    """One Node pg-boss instance in a child process.

    >>> boss = NodeBoss(url, "pgboss", supervise=False)       # doctest: +SKIP
    >>> boss.call("send", "emails", {"to": "a@example.com"})  # doctest: +SKIP
    '6f1c...'
    """

    def __init__(
        self, connection_string: str, schema: str, *, start: bool = True, **options: Any
    ) -> None:
        config = {
            "connectionString": connection_string,
            # A name that needs quotes goes to pg-boss (12.27+) in them, as its users write it.
            "schema": node_schema(schema),
            "options": options,
            "start": start,
        }
        self.schema = schema
        self.events: list[dict[str, Any]] = []
        self._replies: dict[int, queue.Queue[dict[str, Any]]] = {}
        self._next_id = 0
        self._lock = threading.Lock()
        self._ready: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stderr: list[str] = []
        self._proc = _take_spare(type(self))
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(config) + "\n")
        self._proc.stdin.flush()
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=self._read_stderr, daemon=True).start()
        try:
            first = self._ready.get(timeout=30)
        except queue.Empty:
            self.kill()
            raise NodeError(f"pg-boss did not start in 30 s: {self.stderr}") from None
        if "fatal" in first:
            self._proc.wait(timeout=10)
            raise NodeError(first["fatal"])

    @classmethod
    def command(cls) -> list[str]:
        """The process to start; ``-``, its last argument, has it read its config from stdin."""
        return ["node", str(RPC_SCRIPT), "-"]

    @classmethod
    def cwd(cls) -> Path:
        """Where the process runs (its ``node_modules``)."""
        return INTEROP_DIR

    @classmethod
    def spawn(cls) -> subprocess.Popen[str]:
        """A process that loads pg-boss, then waits for its config on stdin."""
        return subprocess.Popen(
            cls.command(),
            cwd=cls.cwd(),
            # Node's pg driver reads `timestamp without time zone` (singleton_on) as
            # local time; UTC makes it print the stored value.
            env={**os.environ, "TZ": "UTC"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )

    # ------------------------------------------------------------ plumbing

    def _read_stdout(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                message = json.loads(line)
            except ValueError:
                self._stderr.append(line)
                continue
            if "ready" in message or "fatal" in message:
                self._ready.put(message)
            elif "event" in message:
                with self._lock:
                    self.events.append(message)
            elif "id" in message:
                with self._lock:
                    box = self._replies.get(message["id"])
                if box is not None:
                    box.put(message)
        self._ready.put({"fatal": f"node exited: {self.stderr}"})
        with self._lock:
            boxes = list(self._replies.values())
        for box in boxes:
            box.put({"error": f"node exited: {self.stderr}"})

    def _read_stderr(self) -> None:
        assert self._proc.stderr is not None
        for line in self._proc.stderr:
            self._stderr.append(line)

    @property
    def stderr(self) -> str:
        return "".join(self._stderr)[-4000:]

    # ------------------------------------------------------------ calls

    def call(self, method: str, *args: Any, timeout: float = 30) -> Any:
        """Call ``boss.<method>(*args)`` in Node and return its JSON result.

        :raises NodeError: with Node's message if the call threw.
        """
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        with self._lock:
            self._next_id += 1
            request_id = self._next_id
            self._replies[request_id] = box
        assert self._proc.stdin is not None
        if self._proc.poll() is not None:
            raise NodeError(f"node is not running: {self.stderr}")
        line = json.dumps({"id": request_id, "method": method, "args": list(args)}, default=str)
        self._proc.stdin.write(line + "\n")
        self._proc.stdin.flush()
        try:
            reply = box.get(timeout=timeout)
        except queue.Empty:
            raise NodeError(f"{method} did not answer in {timeout} s: {self.stderr}") from None
        finally:
            with self._lock:
                self._replies.pop(request_id, None)
        if "error" in reply:
            raise NodeError(reply["error"])
        return reply.get("result")

    def errors(self) -> list[dict[str, Any]]:
        """``error`` events emitted so far."""
        return self.events_of("error")

    def clear_events(self) -> None:
        """Forget the events seen so far (a process shared by several tests)."""
        with self._lock:
            self.events.clear()

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["event"] == kind]

    def wait_for(
        self, predicate: Callable[[], bool], timeout: float = 10, interval: float = 0.05
    ) -> bool:
        """Poll ``predicate`` until it holds or ``timeout`` passes; return the last answer."""
        return wait_until(predicate, timeout, interval)

    # ------------------------------------------------------------ shutdown

    def close(self, timeout: float = 15) -> int:
        """Stop pg-boss gracefully (closing stdin) and wait for the process to end."""
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self._proc.returncode

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def __enter__(self) -> NodeBoss:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NodeBoss46(NodeBoss):
    """One Node pg-boss 12.38.0 instance (schema 46), run by Node 22 from ``tests/interop46``.

    Same protocol as :class:`NodeBoss`; any ``PgBoss`` method can be called by name
    (``getBamStatus``, ``detectSchemaDrift``, ...).
    """

    @classmethod
    def command(cls) -> list[str]:
        return [str(NODE46_BINARY), str(BOSS46_SCRIPT), "rpc", "-"]

    @classmethod
    def cwd(cls) -> Path:
        return INTEROP46_DIR


_spares: dict[type[NodeBoss], subprocess.Popen[str]] = {}
"""One Node process per kind, started ahead of need: Node's start and pg-boss's load (about
half a second) happen while the previous test runs, not in the next one's time."""


def _take_spare(kind: type[NodeBoss]) -> subprocess.Popen[str]:
    """The waiting process of ``kind`` (or a new one), and a new spare in its place."""
    proc = _spares.pop(kind, None)
    if proc is None or proc.poll() is not None:
        proc = kind.spawn()
    _spares[kind] = kind.spawn()
    return proc


@atexit.register
def _stop_spares() -> None:
    for proc in _spares.values():
        proc.kill()
        proc.wait(timeout=10)
    _spares.clear()


NodeFactory = Callable[..., NodeBoss]


def in_tx(engine: Engine, schema: str, fn: Callable[[QueueService], Any]) -> Any:
    """Run ``fn(service)`` in its own committed transaction (the Python side)."""
    with Session(engine) as session, session.begin():
        return fn(QueueService(session, schema=schema))


def function_bodies(engine: Engine, schema: str) -> list[tuple[str, str, str]]:
    """Name, arguments and a hash of the body of every function in ``schema``.

    The shared catalog snapshot (``support.catalog``) leaves bodies out on purpose;
    here they matter, to show that a Node start-up replaced no function.
    """
    sql = text(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid), md5(p.prosrc) "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = :s ORDER BY 1, 2"
    )
    with engine.connect() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(sql, {"s": schema})]


def schema_version(engine: Engine, schema: str) -> list[int]:
    """The rows of ``<schema>.version`` (pg-boss keeps exactly one)."""
    with engine.connect() as conn:
        return list(conn.execute(text(f'SELECT version FROM "{schema}".version')).scalars())


@pytest.fixture(scope="session")
def node_modules() -> None:
    """Node and the pinned pg-boss, installed if needed (skip without Node unless CI)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        unavailable(f"interop tests need Node.js: {' and '.join(missing)} not found on PATH")
    ensure_node_modules()


@pytest.fixture(scope="session")
def node46_modules() -> None:
    """Node 22 and pg-boss 12.38.0, installed with npm if needed.

    Skips when npm is absent (and nothing is installed yet), unless ``CI=true``: then it fails.
    """
    if installed_pgboss46_version() != PGBOSS46_VERSION and shutil.which("npm") is None:
        unavailable("schema-46 interop tests need npm to install pg-boss 12.38.0 and Node 22")
    ensure_node46_modules()


@pytest.fixture
def node46(node46_modules: None, node_url: str) -> Iterator[Callable[..., NodeBoss46]]:
    """Start Node pg-boss 12.38.0 instances: ``node46(schema, **constructor_options)``.

    Unless given, ``supervise`` and ``schedule`` are off. All are stopped after the test.
    """
    started: list[NodeBoss46] = []

    def start(schema: str, **options: Any) -> NodeBoss46:
        options.setdefault("supervise", False)
        options.setdefault("schedule", False)
        boss = NodeBoss46(node_url, schema, **options)
        started.append(boss)
        return boss

    yield start
    for boss in started:
        boss.close()


PY_APP = "alkstore-interop"
"""application_name of the ``py_engine`` connections (Node's is ``pgboss``)."""


@pytest.fixture
def py_engine(database_url: str) -> Iterator[Engine]:
    """An engine for the Python side whose sessions tell themselves apart from Node's
    in ``pg_stat_activity`` and ``current_setting('application_name')``."""
    eng = create_engine(database_url, connect_args={"application_name": PY_APP})
    yield eng
    eng.dispose()


@pytest.fixture
def node_url(database_url: str) -> str:
    """The connection string Node pg-boss uses for the test database."""
    return node_connection_string(database_url)


@pytest.fixture
def node(node_modules: None, node_url: str) -> Iterator[NodeFactory]:
    """Start Node pg-boss instances: ``node(schema, **constructor_options)``.

    Unless given, ``supervise`` and ``schedule`` are off, so a test only gets the
    background work it asks for. All instances are stopped after the test.
    """
    started: list[NodeBoss] = []

    def start(schema: str, **options: Any) -> NodeBoss:
        options.setdefault("supervise", False)
        options.setdefault("schedule", False)
        boss = NodeBoss(node_url, schema, **options)
        started.append(boss)
        return boss

    yield start
    for boss in started:
        boss.close()
