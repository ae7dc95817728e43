"""The attempt history table (``alkstore_job_attempt``): installed beside any version.

The table is ours, not pg-boss's, and the same at every schema version, so it is not a
step of the revision chain, whose revisions are one to one with pg-boss schema versions
(``alkstore_00NN`` leaves version N) and which Node pg-boss migrates under us. It is
made from its declarative model (:class:`~alkstore_sa.models.JobAttemptRow`) by
:func:`alkstore_sa.migrate.upgrade` after the revisions, at whatever version they leave,
and removed by a downgrade to the base; an application that runs our revisions from its
own Alembic environment calls :func:`alkstore_sa.migrate.install_attempt_history`
(the "Attempt history" page says why, and what a schema without it does: fail as
before, with no history kept).
"""

from __future__ import annotations

from sqlalchemy import Connection, MetaData
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from ..models.attempts import ATTEMPT
from ..names import DEFAULT_SCHEMA
from ..sql.common.base import schema_tables

__all__ = ["exists", "install", "offline_sql", "remove"]


def exists(conn: Connection, schema: str) -> bool:
    """Whether ``schema`` holds the attempt history table."""
    return bool(conn.execute(schema_tables(schema)).one().attempts)


def install(conn: Connection, schema: str) -> bool:
    """Create the table and its index in ``schema`` unless it is there; whether it was
    created. Runs in the connection's transaction."""
    if exists(conn, schema):
        return False
    translated = conn.execution_options(schema_translate_map={DEFAULT_SCHEMA: schema})
    ATTEMPT.create(translated)
    return True


def remove(conn: Connection, schema: str) -> bool:
    """Drop the table from ``schema`` if it is there; whether it was."""
    if not exists(conn, schema):
        return False
    translated = conn.execution_options(schema_translate_map={DEFAULT_SCHEMA: schema})
    ATTEMPT.drop(translated)
    return True


def offline_sql(schema: str) -> str:
    """The statements :func:`install` runs, for an offline script (``IF NOT EXISTS``,
    so the script may run on a schema that has the table)."""
    table = ATTEMPT.to_metadata(MetaData(), schema=schema)
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    statements: list[CreateTable | CreateIndex] = [CreateTable(table, if_not_exists=True)]
    statements += [CreateIndex(index, if_not_exists=True) for index in table.indexes]
    return "".join(f"{str(s.compile(dialect=dialect)).strip()};\n\n" for s in statements)
