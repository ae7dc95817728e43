"""Engines whose connections go through a connection pooler (PgBouncer, or another).

A pooler in transaction mode hands each transaction to whichever server connection is
free, so what a server session keeps between transactions is lost: psycopg's
server-side prepared statements first of all (``prepared statement "_pg3_0" does not
exist``). The "Behind PgBouncer" page explains.

The first time a connection of an engine the library works with is checked out, it is
asked which server process it talks to. A pooler answers the client with a backend id of
its own making, so the id psycopg received when it connected differs from the server's
``pg_backend_pid()``; directly connected, they are the same. On a pooled connection
whose ``prepare_threshold`` is psycopg's default, the library turns server-side
prepared statements off (one line at INFO per engine says so). A threshold the
application set itself (PgBouncer 1.21 and later can keep prepared statements, with
``max_prepared_statements``) is left alone.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.pool import Pool

from .errors import PooledConnectionError

log = logging.getLogger("alkstore_sa")

PSYCOPG_DEFAULT_THRESHOLD = 5
"""psycopg's own ``prepare_threshold``: a value other than this one was chosen by the
application and is kept."""

_PROBED = "alkstore_pooled"
"""Key in a pool record's ``info``: whether its connection goes through a pooler."""

_watched: weakref.WeakSet[Pool] = weakref.WeakSet()
_lock = threading.Lock()


def watch(engine: Engine) -> None:
    """Look at each connection of ``engine``'s pool once, at its first checkout
    (the module's docstring says what for). Idempotent."""
    pool = engine.pool
    with _lock:
        if pool in _watched:
            return
        _watched.add(pool)
    told = threading.Event()  # the INFO line, once per pool

    def checked_out(dbapi_connection: Any, record: Any, proxy: Any) -> None:
        _checked_out(dbapi_connection, record, told)

    event.listen(pool, "checkout", checked_out)


def is_pooled(dbapi_connection: Any) -> bool | None:
    """Whether ``dbapi_connection`` (psycopg's, or SQLAlchemy's adapter of an async one)
    reaches the server through a pooler; ``None`` when it cannot tell (another driver)."""
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    info = getattr(driver, "info", None)
    told = getattr(info, "backend_pid", None)
    if not isinstance(told, int):
        return None
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT pg_backend_pid()")
        row = cursor.fetchone()
    finally:
        cursor.close()
    # Not a transaction left open: under transaction pooling that would pin the server
    # connection to this client until the application's first commit.
    dbapi_connection.rollback()
    return row is not None and row[0] != told


def refuse_pooled(conn: Connection, schema: str) -> None:
    """Raise :class:`~alkstore_sa.PooledConnectionError` when ``conn`` reaches the server
    through a pooler: a schema upgrade's session advisory lock taken on it could outlive
    the upgrade on a server connection the pooler lends to others."""
    if is_pooled(conn.connection.dbapi_connection):
        raise PooledConnectionError(schema)


def _checked_out(dbapi_connection: Any, record: Any, told: threading.Event) -> None:
    if _PROBED in record.info:
        return
    try:
        pooled = is_pooled(dbapi_connection)
    except Exception:  # the application's own checkout will meet the same problem
        log.debug("could not ask a connection for its server process", exc_info=True)
        pooled = None
    record.info[_PROBED] = pooled
    if not pooled:
        return
    driver = getattr(dbapi_connection, "driver_connection", dbapi_connection)
    if getattr(driver, "prepare_threshold", None) != PSYCOPG_DEFAULT_THRESHOLD:
        return
    driver.prepare_threshold = None
    with _lock:
        first = not told.is_set()
        told.set()
    if first:
        log.info(
            "this engine's connections go through a connection pooler (PgBouncer or "
            "another): server-side prepared statements are off on them, as a pooler in "
            "transaction mode cannot keep them (the 'Behind PgBouncer' page)",
            extra={"action": "pooler_detected"},
        )
