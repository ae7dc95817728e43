"""Run the schema migrations from Python (what ``alkstore db ...`` calls).

>>> from alkstore_sa import migrate
>>> migrate.upgrade(engine, schema="pgboss")                     # doctest: +SKIP
>>> migrate.upgrade(engine, schema="pgboss", schema_version=26)  # doctest: +SKIP

Each pg-boss schema version is one revision of ours (:data:`SCHEMA_VERSIONS`):
version 26 is ``alkstore_0001`` and version N after it is ``alkstore_00NN``. Without
``schema_version`` (or ``revision``), :func:`upgrade` goes to
:data:`DEFAULT_SCHEMA_VERSION` (46, the newest version the runtime speaks;
the "Compatibility with pg-boss, and deliberate differences" page).

Every function takes an :class:`~sqlalchemy.engine.Engine`, a
:class:`~sqlalchemy.engine.Connection` or a database URL.

:func:`upgrade`, :func:`downgrade` and :func:`offline_sql` run only alkstore_sa's
own revisions: a file of anybody else's in the package's ``versions`` folder raises
:class:`~alkstore_sa.errors.ForeignRevisionError` before anything is connected or run.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import (
    Column,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    inspect,
    make_url,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import DropSchema

from . import names, schema_health
from .backends import Backend
from .backends import resolve as resolve_backend
from .errors import (
    InvalidOptionsError,
    SchemaCatalogError,
    SchemaNotInstalledError,
    SchemaProfileError,
    SchemaVersionError,
    UnfinishedIndexBuildError,
    shown,
)
from .migrations import (
    SCHEMA_OPTION,
    VERSION_TABLE,
    attempts,
    profiles,
    refuse_foreign_revisions,
)
from .names import DEFAULT_SCHEMA, SCHEMA_VERSION, validate_schema
from .schema_record import (
    NEWEST_SCHEMA_VERSION,
    OLDEST_SCHEMA_VERSION,
    SCHEMA_VERSIONS,
    SchemaVersionInfo,
    installed_version,
    migration_lock,
    recorded_revision,
    revision_for,
    schema_version_info,
    version_of,
)
from .schema_versions import NEWEST_KNOWN_SCHEMA_VERSION, NO_VERSION_ROW

__all__ = [
    "BASE",
    "DEFAULT_SCHEMA_VERSION",
    "FEW_JOBS",
    "HEAD",
    "NEWEST_SCHEMA_VERSION",
    "OLDEST_SCHEMA_VERSION",
    "SCHEMA_VERSIONS",
    "VERSION_LOCATION",
    "Bind",
    "SchemaVersionInfo",
    "UpgradeResult",
    "alembic_config",
    "check",
    "check_health",
    "current",
    "current_version",
    "downgrade",
    "install_attempt_history",
    "installed_version",
    "normalise_url",
    "offline_sql",
    "revision_for",
    "schema_version_info",
    "upgrade",
    "version_of",
]

log = logging.getLogger(__name__)

HEAD = "alkstore@head"
"""Our newest revision (the newest pg-boss schema version we can install)."""
BASE = "alkstore@base"
"""Before our first revision: nothing of ours installed."""


DEFAULT_SCHEMA_VERSION = NEWEST_KNOWN_SCHEMA_VERSION
"""What :func:`upgrade` and ``alkstore db upgrade`` install when not told: 46, the newest
version the services and workers speak; ``schema_version=26`` keeps a schema next to Node
pg-boss 11.1.x to 12.5.x (the "Compatibility with pg-boss, and deliberate differences" page)."""

Bind = Engine | Connection | str

VERSION_LOCATION = "alkstore_sa:migrations/versions"
"""Where the standalone environment finds the revisions (a package resource): every
schema version from 26 to 46, the same folder an application's Alembic environment lists."""


