"""pg-boss schema version 26: enum, tables, job partitions, functions, version row.

Revision ID: alkstore_0001
Revises:
Create Date: 2026-12-01

Upgrading a schema that Node pg-boss already created at version 26 adopts it and
changes nothing. A schema at any other pg-boss version is refused here; one Node pg-boss
made at 27 to 46 is adopted by ``alkstore db upgrade`` before this revision runs
(alkstore_sa.migrate), and the refusal says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op
from sqlalchemy.dialects import postgresql

from alkstore_sa.errors import SchemaVersionError
from alkstore_sa.migrations import schema_name
from alkstore_sa.migrations.helpers import run_sql
from alkstore_sa.models.attempts import ATTEMPT_TABLE
from alkstore_sa.models.claims import CLAIM_TABLE, CLAIMER_TABLE
from alkstore_sa.names import NEWEST_KNOWN_SCHEMA_VERSION, SPOKEN_SCHEMA_VERSIONS, schema_key

revision: str = "alkstore_0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = ("alkstore",)
depends_on: str | Sequence[str] | None = None

VERSION = 26
STATES = ("created", "retry", "active", "completed", "cancelled", "failed")
TZ = sa.DateTime(timezone=True)


def _install_lock(schema: str) -> sa.TextClause:
    # The same advisory key Node pg-boss takes while installing or migrating
    # (empty key suffix), so the two can never build the schema concurrently.
    # The schema is written as a literal, not bound: offline scripts rendered by an
    # env.py without literal_binds would otherwise carry a placeholder.
    return sa.text(
        "SELECT pg_advisory_xact_lock(('x' || encode(sha224((current_database() "
        "|| '.pgboss.' || " + _lit(schema_key(schema)) + ")::bytea), 'hex'))::bit(64)::bigint)"
    )


class _NotAdopted(SchemaVersionError):
    """A pg-boss schema at 27 to 46 that our revisions did not build, reached without
    ``alkstore db upgrade`` (which adopts it): an application's own ``alembic upgrade``."""

    def __init__(self, schema: str, found: int) -> None:
        self.schema, self.found, self.expected = schema, found, VERSION
        adopt = f"alkstore_{found:04d}"
        # Bypass SchemaVersionError's advice, which is about a runtime meeting the schema.
        Exception.__init__(
            self,
            f"schema {schema!r} is at pg-boss schema version {found}, built by Node pg-boss "
            f"(12.6 or later) without alkstore_sa's revisions; this revision installs "
            f"{VERSION} and adopts only a schema at {VERSION}. Nothing was changed. Adopt it "
            f"with `alkstore db upgrade --schema-version {found}` once (it compares the "
            f"catalog with version {found}'s and records revision {adopt}), or record it "
            f"yourself with `alembic stamp alkstore@{adopt}`, then upgrade again "
            "(the 'Compatibility with pg-boss, and deliberate differences' page)",
        )


def _existing_version(schema: str) -> tuple[bool, int | None]:
    bind = op.get_bind()
    installed = bind.execute(
        sa.text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f'"{schema}".version'}
    ).scalar_one()
    if not installed:
        return False, None
    version_table = sa.table("version", sa.column("version"), schema=schema)
    found = bind.execute(sa.select(version_table.c.version).limit(1)).scalar()
    return True, found


