"""pg-boss schema version 44 (pg-boss 12.38.0): instance registry, histograms, trace context.

Revision ID: alkstore_0044
Revises: alkstore_0043
Create Date: 2026-12-01

* ``instance``: one row per Node pg-boss instance (registration, heartbeat, stop),
  starting empty;
* ``queue.blocked_count`` and, on ``queue`` and ``queue_stats``, the wait/run latency
  histograms and the age of the oldest ready job (nullable: "not counted");
* ``job.trace_context``: an OpenTelemetry propagation carrier.

Nothing to build in the background.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0044"
down_revision: str | None = "alkstore_0043"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 44
TZ = sa.DateTime(timezone=True)

QUEUE_COLUMNS = (
    "blocked_count int NOT NULL DEFAULT 0",
    "wait_bins int[]",
    "run_bins int[]",
    "ready_oldest_seconds int",
)
QUEUE_STATS_COLUMNS = ("wait_bins int[]", "run_bins int[]", "ready_oldest_seconds int")


def _alter(schema: str, table: str, clauses: Sequence[str]) -> None:
    helpers.run_sql(f"ALTER TABLE {helpers.qualified(schema, table)} " + ", ".join(clauses))


def _create_instance(schema: str) -> None:
    def flag(name: str) -> sa.Column[bool]:
        return sa.Column(name, sa.Boolean(), nullable=False)

    def count(name: str) -> sa.Column[int]:
        return sa.Column(name, sa.Integer())

    op.create_table(
        "instance",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("name", sa.Text()),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("version", sa.Text(), nullable=False),
        sa.Column("node_version", sa.Text(), nullable=False),
        sa.Column("application_name", sa.Text()),
        sa.Column("heartbeat_seconds", sa.Integer(), nullable=False),
        flag("supervise"),
        flag("schedule"),
        flag("migrate"),
        flag("persist_queue_stats"),
        flag("persist_warnings"),
        count("pool_max"),
        count("pool_total"),
        count("pool_idle"),
        count("pool_waiting"),
        sa.Column(
            "workers", postgresql.JSONB(), server_default=sa.text("'[]'::jsonb"), nullable=False
        ),
        sa.Column("metrics", postgresql.JSONB()),
        sa.Column(
            "config", postgresql.JSONB(), server_default=sa.text("'{}'::jsonb"), nullable=False
        ),
        sa.Column("crash_restarts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("crash_restarts_since", TZ),
        sa.Column("started_on", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("heartbeat_on", TZ, server_default=sa.text("now()"), nullable=False),
        sa.Column("stopped_on", TZ),
        sa.PrimaryKeyConstraint("id", name="instance_pkey"),
        schema=schema,
    )


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        _create_instance(schema)
        _alter(schema, "queue", [f"ADD COLUMN {c}" for c in QUEUE_COLUMNS])
        _alter(schema, "queue_stats", [f"ADD COLUMN {c}" for c in QUEUE_STATS_COLUMNS])
        _alter(schema, "job", ["ADD COLUMN IF NOT EXISTS trace_context jsonb"])
        helpers.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    op.drop_table("instance", schema=schema)
    _alter(schema, "queue", [f"DROP COLUMN {c.split()[0]}" for c in QUEUE_COLUMNS])
    _alter(schema, "queue_stats", [f"DROP COLUMN {c.split()[0]}" for c in QUEUE_STATS_COLUMNS])
    _alter(schema, "job", ["DROP COLUMN trace_context"])
    helpers.set_version(schema, VERSION - 1)