def alembic_config(schema: str = DEFAULT_SCHEMA, url: str | None = None) -> Config:
    """An Alembic :class:`~alembic.config.Config` for the standalone environment."""
    cfg = Config()
    cfg.set_main_option("script_location", "alkstore_sa:migrations")
    # "os" would split on ":" on POSIX, and the package location contains one.
    cfg.set_main_option("path_separator", "space")
    cfg.set_main_option("version_locations", VERSION_LOCATION)
    cfg.attributes[SCHEMA_OPTION] = validate_schema(schema)
    if url:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def normalise_url(url: str) -> str:
    """Pick the psycopg 3 driver for plain ``postgresql://`` (libpq-style) URLs."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def _checked_config(schema: str, url: str | None = None, target: str | None = None) -> Config:
    # Refused here, before a connection is opened; env.py checks again for
    # callers of the Alembic commands.
    cfg = alembic_config(schema, url)
    script = ScriptDirectory.from_config(cfg)
    refuse_foreign_revisions(script.version_locations or ())
    if target is not None and version_of(target) is not None:
        try:
            script.get_revision(target)
        except CommandError:
            raise InvalidOptionsError(
                "schema_version",
                f"{version_of(target)}: this installation of alkstore_sa has no revision {target}",
            ) from None
    return cfg


def _target(revision: str | None, schema_version: int | None, default: str) -> str:
    if schema_version is not None:
        if revision is not None:
            raise InvalidOptionsError(
                "schema_version", "give either a revision or a schema version, not both"
            )
        return revision_for(schema_version)
    return default if revision is None else revision


@contextmanager
def _connection(bind: Bind) -> Iterator[Connection]:
    if isinstance(bind, Connection):
        yield bind
        return
    engine = create_engine(normalise_url(bind)) if isinstance(bind, str) else bind
    try:
        with engine.connect() as conn:
            yield conn
            conn.commit()
    finally:
        if isinstance(bind, str):
            engine.dispose()


def _refuse_wrong_direction(conn: Connection, schema: str, target: str, way: str) -> None:
    # Alembic's own refusal names revisions and ranges; ours names schema versions.
    wanted = version_of(target)
    if wanted is None:
        return
    found = version_of(recorded_revision(conn, schema))
    if found is None:
        return
    if (way == "upgrade" and wanted < found) or (way == "downgrade" and wanted > found):
        other = "downgrade" if way == "upgrade" else "upgrade"
        raise InvalidOptionsError(
            "schema_version",
            f"schema {shown(schema)} is at pg-boss schema version {found}; {way} cannot go to "
            f"{wanted} (use {other})",
        )


def _end_own_transaction(bind: Bind, conn: Connection) -> None:
    # The direction check began a transaction. Left open, Alembic would take it for the
    # caller's and run every revision inside it, so indexes that pg-boss builds in the
    # background (CONCURRENTLY) would be built under a lock that blocks writers. A
    # Connection the caller passed is theirs: its transaction is left alone.
    if not isinstance(bind, Connection) and conn.in_transaction():
        conn.commit()


@dataclass(frozen=True)
class UpgradeResult:
    """What :func:`upgrade` found and did, read under pg-boss's migration lock."""

    before: str | None
    """Our revision recorded when the upgrade started (``None``: none)."""
    found: int | None
    """The pg-boss version row then (``None``: not installed)."""
    revision: str | None
    """Our revision recorded afterwards."""
    healed: tuple[str, ...] = ()
    """One line per index healed, per Node migration recorded, for a schema Node made
    that was adopted, or per step of building a backend profile's plain tables (usually
    none)."""
    attempt_history: bool = False
    """Whether this upgrade created the attempt history table (``alkstore_job_attempt``;
    ``False`` when it was there already, or not asked for)."""


