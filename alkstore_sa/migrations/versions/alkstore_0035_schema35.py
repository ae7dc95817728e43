"""pg-boss schema version 35 (pg-boss 12.24): queue statistics history.

Revision ID: alkstore_0035
Revises: alkstore_0034
Create Date: 2026-12-01

The ``queue_stats`` table, partitioned by day on ``captured_on`` (UTC), with its
index and the partitions of today and tomorrow; ``queue.ready_history``.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0035"
down_revision: str | None = "alkstore_0034"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 35
TZ = sa.DateTime(timezone=True)

COUNTS = (
    "deferred_count",
    "queued_count",
    "ready_count",
    "active_count",
    "failed_count",
    "total_count",
)

# Today's and tomorrow's partitions (UTC days), named queue_stats_YYYYMMDD; later
# days are pg-boss's supervisor's business.
DAILY_PARTITIONS = """
DO $parts$
DECLARE
  v_schema constant text := @L@;
  v_day date := (now() AT TIME ZONE 'UTC')::date;
  v_name text;
BEGIN
  FOR n IN 0..1 LOOP
    v_name := 'queue_stats_' || to_char(v_day + n, 'YYYYMMDD');
    IF to_regclass(quote_ident(v_schema) || '.' || quote_ident(v_name)) IS NULL THEN
      EXECUTE format(
        'CREATE TABLE %1$I.%2$I PARTITION OF %1$I.queue_stats FOR VALUES FROM (%3$L) TO (%4$L)',
        v_schema, v_name,
        to_char(v_day + n, 'YYYY-MM-DD') || ' 00:00:00+00',
        to_char(v_day + n + 1, 'YYYY-MM-DD') || ' 00:00:00+00');
    END IF;
  END LOOP;
END
$parts$
"""


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        zero = sa.text("0")
        op.create_table(
            "queue_stats",
            sa.Column("id", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False),
            sa.Column("name", sa.Text(), nullable=False),
            *(sa.Column(c, sa.Integer(), server_default=zero, nullable=False) for c in COUNTS),
            sa.Column("captured_on", TZ, server_default=sa.text("now()"), nullable=False),
            sa.PrimaryKeyConstraint("id", "captured_on", name="queue_stats_pkey"),
            schema=schema,
            postgresql_partition_by="RANGE (captured_on)",
        )
        op.create_index(
            "queue_stats_i1",
            "queue_stats",
            ["name", sa.text("captured_on DESC")],
            schema=schema,
            postgresql_include=list(COUNTS),
        )
        h.execute_function(DAILY_PARTITIONS, schema)
        op.add_column(
            "queue",
            sa.Column(
                "ready_history",
                sa.dialects.postgresql.ARRAY(sa.Integer()),
                server_default=sa.text("'{}'"),
                nullable=False,
            ),
            schema=schema,
        )
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    op.drop_column("queue", "ready_history", schema=schema)
    # Its daily partitions go with it.
    op.drop_table("queue_stats", schema=schema)
    h.set_version(schema, VERSION - 1)
