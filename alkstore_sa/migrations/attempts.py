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

from sqlalchemy import Connection, MetaData, Table, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateIndex, CreateTable

from ..models.attempts import ATTEMPT
from ..models.claims import CLAIM, CLAIMER
from ..names import DEFAULT_SCHEMA
from ..sql.common.base import schema_tables

OWN_TABLES: tuple[Table, ...] = (ATTEMPT, CLAIM, CLAIMER)
"""Our tables beside pg-boss's, made, granted and removed together: the attempt history
and the workers' claims at schema 26 (:mod:`alkstore_sa.models.claims`)."""

__all__ = ["exists", "grants_sql", "install", "offline_sql", "remove"]


def exists(conn: Connection, schema: str) -> bool:
    """Whether ``schema`` holds the attempt history table."""
    return bool(conn.execute(schema_tables(schema)).one().attempts)


def install(conn: Connection, schema: str) -> bool:
    """Create the table and its index in ``schema`` unless it is there, and grant it as
    the job table is granted (:func:`grants_sql`); whether it was created. Runs in the
    connection's transaction. The claim tables (:data:`OWN_TABLES`) are made and granted
    with it, each unless it is there."""
    created = not exists(conn, schema)
    translated = conn.execution_options(schema_translate_map={DEFAULT_SCHEMA: schema})
    for table in OWN_TABLES:
        table.create(translated, checkfirst=True)
        conn.execute(text(grants_sql(schema, table.name)))
    return created


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def grants_sql(schema: str, name: str = ATTEMPT.name) -> str:
    """A statement that grants the attempt history of ``schema`` to each role (and
    PUBLIC) that holds privileges on the job table and none on the history: the same
    privileges, with the same grant option.

    Run where the table is made: a role granted DML on the schema's tables before an
    upgrade added it would otherwise fail to record attempts (and, before that was
    tolerated, to fail jobs at all). A role given something on the history already, or
    one the table's default privileges covered, is left as it is.
    """
    s = _literal(schema)
    return f"""DO $alkstore$
DECLARE g record;
BEGIN
  FOR g IN
    SELECT a.privilege_type, a.is_grantable,
      CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(pg_get_userbyid(a.grantee)) END
        AS grantee
    FROM pg_class j, aclexplode(j.relacl) a
    WHERE j.oid = to_regclass(format('%I.job', {s}))
      AND a.grantee <> (SELECT h.relowner FROM pg_class h
                        WHERE h.oid = to_regclass(format('%I.{name}', {s})))
      AND NOT EXISTS (
        SELECT 1 FROM pg_class h, aclexplode(h.relacl) b
        WHERE h.oid = to_regclass(format('%I.{name}', {s})) AND b.grantee = a.grantee)
  LOOP
    EXECUTE format('GRANT %s ON %I.{name} TO %s%s', g.privilege_type, {s}, g.grantee,
      CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);
  END LOOP;
END
$alkstore$"""


def remove(conn: Connection, schema: str) -> bool:
    """Drop the table (and the claim tables) from ``schema`` if it is there; whether it was."""
    found = exists(conn, schema)
    translated = conn.execution_options(schema_translate_map={DEFAULT_SCHEMA: schema})
    for table in OWN_TABLES:
        table.drop(translated, checkfirst=True)
    return found


def offline_sql(schema: str) -> str:
    """The statements :func:`install` runs, for an offline script (``IF NOT EXISTS``,
    so the script may run on a schema that has the table), the grants included."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    script = ""
    for own in OWN_TABLES:
        table = own.to_metadata(MetaData(), schema=schema)
        statements: list[CreateTable | CreateIndex] = [CreateTable(table, if_not_exists=True)]
        statements += [CreateIndex(index, if_not_exists=True) for index in table.indexes]
        script += "".join(f"{str(s.compile(dialect=dialect)).strip()};\n\n" for s in statements)
        script += f"{grants_sql(schema, own.name)};\n\n"
    return script
