"""pg-boss schema version 43 (pg-boss 12.35.0): throughput deltas, dead-letter provenance.

Revision ID: alkstore_0043
Revises: alkstore_0042
Create Date: 2026-12-01

* ``queue`` and ``queue_stats`` get the throughput counted per monitor pass (on
  ``queue_stats`` nullable: a snapshot taken before is "not counted", not 0);
* ``job.source_output`` (the failed original's output, on a dead-letter copy) and
  ``job.source_root_id`` (the first job of a dead-letter/redrive chain);
* ``job_i12`` on ``source_root_id``, across queues, built concurrently on every job
  table; new partitions get it from ``create_queue()``.

No statement rewrites a table: every new column is nullable or has a constant default.
"""

from __future__ import annotations

from collections.abc import Sequence

from alkstore_sa.migrations import functions_38_46 as f46
from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0043"
down_revision: str | None = "alkstore_0042"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 43
LINEAGE_INDEX = f46.I12

# Column order is pg-boss's: the two tables list the delta columns differently.
QUEUE_COLUMNS = (
    "created_delta int NOT NULL DEFAULT 0",
    "completed_delta int NOT NULL DEFAULT 0",
    "failed_delta int NOT NULL DEFAULT 0",
    "delta_on timestamp with time zone",
    "delta_seconds int",
)
QUEUE_STATS_COLUMNS = (
    "created_delta int",
    "completed_delta int",
    "failed_delta int",
    "delta_seconds int",
    "delta_on timestamp with time zone",
)
JOB_COLUMNS = ("source_output jsonb", "source_root_id uuid")


def _add(schema: str, table: str, columns: Sequence[str], *, if_not_exists: bool = False) -> None:
    # One ALTER per table: one lock on the table for all its new columns.
    clause = "ADD COLUMN IF NOT EXISTS " if if_not_exists else "ADD COLUMN "
    helpers.run_sql(
        f"ALTER TABLE {helpers.qualified(schema, table)} " + ", ".join(clause + c for c in columns)
    )


def _drop(schema: str, table: str, columns: Sequence[str]) -> None:
    helpers.run_sql(
        f"ALTER TABLE {helpers.qualified(schema, table)} "
        + ", ".join(f"DROP COLUMN {c.split()[0]}" for c in columns)
    )


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        _add(schema, "queue", QUEUE_COLUMNS)
        _add(schema, "queue_stats", QUEUE_STATS_COLUMNS)
        _add(schema, "job", JOB_COLUMNS, if_not_exists=True)
        helpers.execute_function(f46.CREATE_QUEUE_43, schema)
        helpers.set_version(schema, VERSION)
    helpers.create_index(schema, LINEAGE_INDEX)
    helpers.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    helpers.forget_unfinished_builds(schema, VERSION)
    # create_queue() first, so that a queue created meanwhile builds no index on a
    # column about to go; then the index, then its column.
    helpers.execute_function(f46.CREATE_QUEUE_42, schema)
    helpers.drop_index(schema, LINEAGE_INDEX.suffix, concurrently=False)
    _drop(schema, "queue", QUEUE_COLUMNS)
    _drop(schema, "queue_stats", QUEUE_STATS_COLUMNS)
    _drop(schema, "job", JOB_COLUMNS)
    helpers.set_version(schema, VERSION - 1)