def upgrade(
    bind: Bind,
    schema: str = DEFAULT_SCHEMA,
    revision: str | None = None,
    *,
    schema_version: int | None = None,
    backend: str | Backend | None = None,
    attempt_history: bool = True,
) -> UpgradeResult:
    """Create (or adopt) the pg-boss objects in ``schema``, or migrate them forward.

    The target is ``schema_version`` (a pg-boss schema version, see
    :data:`SCHEMA_VERSIONS`) or an Alembic ``revision``; with neither it is
    :data:`DEFAULT_SCHEMA_VERSION`.

    The whole upgrade holds pg-boss's migration advisory lock, so a second upgrade or a
    Node pg-boss ``start()`` waits for it and then finds nothing to do. Before writing
    anything, the schema's catalog is compared with the one its version row names
    (:mod:`alkstore_sa.schema_health`). Afterwards, unfinished index builds (INVALID
    indexes, job-table indexes a background build never made, unfinished ``bam`` rows)
    are finished, even when the schema was already at the target. A schema Node pg-boss
    made at version N (26 to 46) with no revision of ours recorded is adopted: when its
    catalog is version N's (unfinished index builds aside), revision ``alkstore_00NN`` is
    recorded and the upgrade goes on from there. A schema Node pg-boss migrated past our
    recorded revision is recorded at its version first.

    ``backend`` names a database backend profile (:mod:`alkstore_sa.backends`); under one
    with ``noTablePartitioning`` (``cockroachdb``, ``yugabytedb``) a fresh install builds
    what pg-boss 12.38 builds for it, at schema version 46 only, and a schema built for
    another profile is refused (the "Database backends" page).

    ``attempt_history`` (on by default) also creates our attempt history table,
    ``alkstore_job_attempt``, unless it is there (:func:`install_attempt_history`).

    Returns what it found and did (:class:`UpgradeResult`); a second upgrade that waited
    for the lock finds ``before == revision``.

    :raises InvalidOptionsError: for an unknown ``schema_version``, before any SQL.
    :raises SchemaCatalogError: if the catalog is not the version row's, before any write.
    :raises InvalidOptionsError: if the target is below the version of a schema Node
        pg-boss made (nothing recorded): going back is an explicit :func:`downgrade`.
    :raises InvalidOptionsError: for an unknown ``backend``, or a profile with
        ``noTablePartitioning`` and a target other than schema version 46.
    :raises SchemaProfileError: if the schema was built for another profile, or under
        such a profile at a version before 46, before any write.
    """
    schema = validate_schema(schema)
    target = _target(revision, schema_version, revision_for(DEFAULT_SCHEMA_VERSION))
    cfg = _checked_config(schema, target=target)
    dialect = make_url(bind).get_backend_name() if isinstance(bind, str) else bind.dialect.name
    profile = resolve_backend(backend, dialect=dialect)
    plain = profiles.builds_plain(profile.flags)
    if plain and target != revision_for(NEWEST_SCHEMA_VERSION):
        raise InvalidOptionsError(
            "backend",
            f"backend {str(profile)!r} builds pg-boss schema version {NEWEST_SCHEMA_VERSION} "
            f"only (profiles came with pg-boss 12.27), not {version_of(target)}",
        )
    own = not isinstance(bind, Connection)
    with _connection(bind) as conn, migration_lock(conn, schema, own=own):
        before, found = recorded_revision(conn, schema), installed_version(conn, schema)
        _refuse_wrong_direction(conn, schema, target, "upgrade")
        _refuse_other_profile(conn, schema, found, profile)
        done = _refuse_or_record(bind, conn, cfg, schema, target)
        # Few jobs: every revision in one transaction, its indexes built inside it (as
        # pg-boss's own install does); writers wait a moment, and no CONCURRENTLY build
        # runs while a Node start() may be waiting for the lock (that would deadlock).
        one_transaction = _few_jobs(conn, schema)
        if not one_transaction:
            _end_own_transaction(bind, conn)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, target)
        if plain and found is None:
            # A fresh install, in the transaction that built it (few jobs: none).
            done += profiles.apply(conn, schema, profile.flags)
        created = attempt_history and attempts.install(conn, schema)
        # Healing runs after commit, CONCURRENTLY, even for few jobs: a Node background
        # runner may be building on the same tables.
        _end_own_transaction(bind, conn)
        done += schema_health.heal(conn, schema)
        after = recorded_revision(conn, schema)
    return UpgradeResult(before, found, after, tuple(done), created)


def install_attempt_history(bind: Bind, schema: str = DEFAULT_SCHEMA) -> bool:
    """Create the attempt history table (``alkstore_job_attempt``) in ``schema`` unless it
    is there; whether it was created.

    :func:`upgrade` does this itself; call it from your own Alembic environment after
    ``alembic upgrade alkstore@head`` (the "Attempt history" page). Workers, services and
    supervisors notice the table when they next read the schema's version (within
    :data:`~alkstore_sa.names.SCHEMA_RECHECK_SECONDS`) and record every failed attempt
    from then on.
    """
    schema = validate_schema(schema)
    with _connection(bind) as conn:
        return attempts.install(conn, schema)


