"""A PgBouncer in front of the test database, one per test session and pool mode.

Started from a generated ini (``auth_type = any``: the test database trusts local
connections) on a free port, as the ``postgres`` user when the tests run as root
(PgBouncer refuses to run as root). Skips when ``pgbouncer`` is not installed, unless
under CI, which installs it (``.ci/run``): then the test fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

from .skips import unavailable


def _binary() -> str:
    found = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if found is None:
        unavailable("pgbouncer is not installed")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def pgbouncer(database_url: str, pool_mode: str) -> Iterator[str]:
    """A running PgBouncer in ``pool_mode`` for ``database_url``'s database; yields
    the URL of the same database through it."""
    binary = _binary()
    url = make_url(database_url)
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="alkstore-pgbouncer-") as directory:
        os.chmod(directory, 0o777)
        ini = Path(directory, "pgbouncer.ini")
        ini.write_text(
            "[databases]\n"
            f"{url.database} = host={url.host or '127.0.0.1'} port={url.port or 5432}"
            f" dbname={url.database} user={url.username or 'postgres'}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {port}\n"
            f"unix_socket_dir =\n"
            "auth_type = any\n"
            f"pool_mode = {pool_mode}\n"
            "default_pool_size = 20\n"
            "max_client_conn = 500\n"
            "server_reset_query_always = 0\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {directory}/pgbouncer.log\n"
        )
        os.chmod(ini, 0o644)
        command = [binary, str(ini)]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "postgres"]
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 10
            while True:
                with (
                    contextlib.suppress(OSError),
                    socket.create_connection(("127.0.0.1", port), timeout=0.2),
                ):
                    break
                if process.poll() is not None or time.monotonic() > deadline:
                    stderr = process.stderr.read().decode() if process.stderr else ""
                    unavailable(f"pgbouncer did not start: {stderr.strip()}")
                time.sleep(0.05)
            user = url.username or "postgres"
            yield url.set(host="127.0.0.1", port=port, username=user).render_as_string(
                hide_password=False
            )
        finally:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
            if process.poll() is None:
                process.kill()
                process.wait()
