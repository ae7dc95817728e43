"""Vacuuming the system catalog while the tests run.

Every test creates and drops a schema of its own: tens of tables, partitions, indexes and
functions each, thousands of times in a run. Each drop leaves dead rows in ``pg_attribute``,
``pg_class``, ``pg_depend``..., and a server without autovacuum (or one whose autovacuum
falls behind) keeps them: on a server that had run the suite a few times, reading one
schema's catalog took 1.5 s instead of 0.08 s, and every migration and catalog comparison
slowed down with it. So the session vacuums the
catalog tables itself, now and then, in the background. ``VACUUM`` (not ``FULL``) does not
block the DDL of the tests; a role that may not vacuum a catalog table gets a warning from
PostgreSQL and nothing else.
"""

from __future__ import annotations

import contextlib
import threading
import zlib

import psycopg

from .schemas import libpq_url

CATALOG_TABLES = (
    "pg_attribute",
    "pg_class",
    "pg_depend",
    "pg_type",
    "pg_constraint",
    "pg_index",
    "pg_attrdef",
    "pg_inherits",
    "pg_proc",
    "pg_trigger",
    "pg_namespace",
    "pg_sequence",
    "pg_statistic",
    "pg_description",
    "pg_rewrite",
    "pg_partitioned_table",
)
"""The tables a schema's creation and drop write to."""

INTERVAL = 20.0
"""Seconds between two passes."""

_LOCK_KEY = zlib.crc32(b"alkstore-tests-catalog-vacuum")
"""Advisory lock taken for a pass: with several test workers, one vacuums at a time and
the others skip their turn."""


class CatalogVacuum:
    """Vacuum the catalog tables every :data:`INTERVAL` seconds until :meth:`stop`."""

    def __init__(self, database_url: str) -> None:
        self._conninfo = libpq_url(database_url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="catalog-vacuum", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while True:
            # A server that went away or refused: the tests will say so themselves.
            with contextlib.suppress(psycopg.Error):
                self.vacuum_once()
            if self._stop.wait(INTERVAL):
                return

    def vacuum_once(self) -> bool:
        """One pass, unless another session holds the turn; whether it ran."""
        with psycopg.connect(
            self._conninfo, autocommit=True, application_name="alkstore-tests-vacuum"
        ) as conn:
            taken = conn.execute("SELECT pg_try_advisory_lock(%s)", (_LOCK_KEY,)).fetchone()
            if not (taken and taken[0]):
                return False
            tables = ", ".join(f"pg_catalog.{name}" for name in CATALOG_TABLES)
            conn.execute(f"VACUUM {tables}".encode())
            conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))
            return True