def _job_table_plain(conn: Connection, schema: str) -> bool | None:
    """Whether ``schema``'s job table is a plain table (``None``: it has none)."""
    quoted = conn.dialect.identifier_preparer.quote_schema(schema)
    kind = conn.execute(
        text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"), {"t": f"{quoted}.job"}
    ).scalar()
    return None if kind is None else kind == "r"


def _refuse_other_profile(
    conn: Connection, schema: str, found: int | None, profile: Backend
) -> None:
    """Refuse a schema built for another profile, or one under a profile at a version
    our revisions cannot migrate under it (before 46), before anything is written."""
    plain = profiles.builds_plain(profile.flags)
    live = _job_table_plain(conn, schema)
    if found is None or live is None:
        return
    version = found if found != NO_VERSION_ROW else 0
    if live and not plain:
        differs = (
            "its job table is a plain table, as pg-boss builds it under a backend with "
            "noTablePartitioning (cockroachdb, yugabytedb); name that backend"
        )
    elif plain and not live:
        differs = "its job table is partitioned, and this backend's (noTablePartitioning) is not"
    elif plain and found != NEWEST_SCHEMA_VERSION:
        differs = (
            f"it is at version {found}, and alkstore_sa builds a schema under this backend "
            f"at {NEWEST_SCHEMA_VERSION} only: let Node pg-boss 12.38 with the same backend "
            "migrate it"
        )
    else:
        return
    raise SchemaProfileError(schema, version, str(profile), differs)


FEW_JOBS = 10_000
"""Up to this many rows in ``job``, :func:`upgrade` runs every revision in one
transaction and builds the indexes inside it; above, each revision commits and then
builds its indexes ``CONCURRENTLY`` (the "Wire the migrations into your Alembic environment"
page)."""


def _few_jobs(conn: Connection, schema: str) -> bool:
    quoted = conn.dialect.identifier_preparer.quote_schema(schema)
    if conn.execute(text("SELECT to_regclass(:t)"), {"t": f"{quoted}.job"}).scalar() is None:
        return True
    found = conn.execute(
        text(f"SELECT count(*) FROM (SELECT 1 FROM {quoted}.job LIMIT {FEW_JOBS + 1}) s")
    ).scalar_one()
    return int(found) <= FEW_JOBS


def _refuse_or_record(
    bind: Bind, conn: Connection, cfg: Config, schema: str, target: str
) -> list[str]:
    # Under the migration lock, before any write of ours: a catalog that is not the
    # version row's is refused. A schema Node pg-boss made at a version we know, with no
    # revision of ours recorded, is adopted: its revision is recorded and the upgrade goes
    # on from there (26 is left to revision alkstore_0001, which adopts it itself). A
    # schema Node pg-boss migrated past our recorded revision is recorded at its version
    # (what our revisions would have built, but for index builds, which heal() finishes).
    # One version ahead of our record is left to Alembic: that is also our own revision
    # interrupted after its transaction, which the revision finishes itself.
    found = schema_health.diagnose(conn, schema)
    wanted = version_of(target)
    if found.version is None or found.version == NO_VERSION_ROW:
        return []
    unrecorded = found.recorded is None and found.version in SCHEMA_VERSIONS
    if wanted is not None and found.version > wanted:
        if unrecorded:
            raise _below_a_node_schema(schema, found.version, wanted)
        return []  # not an upgrade: the revisions refuse it with their own advice
    if found.refusals:
        raise SchemaCatalogError(
            schema, found.version, [str(f) for f in found.refusals], found.closest
        )
    if found.version <= OLDEST_SCHEMA_VERSION or found.version not in SCHEMA_VERSIONS:
        return []
    if unrecorded:
        action = "adopt_node_schema"
        line = (
            f"adopted schema {found.version}, which Node pg-boss made without our revisions: "
            f"recorded revision {revision_for(found.version)} (its catalog is version "
            f"{found.version}'s)"
        )
    elif found.recorded is not None and found.recorded < found.version - 1:
        action = "record_node_migration"
        line = (
            f"recorded schema {found.version}, which Node pg-boss migrated the schema to "
            f"(our revision had recorded schema {found.recorded})"
        )
    else:
        return []
    _end_own_transaction(bind, conn)
    cfg.attributes["connection"] = conn
    command.stamp(cfg, revision_for(found.version))
    log.warning("schema %s: %s", schema, line, extra={"action": action, "schema": schema})
    return [line]


