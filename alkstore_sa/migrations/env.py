"""Alembic environment for running the alkstore revisions on their own.

Used by ``alkstore db ...`` and :mod:`alkstore_sa.migrate`. Applications that have
their own Alembic environment do not use this file; they list our ``versions``
folder in ``version_locations`` instead.

The revision history is recorded in ``<schema>.alkstore_alembic_version``, so
several schemas in one database keep separate histories.

This environment runs alkstore_sa's revisions only: a revision file of anybody
else's in its version locations is refused before anything runs (see
the "Wire the migrations into your Alembic environment" page).
"""

from __future__ import annotations

import os

from alembic import context
from alembic.script import ScriptDirectory
from sqlalchemy import engine_from_config, pool
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateSchema

from alkstore_sa.migrations import VERSION_TABLE, refuse_foreign_revisions, schema_name

config = context.config
schema = schema_name()

# Before any connection or SQL: an application's revision that landed in our
# folder would otherwise run on every database this environment upgrades.
_script = ScriptDirectory.from_config(config)
refuse_foreign_revisions(_script.version_locations or [os.path.join(_script.dir, "versions")])


def _configure(**kwargs: object) -> None:
    context.configure(
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        transactional_ddl=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    # The named paramstyle keeps "%" as written: with psycopg's default (format), the
    # script would double every "%" inside function bodies (format('%1$I', ...)).
    _configure(
        url=config.get_main_option("sqlalchemy.url"),
        literal_binds=True,
        dialect_name="postgresql",
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.execute(CreateSchema(schema, if_not_exists=True))
        context.run_migrations()


def _run(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        # The version table lives in the target schema, which must exist first.
        connection.execute(CreateSchema(schema, if_not_exists=True))
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = engine_from_config(
        config.get_section(config.config_ini_section) or {},
        prefix="sqlalchemy.",
        poolclass=pool.NullPool,
    )
    with engine.connect() as conn:
        _run(conn)
        conn.commit()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
