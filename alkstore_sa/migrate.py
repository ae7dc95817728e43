"""Run the schema migrations from Python (what ``alkstore db ...`` calls).

>>> from alkstore_sa import migrate
>>> migrate.upgrade(engine, schema="pgboss")          # doctest: +SKIP

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

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import (
    Column,
    Engine,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    inspect,
    select,
    text,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError
from sqlalchemy.schema import DropSchema

from .errors import SchemaNotInstalledError, SchemaVersionError
from .migrations import (
    SCHEMA_OPTION,
    VERSION_TABLE,
    refuse_foreign_revisions,
)
from .models import VersionRow
from .names import DEFAULT_SCHEMA, SCHEMA_VERSION, validate_schema

log = logging.getLogger(__name__)

HEAD = "alkstore@head"
BASE = "alkstore@base"

Bind = Engine | Connection | str

VERSION_LOCATION = "alkstore_sa:migrations/versions"
"""Where the standalone environment finds the revisions (a package resource)."""


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


def _checked_config(schema: str, url: str | None = None) -> Config:
    # Refused here, before a connection is opened; env.py checks again for
    # callers of the Alembic commands.
    cfg = alembic_config(schema, url)
    script = ScriptDirectory.from_config(cfg)
    refuse_foreign_revisions(script.version_locations or ())
    return cfg


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


def upgrade(bind: Bind, schema: str = DEFAULT_SCHEMA, revision: str = HEAD) -> None:
    """Create (or adopt) the schema-26 objects in ``schema``."""
    cfg = _checked_config(schema)
    with _connection(bind) as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def downgrade(bind: Bind, schema: str = DEFAULT_SCHEMA, revision: str = BASE) -> None:
    """Remove what :func:`upgrade` created (jobs included).

    Down to the base, this also drops the revision table and then the schema itself,
    unless something else still lives in it.
    """
    cfg = _checked_config(schema)
    with _connection(bind) as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)
        if revision == BASE:
            _drop_leftovers(conn, schema)


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
    """The alkstore revision recorded in ``schema``, or ``None``."""
    validate_schema(schema)
    with _connection(bind) as conn:
        ctx = MigrationContext.configure(
            conn, opts={"version_table": VERSION_TABLE, "version_table_schema": schema}
        )
        return ctx.get_current_revision()


def offline_sql(schema: str = DEFAULT_SCHEMA, revision: str = HEAD) -> str:
    """The SQL script that :func:`upgrade` runs, for review or for a DBA."""
    cfg = _checked_config(schema, url="postgresql+psycopg://")
    buf = io.StringIO()
    cfg.output_buffer = buf
    command.upgrade(cfg, revision, sql=True)
    return buf.getvalue()


def installed_version(conn: Connection, schema: str = DEFAULT_SCHEMA) -> int | None:
    """The pg-boss schema version found in ``schema`` (``None`` if not installed).

    Like Node pg-boss, only the existence of ``<schema>.version`` and its row are
    inspected.
    """
    validate_schema(schema)
    exists = conn.execute(
        text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f'"{schema}".version'}
    ).scalar_one()
    if not exists:
        return None
    stmt = select(VersionRow.version).limit(1)
    found = conn.execution_options(schema_translate_map={DEFAULT_SCHEMA: schema}).execute(stmt)
    value = found.scalar()
    return -1 if value is None else int(value)


def check(bind: Bind, schema: str = DEFAULT_SCHEMA) -> int:
    """Raise unless ``schema`` holds pg-boss schema version 26; return the version."""
    with _connection(bind) as conn:
        version = installed_version(conn, schema)
    if version is None:
        raise SchemaNotInstalledError(schema)
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(schema, None if version < 0 else version, SCHEMA_VERSION)
    return version