def _below_a_node_schema(schema: str, found: int, wanted: int) -> InvalidOptionsError:
    return InvalidOptionsError(
        "schema_version",
        f"schema {shown(schema)} is at pg-boss schema version {found}, which Node pg-boss made "
        f"without alkstore_sa's revisions (none is recorded); upgrade cannot go down to "
        f"{wanted}. Nothing was changed. `alkstore db upgrade --schema-version {found}` "
        f"adopts it as it is; going back to {wanted} after that is an explicit `alkstore db "
        f"downgrade --schema-version {wanted}` (the 'Compatibility with pg-boss, and "
        "deliberate differences' page)",
    )


def downgrade(
    bind: Bind,
    schema: str = DEFAULT_SCHEMA,
    revision: str | None = None,
    *,
    schema_version: int | None = None,
) -> None:
    """Migrate ``schema`` back to ``schema_version`` (or ``revision``), or remove it all.

    With neither, everything :func:`upgrade` created goes (jobs included); down to the
    base, this also drops the revision table and then the schema itself, unless
    something else still lives in it. Holds pg-boss's migration lock throughout, as
    :func:`upgrade` does.

    :raises InvalidOptionsError: for an unknown ``schema_version``, before any SQL, or
        for any target but the base on a schema built under ``noTablePartitioning``.
    """
    schema = validate_schema(schema)
    revision = _target(revision, schema_version, BASE)
    cfg = _checked_config(schema, target=revision)
    own = not isinstance(bind, Connection)
    # pg-boss's migration lock, as upgrade() holds it: a Node start() (which would
    # migrate the schema straight back) or an upgrade waits until this is done.
    with _connection(bind) as conn, migration_lock(conn, schema, own=own):
        _refuse_wrong_direction(conn, schema, revision, "downgrade")
        if _job_table_plain(conn, schema) and revision != BASE:
            # Our revisions step back through the partitioned schema's objects.
            raise InvalidOptionsError(
                "schema_version",
                f"schema {shown(schema)} was built under a backend with noTablePartitioning: "
                "it can only be removed (downgrade to base), not taken to an earlier version",
            )
        if _job_table_plain(conn, schema):
            attempts.remove(conn, schema)  # the partitioned schema's revision 0001 drops it
            _remove_plain(conn, schema)
        else:
            _end_own_transaction(bind, conn)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
        if revision == BASE:
            _drop_leftovers(conn, schema)


def _remove_plain(conn: Connection, schema: str) -> None:
    """Remove a schema built under a profile with ``noTablePartitioning``: its tables,
    functions and types (those of the profile's catalog) and our revision."""
    found = schema_health.diagnose(conn, schema)
    want = schema_health.expected_catalog(found.version or 0, found.profile)
    if want is None or found.version is None:
        problems = ["its version row names no catalog built under a backend profile"]
        raise SchemaCatalogError(schema, found.version or 0, problems)
    s = conn.dialect.identifier_preparer.quote_schema(schema)
    quote = conn.dialect.identifier_preparer.quote
    conn.execute(text("DROP TABLE " + ", ".join(f"{s}.{quote(t)}" for t in sorted(want.tables))))
    for function in want.functions:
        name, args = function.split("(", 1)
        args = args.replace(schema_health.SCHEMA_PLACEHOLDER + ".", s + ".")
        conn.execute(text(f"DROP FUNCTION {s}.{quote(name)}({args}"))
    for type_ in sorted(want.types):
        conn.execute(text(f"DROP TYPE {s}.{quote(type_)}"))
    conn.execute(text(f"DELETE FROM {s}.{VERSION_TABLE}"))


