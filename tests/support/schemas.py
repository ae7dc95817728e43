"""Creating and dropping throw-away schemas, and running SQL scripts as psql would."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import Engine, make_url, text

from .pgboss_plans import construction_plan


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
