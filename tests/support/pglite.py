"""PGlite (PostgreSQL in WebAssembly) served over the wire protocol, for the pglite profile.

``tests/pglite`` is a small npm project pinning ``@electric-sql/pglite`` and
``@electric-sql/pglite-socket``, whose ``pglite-server`` command serves one in-memory PGlite
database on a TCP port. :func:`ensure_pglite_modules` installs it with ``npm ci`` when it
is missing (as ``support.node`` does for pg-boss); :func:`run_pglite_server` starts the
server on a free loopback port for as long as a ``with`` block lasts and gives its
SQLAlchemy URL.

PGlite serves **one connection at a time**: the server closes a second one while the first
is open. Engines on it are made by :func:`pglite_engine`, a pool of exactly one
connection, and an engine must be disposed before another client (Node pg-boss, say)
connects.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, create_engine, event

from .npm import npm_ci
from .skips import unavailable

PGLITE_DIR = Path(__file__).resolve().parents[1] / "pglite"
SERVER_SCRIPT = PGLITE_DIR / "node_modules" / "@electric-sql/pglite-socket/dist/scripts/server.js"
"""The ``pglite-server`` command of ``@electric-sql/pglite-socket`` (run with ``node``)."""
PINNED = {"@electric-sql/pglite": "0.5.15", "@electric-sql/pglite-socket": "0.2.18"}
"""The versions ``tests/pglite/package.json`` pins (``npm install --save-exact``)."""

HANDOVER_SECONDS = 0.2
"""How long to leave the server after a client closed its connection, before another client
(one that does not retry, as Node pg-boss's start does not) connects: the server may see the
new connection before the old one's close, and refuse it as a second (a millisecond has been
enough here; this leaves room for a loaded machine)."""


_LISTENING = re.compile(r"listening on (\{.*\})")


class PGliteError(RuntimeError):
    """The PGlite server could not be installed or did not start (the message says why)."""


def installed_versions() -> dict[str, str | None]:
    """The installed version of each pinned package (``None`` where it is missing)."""
    found: dict[str, str | None] = {}
    for name in PINNED:
        package = PGLITE_DIR / "node_modules" / name / "package.json"
        found[name] = str(json.loads(package.read_text())["version"]) if package.exists() else None
    return found


def ensure_pglite_modules() -> None:
    """Install the pinned packages with ``npm ci`` unless they are there already."""
    npm_ci(PGLITE_DIR, lambda: installed_versions() == PINNED, timeout=300)
    found = installed_versions()
    if found != PINNED:
        raise PGliteError(f"npm ci installed {found}, expected {PINNED}")


@contextlib.contextmanager
def run_pglite_server(timeout: float = 60) -> Iterator[str]:
    """Start ``pglite-server`` on a free loopback port (an in-memory database); yield the
    SQLAlchemy URL of its database once it accepts a connection; stop it afterwards."""
    node = shutil.which("node")
    if node is None:
        raise PGliteError("node is not on PATH")
    # --port 0: the operating system picks the port, and the server says which.
    proc = subprocess.Popen(
        [node, str(SERVER_SCRIPT), "--host", "127.0.0.1", "--port", "0"],
        cwd=PGLITE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    said: list[str] = []
    found: dict[str, Any] = {}
    listening = threading.Event()

    def read(stream: Any) -> None:
        for line in stream:
            said.append(line.rstrip())
            match = _LISTENING.search(line)
            if match and not found:
                found.update(json.loads(match[1]))
                listening.set()
        listening.set()  # the server exited

    reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
    reader.start()
    try:
        if not listening.wait(timeout) or not found:
            raise PGliteError("pglite-server did not start: " + "\n".join(said[-20:]))
        url = f"postgresql+psycopg://postgres@127.0.0.1:{found['port']}/postgres"
        libpq = f"postgresql://postgres@127.0.0.1:{found['port']}/postgres"
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(libpq, connect_timeout=5) as conn:
                    conn.execute("SELECT 1")
                break
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise PGliteError(
                        "pglite-server accepts no connection: " + "\n".join(said[-20:])
                    ) from None
                time.sleep(0.1)
        time.sleep(HANDOVER_SECONDS)  # the probe's connection is closed before the first client's
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        reader.join(timeout=5)


def pglite_engine(url: str, retry_seconds: float = 10) -> Engine:
    """An engine of exactly one connection (PGlite's limit), the pool's only one.

    A connection the server refuses is tried again for up to ``retry_seconds``: right after
    another client closed its connection, the server may still count that one
    (:data:`HANDOVER_SECONDS`).
    """
    engine = create_engine(url, pool_size=1, max_overflow=0, pool_timeout=60)

    @event.listens_for(engine, "do_connect")
    def connect_again_if_refused(
        dialect: Any, record: Any, cargs: tuple[Any, ...], cparams: dict[str, Any]
    ) -> Any:
        deadline = time.monotonic() + retry_seconds
        while True:
            try:
                return dialect.connect(*cargs, **cparams)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    return engine


def node_url(url: str) -> str:
    """``url`` as a libpq connection string (for Node's ``pg``)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def pglite_modules() -> None:
    """The pinned PGlite packages, installed if needed (skip without Node unless CI)."""
    missing = [tool for tool in ("node", "npm") if shutil.which(tool) is None]
    if missing:
        unavailable(f"the PGlite tests need Node.js: {' and '.join(missing)} not found on PATH")
    ensure_pglite_modules()


@pytest.fixture(scope="session")
def pglite_url(pglite_modules: None) -> Iterator[str]:
    """The SQLAlchemy URL of a PGlite server started for the session (one connection at a
    time: use :func:`pglite_engine`)."""
    with run_pglite_server() as url:
        yield url