def _drop_leftovers(conn: Connection, schema: str) -> None:
    version_table = Table(VERSION_TABLE, MetaData(), Column("version_num", String), schema=schema)
    if inspect(conn).has_table(VERSION_TABLE, schema=schema):
        if conn.execute(select(func.count()).select_from(version_table)).scalar_one():
            return  # other alkstore revisions are still recorded here
        version_table.drop(conn)
    try:
        # RESTRICT: the schema goes only if nothing at all is left in it.
        with conn.begin_nested():
            conn.execute(DropSchema(schema, if_exists=True))
    except DBAPIError:
        log.info(
            "schema %s kept: it still holds other objects",
            schema,
            extra={"action": "downgrade_keep_schema", "schema": schema},
        )


def current(bind: Bind, schema: str = DEFAULT_SCHEMA) -> str | None:
    """The alkstore revision recorded in ``schema``, or ``None``.

    :func:`version_of` turns it into a pg-boss schema version; :func:`current_version`
    reads the version pg-boss itself sees.
    """
    schema = validate_schema(schema)
    with _connection(bind) as conn:
        return recorded_revision(conn, schema)


def current_version(bind: Bind, schema: str = DEFAULT_SCHEMA) -> int | None:
    """The pg-boss schema version in ``<schema>.version`` (``None`` if not installed).

    This is what Node pg-boss reads; it can be ahead of our recorded revision when a
    newer Node pg-boss migrated the schema itself.
    """
    schema = validate_schema(schema)
    with _connection(bind) as conn:
        return installed_version(conn, schema)


def offline_sql(
    schema: str = DEFAULT_SCHEMA,
    revision: str | None = None,
    *,
    schema_version: int | None = None,
    attempt_history: bool = True,
) -> str:
    """The SQL script that :func:`upgrade` runs, for review or for a DBA.

    The script is one transaction: the indexes that :func:`upgrade` builds
    ``CONCURRENTLY`` after a revision commits are built inside it. With
    ``attempt_history`` (as :func:`upgrade`), it ends with the attempt history table.
    """
    schema = validate_schema(schema)
    target = _target(revision, schema_version, revision_for(DEFAULT_SCHEMA_VERSION))
    cfg = _checked_config(schema, url="postgresql+psycopg://", target=target)
    buf = io.StringIO()
    cfg.output_buffer = buf
    command.upgrade(cfg, target, sql=True)
    script = buf.getvalue()
    if attempt_history:
        end = script.rstrip().rfind("COMMIT;")
        script = script[:end] + attempts.offline_sql(schema) + script[end:]
    return script


def check(bind: Bind, schema: str = DEFAULT_SCHEMA) -> int:
    """Raise unless ``schema`` holds a pg-boss schema version the runtime speaks (26 or
    46, :data:`~alkstore_sa.names.SPOKEN_SCHEMA_VERSIONS`) with that version's catalog and
    every index built; return the version.

    :raises SchemaNotInstalledError: nothing installed.
    :raises SchemaVersionError: a version the runtime does not speak.
    :raises SchemaCatalogError: the catalog is not the version's (what differs is in the
        message and in ``problems``).
    :raises UnfinishedIndexBuildError: an INVALID or missing job index, or an unfinished
        ``bam`` row: ``alkstore db upgrade`` finishes them.
    """
    return check_health(bind, schema).version or 0


def check_health(bind: Bind, schema: str = DEFAULT_SCHEMA) -> schema_health.Diagnosis:
    """:func:`check`, returning the whole diagnosis (warnings included) when it passes."""
    schema = validate_schema(schema)
    with _connection(bind) as conn:
        version = installed_version(conn, schema)
        if version is None:
            raise SchemaNotInstalledError(schema)
        if version not in names.SPOKEN_SCHEMA_VERSIONS:
            found = None if version == NO_VERSION_ROW else version
            raise SchemaVersionError(
                schema, found, SCHEMA_VERSION, spoken=names.SPOKEN_SCHEMA_VERSIONS
            )
        diagnosis = schema_health.diagnose(conn, schema)
    if diagnosis.refusals:
        raise SchemaCatalogError(
            schema, version, [str(f) for f in diagnosis.refusals], diagnosis.closest
        )
    if diagnosis.to_heal:
        raise UnfinishedIndexBuildError(schema, version, [str(f) for f in diagnosis.to_heal])
    return diagnosis
