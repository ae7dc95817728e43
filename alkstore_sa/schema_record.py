"""What a schema records about its version, and the lock that changes it.

The pieces :mod:`alkstore_sa.migrate` and :mod:`alkstore_sa.schema_health` both stand
on (each imports this module, neither imports the other):

- the pg-boss schema versions we install (:data:`SCHEMA_VERSIONS`) and our revision
  for each;
- reading a schema's pg-boss version row (:func:`installed_version`) and our recorded
  Alembic revision (:func:`recorded_revision`, :func:`recorded_version`);
- pg-boss's migration advisory lock (:func:`migration_lock`), held by every upgrade,
  downgrade and heal.

:mod:`alkstore_sa.migrate` offers the version facts and readers under its own name too.
(The versions the runtime speaks are :mod:`alkstore_sa.schema_versions`'s.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, text

from ._pooler import refuse_pooled
from .errors import InvalidOptionsError, shown
from .migrations import VERSION_TABLE
from .names import DEFAULT_SCHEMA, validate_schema
from .ops import driver, read_version

# The lock's messages keep the logger they have always been logged under.
log = logging.getLogger("alkstore_sa.schema_health")


@dataclass(frozen=True)
class SchemaVersionInfo:
    """One pg-boss schema version: our revision for it and the Node releases that speak it."""

    version: int
    """The number pg-boss keeps in ``<schema>.version``."""
    revision: str
    """Our Alembic revision id that leaves the schema at this version."""
    introduced_in: str
    """The pg-boss release whose migration creates this version."""
    node_releases: str
    """The Node pg-boss releases published on npm that run at this version."""

    def describe(self) -> str:
        """``schema 26 (Node pg-boss 11.1.1 to 11.1.2 and 12.0.0 to 12.5.4)``."""
        return f"schema {self.version} ({self.node_releases})"


def _revision(version: int) -> str:
    return "alkstore_0001" if version == 26 else f"alkstore_{version:04d}"


# Facts from pg-boss itself: the `release` and `version` fields of every migration in
# pg-boss 12.38.0's dist/migrationStore.js (the release that introduced each version),
# and the list of versions published on npm (`npm view pg-boss versions`), each placed
# at the version its package declares (package.json "pgboss": {"schema": N}). Some
# releases that introduced a version were tagged but never published on npm
# (11.1.0, 12.6.0, 12.7.0, 12.10.0, 12.11.0, 12.19.0, 12.36.0, 12.37.0); releases in
# between that change no schema stay at the version before them.
_RELEASES: tuple[tuple[int, str, str], ...] = (
    (26, "11.1.0", "Node pg-boss 11.1.1 to 11.1.2 and 12.0.0 to 12.5.4"),
    (27, "12.6.0", "Node pg-boss 12.8.0 to 12.9.0"),
    (28, "12.10.0", "no npm release; newer Node pg-boss migrates through it"),
    (29, "12.11.0", "Node pg-boss 12.11.1 to 12.11.2"),
    (30, "12.12.0", "Node pg-boss 12.12.0 to 12.18.3"),
    (31, "12.19.0", "Node pg-boss 12.19.1 to 12.20.0"),
    (32, "12.21.0", "Node pg-boss 12.21.0 to 12.21.1"),
    (33, "12.22.0", "Node pg-boss 12.22.0"),
    (34, "12.23.0", "Node pg-boss 12.23.0 to 12.23.1"),
    (35, "12.24.0", "Node pg-boss 12.24.0"),
    (36, "12.24.1", "Node pg-boss 12.24.1 to 12.25.1"),
    (37, "12.26.0", "Node pg-boss 12.26.0 to 12.27.0"),
    (38, "12.28.0", "Node pg-boss 12.28.0 to 12.28.1"),
    (39, "12.29.0", "Node pg-boss 12.29.0"),
    (40, "12.30.0", "Node pg-boss 12.30.0"),
    (41, "12.31.0", "Node pg-boss 12.31.0 to 12.32.0"),
    (42, "12.33.0", "Node pg-boss 12.33.0 to 12.34.0"),
    (43, "12.35.0", "Node pg-boss 12.35.0"),
    (44, "12.36.0", "no npm release; Node pg-boss 12.38.0 migrates through it"),
    (45, "12.37.0", "no npm release; Node pg-boss 12.38.0 migrates through it"),
    (46, "12.38.0", "Node pg-boss 12.38.0"),
)

SCHEMA_VERSIONS: Mapping[int, SchemaVersionInfo] = {
    version: SchemaVersionInfo(version, _revision(version), introduced, releases)
    for version, introduced, releases in _RELEASES
}
"""Every pg-boss schema version we can install, oldest first."""

OLDEST_SCHEMA_VERSION = min(SCHEMA_VERSIONS)
NEWEST_SCHEMA_VERSION = max(SCHEMA_VERSIONS)

_BY_REVISION = {info.revision: info for info in SCHEMA_VERSIONS.values()}


def schema_version_info(version: int) -> SchemaVersionInfo:
    """What we know about pg-boss schema ``version``.

    :raises InvalidOptionsError: if it is not a version we can install (before any SQL).
    """
    if isinstance(version, bool) or not isinstance(version, int):
        raise InvalidOptionsError("schema_version", f"expected an integer, got {shown(version)}")
    info = SCHEMA_VERSIONS.get(version)
    if info is None:
        raise InvalidOptionsError(
            "schema_version",
            f"{version} is not a pg-boss schema version alkstore_sa can install "
            f"(it knows {OLDEST_SCHEMA_VERSION} to {NEWEST_SCHEMA_VERSION})",
        )
    return info


def revision_for(version: int) -> str:
    """Our revision id for pg-boss schema ``version`` (``26`` → ``"alkstore_0001"``)."""
    return schema_version_info(version).revision


def version_of(revision: str | None) -> int | None:
    """The pg-boss schema version our ``revision`` leaves behind (``None`` if unknown)."""
    if revision is None:
        return None
    info = _BY_REVISION.get(revision)
    return None if info is None else info.version


def recorded_revision(conn: Connection, schema: str) -> str | None:
    """Our Alembic revision recorded in ``schema`` (``None``: none recorded)."""
    ctx = MigrationContext.configure(
        conn, opts={"version_table": VERSION_TABLE, "version_table_schema": schema}
    )
    return ctx.get_current_revision()


def recorded_version(conn: Connection, schema: str) -> int | None:
    """The pg-boss schema version our recorded revision leaves behind (``None``: no
    revision table, no revision recorded, or one we do not know)."""
    exists = conn.execute(
        text("SELECT to_regclass(quote_ident(:s) || '.' || quote_ident(:t)) IS NOT NULL"),
        {"s": schema, "t": VERSION_TABLE},
    ).scalar_one()
    if not exists:
        return None
    return version_of(recorded_revision(conn, schema))


def installed_version(conn: Connection, schema: str = DEFAULT_SCHEMA) -> int | None:
    """The pg-boss schema version found in ``schema``: ``None`` if not installed,
    :data:`~alkstore_sa.schema_versions.NO_VERSION_ROW` for a version table without a
    row (through :func:`alkstore_sa.ops.read_version`, the one reader of the row).

    Like Node pg-boss, only the existence of ``<schema>.version`` and its row are
    inspected.
    """
    schema = validate_schema(schema)
    return driver.run(
        conn, read_version(schema), {"schema_translate_map": {DEFAULT_SCHEMA: schema}}
    )


def lock_key_sql(schema: str) -> str:
    """The SQL expression of pg-boss's migration advisory key for ``schema``: the one our
    revisions take (:func:`alkstore_sa.migrations.helpers.lock_key_sql`)."""
    from .migrations.helpers import lock_key_sql as revisions_key

    return revisions_key(schema)


LOCK_POLL_SECONDS = 0.1
"""How often a waiting upgrade tries pg-boss's migration lock again."""