def _job_columns(state_type: postgresql.ENUM) -> list[sa.Column[object]]:
    return [
        sa.Column("id", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("priority", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("data", postgresql.JSONB()),
        sa.Column("state", state_type, server_default=sa.text("'created'"), nullable=False),
        sa.Column("retry_limit", sa.Integer(), server_default=sa.text("2"), nullable=False),
        sa.Column("retry_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("retry_delay", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("retry_backoff", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column("retry_delay_max", sa.Integer()),
        sa.Column("expire_seconds", sa.Integer(), server_default=sa.text("900"), nullable=False),
        sa.Column(
            "deletion_seconds", sa.Integer(), server_default=sa.text("604800"), nullable=False
        ),
        sa.Column("singleton_key", sa.Text()),
        sa.Column("singleton_on", sa.DateTime(timezone=False)),
        sa.Column("start_after", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("created_on", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("started_on", TZ),
        sa.Column("completed_on", TZ),
        sa.Column(
            "keep_until", TZ, server_default=sa.text("now() + interval '1209600'"), nullable=False
        ),
        sa.Column("output", postgresql.JSONB()),
        sa.Column("dead_letter", sa.Text()),
        sa.Column("policy", sa.Text()),
    ]


# The two functions Node pg-boss calls. Written for alkstore_sa from the documented
# behaviour of pg-boss's create_queue()/delete_queue(); "@S@" stands for the quoted
# schema identifier and "@L@" for the schema as a string literal.
CREATE_QUEUE = """
CREATE FUNCTION @S@.create_queue(queue_name text, options jsonb)
RETURNS void
LANGUAGE plpgsql
AS $body$
DECLARE
  v_schema constant text := @L@;
  v_partitioned constant boolean := (options->>'partition') IS NOT DISTINCT FROM 'true';
  v_policy constant text := options->>'policy';
  v_table text := 'job_common';
  v_rows integer;
BEGIN
  IF v_partitioned THEN
    -- Same hash as the client computes; the bytea cast keeps names identical
    -- to the ones Node pg-boss derives.
    v_table := 'j' || encode(sha224(queue_name::bytea), 'hex');
  END IF;

  INSERT INTO @S@.queue AS q (
    name, policy, retry_limit, retry_delay, retry_backoff, retry_delay_max,
    expire_seconds, retention_seconds, deletion_seconds, warning_queued,
    dead_letter, partition, table_name)
  SELECT queue_name,
         v_policy,
         coalesce((options->>'retryLimit')::int, 2),
         coalesce((options->>'retryDelay')::int, 0),
         coalesce((options->>'retryBackoff')::boolean, false),
         (options->>'retryDelayMax')::int,
         coalesce((options->>'expireInSeconds')::int, 900),
         coalesce((options->>'retentionSeconds')::int, 1209600),
         coalesce((options->>'deleteAfterSeconds')::int, 604800),
         coalesce((options->>'warningQueueSize')::int, 0),
         options->>'deadLetter',
         coalesce((options->>'partition')::boolean, false),
         v_table
  ON CONFLICT DO NOTHING;
  GET DIAGNOSTICS v_rows = ROW_COUNT;

  -- An existing queue is left exactly as it is; shared queues need no partition.
  IF v_rows = 0 OR NOT v_partitioned THEN
    RETURN;
  END IF;

  EXECUTE format('CREATE TABLE %1$I.%2$I (LIKE %1$I.job INCLUDING DEFAULTS)', v_schema, v_table);
  EXECUTE format('ALTER TABLE %1$I.%2$I ADD PRIMARY KEY (name, id)', v_schema, v_table);
  EXECUTE format('ALTER TABLE %1$I.%2$I ADD CONSTRAINT q_fkey FOREIGN KEY (name) '
                 'REFERENCES %1$I.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED',
                 v_schema, v_table);
  EXECUTE format('ALTER TABLE %1$I.%2$I ADD CONSTRAINT dlq_fkey FOREIGN KEY (dead_letter) '
                 'REFERENCES %1$I.queue (name) ON DELETE RESTRICT DEFERRABLE INITIALLY DEFERRED',
                 v_schema, v_table);
  -- Every dedicated partition gets the fetch (i5) and throttle (i4) indexes,
  -- and only the unique index of its own policy.
  EXECUTE format('CREATE INDEX %3$I ON %1$I.%2$I (name, start_after) '
                 'INCLUDE (priority, created_on, id) WHERE state < %4$L',
                 v_schema, v_table, v_table || '_i5', 'active');
  EXECUTE format('CREATE UNIQUE INDEX %3$I ON %1$I.%2$I '
                 '(name, singleton_on, COALESCE(singleton_key, %4$L)) '
                 'WHERE state <> %5$L AND singleton_on IS NOT NULL',
                 v_schema, v_table, v_table || '_i4', '', 'cancelled');
  CASE v_policy
    WHEN 'short' THEN
      EXECUTE format('CREATE UNIQUE INDEX %3$I ON %1$I.%2$I (name, COALESCE(singleton_key, %4$L)) '
                     'WHERE state = %5$L AND policy = %6$L',
                     v_schema, v_table, v_table || '_i1', '', 'created', 'short');
    WHEN 'singleton' THEN
      EXECUTE format('CREATE UNIQUE INDEX %3$I ON %1$I.%2$I (name, COALESCE(singleton_key, %4$L)) '
                     'WHERE state = %5$L AND policy = %6$L',
                     v_schema, v_table, v_table || '_i2', '', 'active', 'singleton');
    WHEN 'stately' THEN
      EXECUTE format('CREATE UNIQUE INDEX %3$I ON %1$I.%2$I '
                     '(name, state, COALESCE(singleton_key, %4$L)) '
                     'WHERE state <= %5$L AND policy = %6$L',
                     v_schema, v_table, v_table || '_i3', '', 'active', 'stately');
    WHEN 'exclusive' THEN
      EXECUTE format('CREATE UNIQUE INDEX %3$I ON %1$I.%2$I (name, COALESCE(singleton_key, %4$L)) '
                     'WHERE state <= %5$L AND policy = %6$L',
                     v_schema, v_table, v_table || '_i6', '', 'active', 'exclusive');
    ELSE
      NULL;
  END CASE;

  EXECUTE format('ALTER TABLE %1$I.%2$I ADD CONSTRAINT cjc CHECK (name = %3$L)',
                 v_schema, v_table, queue_name);
  EXECUTE format('ALTER TABLE %1$I.job ATTACH PARTITION %1$I.%2$I FOR VALUES IN (%3$L)',
                 v_schema, v_table, queue_name);
END;
$body$
"""

DELETE_QUEUE = """
CREATE FUNCTION @S@.delete_queue(queue_name text)
RETURNS void
LANGUAGE plpgsql
AS $body$
DECLARE
  v_schema constant text := @L@;
  v_table text;
  v_partitioned boolean;
BEGIN
  SELECT q.table_name, q.partition INTO v_table, v_partitioned
    FROM @S@.queue q WHERE q.name = queue_name;
  IF NOT FOUND THEN
    RETURN;
  END IF;

  -- A queue row can claim partition = true while naming job_common (options with
  -- "partition": 1 cast to true but are not the JSON value true); dropping the
  -- shared partition would take every other queue's jobs with it.
  IF v_partitioned AND v_table <> 'job_common' THEN
    EXECUTE format('DROP TABLE IF EXISTS %I.%I', v_schema, v_table);
  ELSE
    EXECUTE format('DELETE FROM %I.%I WHERE name = $1', v_schema, v_table) USING queue_name;
  END IF;

  DELETE FROM @S@.queue WHERE name = queue_name;
END;
$body$
"""


def _function_ddl(template: str, schema: str) -> str:
    preparer = op.get_context().dialect.identifier_preparer
    literal = "'" + schema.replace("'", "''") + "'"
    return template.replace("@S@", preparer.quote_schema(schema)).replace("@L@", literal)


def upgrade() -> None:
    schema = schema_name()
    op.execute(sa.schema.CreateSchema(schema, if_not_exists=True))
    op.execute(_install_lock(schema))

    if not context.is_offline_mode():
        installed, found = _existing_version(schema)
        if installed:
            if found == VERSION:
                return  # created by Node pg-boss (or an earlier run): adopt it as it is
            if found is not None and VERSION < found <= NEWEST_KNOWN_SCHEMA_VERSION:
                raise _NotAdopted(schema, found)
            raise SchemaVersionError(schema, found, VERSION, spoken=SPOKEN_SCHEMA_VERSIONS)

    state_type = postgresql.ENUM(*STATES, name="job_state", schema=schema, create_type=False)
    op.execute(postgresql.CreateEnumType(state_type))

    op.create_table(
        "version",
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("cron_on", TZ),
        sa.PrimaryKeyConstraint("version", name="version_pkey"),
        schema=schema,
    )
    op.create_table(
        "queue",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("policy", sa.Text(), nullable=False),
        sa.Column("retry_limit", sa.Integer(), nullable=False),
        sa.Column("retry_delay", sa.Integer(), nullable=False),
        sa.Column("retry_backoff", sa.Boolean(), nullable=False),
        sa.Column("retry_delay_max", sa.Integer()),
        sa.Column("expire_seconds", sa.Integer(), nullable=False),
        sa.Column("retention_seconds", sa.Integer(), nullable=False),
        sa.Column("deletion_seconds", sa.Integer(), nullable=False),
        sa.Column("dead_letter", sa.Text()),
        sa.Column("partition", sa.Boolean(), nullable=False),
        sa.Column("table_name", sa.Text(), nullable=False),
        sa.Column("deferred_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("queued_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("warning_queued", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("active_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("total_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("singletons_active", postgresql.ARRAY(sa.Text())),
        sa.Column("monitor_on", TZ),
        sa.Column("maintain_on", TZ),
        sa.Column("created_on", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("updated_on", TZ, server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("name", name="queue_pkey"),
        sa.ForeignKeyConstraint(
            ["dead_letter"], [f"{schema}.queue.name"], name="queue_dead_letter_fkey"
        ),
        sa.CheckConstraint("dead_letter IS DISTINCT FROM name", name="queue_check"),
        schema=schema,
    )
    for table, first in (("schedule", "name"), ("subscription", "event")):
        keyed = (
            [
                sa.Column("name", sa.Text(), nullable=False),
                sa.Column("key", sa.Text(), server_default=sa.text("''"), nullable=False),
                sa.Column("cron", sa.Text(), nullable=False),
                sa.Column("timezone", sa.Text()),
                sa.Column("data", postgresql.JSONB()),
                sa.Column("options", postgresql.JSONB()),
            ]
            if table == "schedule"
            else [
                sa.Column("event", sa.Text(), nullable=False),
                sa.Column("name", sa.Text(), nullable=False),
            ]
        )
        op.create_table(
            table,
            *keyed,
            sa.Column("created_on", TZ, server_default=sa.text("now()"), nullable=False),
            sa.Column("updated_on", TZ, server_default=sa.text("now()"), nullable=False),
            sa.PrimaryKeyConstraint(
                first, "key" if table == "schedule" else "name", name=f"{table}_pkey"
            ),
            sa.ForeignKeyConstraint(
                ["name"], [f"{schema}.queue.name"], ondelete="CASCADE", name=f"{table}_name_fkey"
            ),
            schema=schema,
        )

    op.create_table(
        "job",
        *_job_columns(state_type),
        sa.PrimaryKeyConstraint("name", "id", name="job_pkey"),
        schema=schema,
        postgresql_partition_by="LIST (name)",
    )
    op.create_table(
        "job_common",
        *_job_columns(state_type),
        sa.PrimaryKeyConstraint("name", "id", name="job_common_pkey"),
        sa.ForeignKeyConstraint(
            ["name"],
            [f"{schema}.queue.name"],
            name="q_fkey",
            ondelete="RESTRICT",
            deferrable=True,
            initially="DEFERRED",
        ),
        sa.ForeignKeyConstraint(
            ["dead_letter"],
            [f"{schema}.queue.name"],
            name="dlq_fkey",
            ondelete="RESTRICT",
            deferrable=True,
            initially="DEFERRED",
        ),
        schema=schema,
    )
    key = sa.text("COALESCE(singleton_key, '')")
    unique_indexes: list[tuple[str, list[str | sa.TextClause], str]] = [
        ("job_i1", ["name", key], "state = 'created' AND policy = 'short'"),
        ("job_i2", ["name", key], "state = 'active' AND policy = 'singleton'"),
        ("job_i3", ["name", "state", key], "state <= 'active' AND policy = 'stately'"),
        ("job_i6", ["name", key], "state <= 'active' AND policy = 'exclusive'"),
        (
            "job_i4",
            ["name", "singleton_on", key],
            "state <> 'cancelled' AND singleton_on IS NOT NULL",
        ),
    ]
    for name, cols, where in unique_indexes:
        op.create_index(
            name, "job_common", cols, unique=True, schema=schema, postgresql_where=sa.text(where)
        )
    op.create_index(
        "job_i5",
        "job_common",
        ["name", "start_after"],
        schema=schema,
        postgresql_include=["priority", "created_on", "id"],
        postgresql_where=sa.text("state < 'active'"),
    )
    preparer = op.get_context().dialect.identifier_preparer
    run_sql(
        f"ALTER TABLE {preparer.quote_schema(schema)}.job ATTACH PARTITION "
        f"{preparer.quote_schema(schema)}.job_common DEFAULT"
    )

    run_sql(_function_ddl(CREATE_QUEUE, schema))
    run_sql(_function_ddl(DELETE_QUEUE, schema))

    version_table = sa.table("version", sa.column("version", sa.Integer()), schema=schema)
    op.execute(version_table.insert().values(version=sa.literal_column(str(VERSION))))


def downgrade() -> None:
    schema = schema_name()
    op.execute(_install_lock(schema))
    run_sql(f"DROP FUNCTION IF EXISTS {_q(schema)}.delete_queue(text)")
    run_sql(f"DROP FUNCTION IF EXISTS {_q(schema)}.create_queue(text, jsonb)")
    # Dropping the partitioned parent drops job_common and every dedicated partition.
    for table in ("job", "subscription", "schedule", "queue", "version"):
        op.drop_table(table, schema=schema)
    run_sql(f"DROP TYPE IF EXISTS {_q(schema)}.job_state")
    # Our attempt history, made beside the revisions (by `alkstore db upgrade`, or by the
    # on_version_apply hook of alkstore_sa.alembic_filters), goes with the queue tables.
    # So do our workers' claims (schema 26's rescue of a crashed worker's jobs).
    for own in (ATTEMPT_TABLE, CLAIM_TABLE, CLAIMER_TABLE):
        run_sql(f"DROP TABLE IF EXISTS {_q(schema)}.{own}")
    # The schema goes too, unless something else (an Alembic version table, the
    # application's own tables) still lives in it.
    run_sql(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n "
        "ON n.oid = c.relnamespace WHERE n.nspname = " + _lit(schema) + ") "
        "THEN EXECUTE 'DROP SCHEMA IF EXISTS ' || quote_ident(" + _lit(schema) + "); "
        "END IF; END $$"
    )


def _q(schema: str) -> str:
    return op.get_context().dialect.identifier_preparer.quote_schema(schema)


def _lit(schema: str) -> str:
    return "'" + schema.replace("'", "''") + "'"
