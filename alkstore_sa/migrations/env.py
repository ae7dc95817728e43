"""Alembic environment for running the alkstore revisions on their own.

Used by ``alkstore db ...`` and :mod:`alkstore_sa.migrate`. Applications that have
their own Alembic environment do not use this file; they list our ``versions``
folder in ``version_locations`` instead.

The revision history is recorded in ``<schema>.alkstore_alembic_version``, so
several schemas in one database keep separate histories.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateSchema

from alkstore_sa.migrations import VERSION_TABLE, schema_name

config = context.config
schema = schema_name()


def _configure(**kwargs: object) -> None:
    context.configure(
        version_table=VERSION_TABLE,
        version_table_schema=schema,
        transactional_ddl=True,
        **kwargs,  # type: ignore[arg-type]
    )


def run_offline() -> None:
    _configure(
        url=config.get_main_option("sqlalchemy.url"), literal_binds=True, dialect_name="postgresql"
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