@contextmanager
def migration_lock(conn: Connection, schema: str, *, own: bool = True) -> Iterator[None]:
    """Hold pg-boss's migration advisory lock on ``conn``'s session meanwhile.

    The same key Node pg-boss's ``start()`` and ``pg-boss migrate`` take (and our
    revisions, :func:`alkstore_sa.migrations.helpers.migration_lock`), so two upgrades,
    or an upgrade and a Node ``start()``, run one after the other.

    With ``own`` (a connection this library opened) the lock is a session lock, waited
    for by retrying ``pg_try_advisory_lock`` outside any transaction: a waiter holds no
    snapshot, so the holder's ``CREATE INDEX CONCURRENTLY`` never waits for it (which
    would deadlock). A transaction still open at the end is committed, or rolled back on
    an exception, before the lock is released. Without ``own`` (the caller's connection)
    the lock is a transaction lock, released when the caller's transaction ends.

    :raises PooledConnectionError: with ``own``, when ``conn`` goes through a connection
        pooler, before the lock is taken.
    """
    key = lock_key_sql(schema)
    if not own:
        conn.execute(text(f"SELECT pg_advisory_xact_lock({key})"))
        yield
        return
    if conn.in_transaction():
        conn.commit()
    refuse_pooled(conn, schema)
    with autocommit(conn):
        waited = False
        while not conn.execute(text(f"SELECT pg_try_advisory_lock({key})")).scalar_one():
            if not waited:
                waited = True
                log.info(
                    "schema %s: waiting for pg-boss's migration lock (another upgrade or a "
                    "Node pg-boss start() is migrating it)",
                    schema,
                    extra={"action": "migration_lock_wait", "schema": schema},
                )
            time.sleep(LOCK_POLL_SECONDS)
    try:
        yield
    except BaseException:
        if conn.in_transaction():
            conn.rollback()
        raise
    else:
        if conn.in_transaction():
            conn.commit()
    finally:
        try:
            if conn.in_transaction():
                conn.rollback()
            conn.execute(text(f"SELECT pg_advisory_unlock({key})"))
            conn.commit()
        except Exception:
            # The session is unusable: closing it is what releases the lock.
            conn.invalidate()
            raise


@contextmanager
def autocommit(conn: Connection) -> Iterator[None]:
    """``conn`` in autocommit meanwhile (``CONCURRENTLY`` refuses to run inside a
    transaction block); a transaction open at the end is committed."""
    conn.execution_options(isolation_level="AUTOCOMMIT")
    try:
        yield
    finally:
        if conn.in_transaction():
            conn.commit()
        conn.execution_options(isolation_level=conn.default_isolation_level)
