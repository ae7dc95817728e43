"""Creating and dropping throw-away schemas, and running SQL scripts as psql would.

A fresh schema per test comes from :func:`install`: the SQL script our migrations render
offline (``migrate.offline_sql``) is made once per session and version for
:data:`TEMPLATE_SCHEMA`, then renamed and run in one round trip. That is about four times
faster than ``migrate.upgrade`` (which also reads the catalog twice, to check and heal), and
``tests/test_fast_schema.py`` proves it builds exactly the catalog the online migrations
build. Tests whose subject is the migration path itself still call ``migrate.upgrade``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import Engine, make_url, text

from alkstore_sa import migrate

from .pgboss_plans import construction_plan

TEMPLATE_SCHEMA = "t_zztemplatezz"
"""The name the offline scripts are rendered for once, then renamed (the ``z`` keeps it
apart from every :func:`random_schema` name, which is hexadecimal)."""

_scripts: dict[int, str] = {}


def random_schema(prefix: str = "t_") -> str:
    """A schema name no other test uses."""
    return prefix + uuid.uuid4().hex[:12]


def libpq_url(database_url: str) -> str:
    """The SQLAlchemy URL of the tests as a libpq URL, for plain psycopg."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def run_script(database_url: str, sql: str) -> None:
    """Run a multi-statement script in autocommit mode (its own BEGIN/COMMIT apply)."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(sql.encode())


def migration_script(version: int, schema: str) -> str:
    """The script ``migrate.upgrade(..., schema_version=version)`` runs, for ``schema``.

    Our revisions name their schema only as an identifier or inside string literals that
    the upgrade would have written with the new name, so renaming the template's script
    gives the script rendered for ``schema`` (``tests/test_fast_schema.py`` checks both
    the text and the catalog it builds).
    """
    if version not in _scripts:
        _scripts[version] = migrate.offline_sql(TEMPLATE_SCHEMA, schema_version=version)
    return _scripts[version].replace(TEMPLATE_SCHEMA, schema)


def install(database_url: str, schema: str, version: int) -> None:
    """Create ``schema`` at pg-boss schema ``version`` with our revisions, in one round trip."""
    run_script(database_url, migration_script(version, schema))


def install_with_node_plan(database_url: str, schema: str) -> None:
    """Create ``schema`` exactly as Node pg-boss 11.1.2 does on first start."""
    run_script(database_url, construction_plan(schema))


def drop_schema(engine: Engine, schema: str) -> None:
    with engine.begin() as conn:
        quoted = conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
        conn.execute(text(f"DROP SCHEMA IF EXISTS {quoted} CASCADE"))


@contextmanager
def throwaway(engine: Engine, *names: str) -> Iterator[None]:
    """Drop the named schemas afterwards, whatever happens."""
    try:
        yield
    finally:
        for name in names:
            drop_schema(engine, name)


def schema_exists(engine: Engine, schema: str) -> bool:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
        ).scalar_one()
    return bool(found)
