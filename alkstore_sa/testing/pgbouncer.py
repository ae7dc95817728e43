"""A PgBouncer in front of a test database, for tests that must hold behind one.

The "Behind PgBouncer" page says what changes there; this starts the real thing on a free
port for as long as a ``with`` block lasts::

    with run_pgbouncer(database_url, "transaction") as pooled_url:
        engine = create_engine(pooled_url)
        ...

It needs the ``pgbouncer`` program (Debian and Ubuntu: ``apt-get install pgbouncer``) and a
database that lets PgBouncer in without a password (``auth_type = any``: meant for a local
test server that trusts its clients, never for production).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import psycopg
from sqlalchemy.engine import make_url

from ..errors import InvalidOptionsError, shown

__all__ = [
    "POOL_MODES",
    "PgBouncerUnavailableError",
    "pgbouncer_program",
    "run_pgbouncer",
]

POOL_MODES = ("session", "transaction")
"""The ``pool_mode`` values :func:`run_pgbouncer` takes."""


class PgBouncerUnavailableError(RuntimeError):
    """PgBouncer is not installed, or did not start (the message says which, and why)."""


def pgbouncer_program() -> str:
    """The path of the ``pgbouncer`` program (on ``PATH``, or Debian's ``/usr/sbin``).

    :raises PgBouncerUnavailableError: when it is not installed.
    """
    found = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin")
    if found is None:
        raise PgBouncerUnavailableError("pgbouncer is not installed")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class _Upstream(NamedTuple):
    """Where the database is, as libpq resolved it: ``host`` is a socket's folder
    (``/run/postgresql``) or a host name or address."""

    host: str
    port: int
    dbname: str
    user: str


def _upstream(database_url: str) -> _Upstream:
    """Where ``database_url`` leads, asked of libpq itself by connecting once: TCP and
    Unix-socket URLs alike (``host`` in the authority or in the query, ``port`` likewise,
    or neither: ``PGHOST`` and the compiled-in socket folder), with the user and database
    libpq defaults to."""
    url = make_url(database_url).set(drivername="postgresql")
    with psycopg.connect(url.render_as_string(hide_password=False), connect_timeout=10) as conn:
        info = conn.info
        return _Upstream(info.host, info.port, info.dbname, info.user)


def _run_as(upstream: _Upstream) -> str:
    """Whom PgBouncer, which refuses root, runs as when we are root: the owner of the
    server's socket folder, who can reach the socket in it (an embedded server's data
    folder is its own user's alone), else ``postgres``."""
    if upstream.host.startswith("/"):
        with contextlib.suppress(OSError, KeyError):
            owner = pwd.getpwuid(os.stat(upstream.host).st_uid).pw_name
            if owner != "root":
                return owner
    return "postgres"


def _ini(upstream: _Upstream, pool_mode: str, port: int, directory: str) -> str:
    return (
        "[databases]\n"
        f"{upstream.dbname} = host={upstream.host} port={upstream.port}"
        f" dbname={upstream.dbname} user={upstream.user}\n"
        "[pgbouncer]\n"
        "listen_addr = 127.0.0.1\n"
        f"listen_port = {port}\n"
        "unix_socket_dir =\n"
        "auth_type = any\n"
        f"pool_mode = {pool_mode}\n"
        "default_pool_size = 20\n"
        "max_client_conn = 500\n"
        "server_reset_query_always = 0\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
        "log_connections = 0\n"
        "log_disconnections = 0\n"
        f"logfile = {directory}/pgbouncer.log\n"
    )


def _pooled_url(database_url: str, port: int, upstream: _Upstream) -> str:
    """``database_url`` pointed at a PgBouncer on ``127.0.0.1:port``: its driver and other
    query options kept, a socket folder or port given in its query dropped (they named the
    server, not the pooler), and the database and user libpq resolved made explicit."""
    url = make_url(database_url)
    query = {k: v for k, v in url.query.items() if k not in _WHERE_KEYS}
    through = url.set(
        host="127.0.0.1",
        port=port,
        database=upstream.dbname,
        username=url.username or upstream.user,
        query=query,
    )
    return through.render_as_string(hide_password=False)


_WHERE_KEYS = frozenset({"host", "hostaddr", "port"})
"""Query keys of a URL that say where the server is (libpq's names)."""


@contextlib.contextmanager
def run_pgbouncer(
    database_url: str, pool_mode: str = "transaction", *, start_timeout: float = 10.0
) -> Iterator[str]:
    """Run a PgBouncer in ``pool_mode`` (``"transaction"`` or ``"session"``) in front of
    ``database_url``'s database, on a free port of 127.0.0.1, until the block ends.

    ``database_url`` may name its server over TCP or a Unix socket (``?host=/run/postgresql``,
    or no host at all: libpq's default); PgBouncer reaches the server the same way. Yields
    the URL of the same database through it (PgBouncer's host and port,
    its driver kept). Run as root, PgBouncer (which refuses root) runs as the
    owner of the server's socket folder, or else as the ``postgres`` user.

    :raises InvalidOptionsError: for another ``pool_mode``, before anything is started.
    :raises PgBouncerUnavailableError: when PgBouncer is not installed or does not accept
        connections within ``start_timeout`` seconds (with what it said).
    """
    if pool_mode not in POOL_MODES:
        raise InvalidOptionsError(
            "pool_mode", f"expected 'transaction' or 'session', got {shown(pool_mode)}"
        )
    program = pgbouncer_program()
    upstream = _upstream(database_url)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="alkstore-pgbouncer-") as directory:
        os.chmod(directory, 0o777)  # PgBouncer, as postgres, writes its log here
        ini = Path(directory, "pgbouncer.ini")
        ini.write_text(_ini(upstream, pool_mode, port, directory))
        os.chmod(ini, 0o644)
        command = [program, str(ini)]
        if os.geteuid() == 0:
            command[1:1] = ["-u", _run_as(upstream)]
        # Its output goes to a file, never to a pipe: nobody reads a pipe meanwhile, and
        # once its buffer is full PgBouncer blocks writing a log line, and every client
        # with it.
        output = Path(directory, "pgbouncer.out")
        with output.open("wb") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=0.2),
                ):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    said = output.read_text(errors="replace").strip()
                    raise PgBouncerUnavailableError(f"pgbouncer did not start: {said}")
                time.sleep(0.05)
            yield _pooled_url(database_url, port, upstream)
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
            if process.poll() is None:
                process.kill()
                process.wait()
