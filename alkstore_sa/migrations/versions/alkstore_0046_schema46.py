"""pg-boss schema version 46 (pg-boss 12.38.0): monitor and maintenance indexes, retained count.

Revision ID: alkstore_0046
Revises: alkstore_0045
Create Date: 2026-12-01

* ``queue.retained_count`` and ``queue.retained_on``, not seeded: each queue's next
  maintenance pass counts them;
* four indexes that let the monitor and maintenance read live and recent jobs only,
  and ``update()``/``upsert()`` by key find queued jobs: ``job_i14`` … ``job_i17``. They
  start full, so they are built concurrently on every job table, one after the other;
  new partitions get them from ``create_queue()``.
"""

from __future__ import annotations

from collections.abc import Sequence

from alkstore_sa.migrations import functions_38_46 as f46
from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0046"
down_revision: str | None = "alkstore_0045"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 46
INDEXES = (f46.I14, f46.I15, f46.I16, f46.I17)


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        helpers.run_sql(
            f"ALTER TABLE {helpers.qualified(schema, 'queue')} "
            "ADD COLUMN IF NOT EXISTS retained_count int, "
            "ADD COLUMN IF NOT EXISTS retained_on timestamp with time zone"
        )
        helpers.execute_function(f46.CREATE_QUEUE_46, schema)
        helpers.set_version(schema, VERSION)
    helpers.create_indexes(schema, INDEXES)
    helpers.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    helpers.forget_unfinished_builds(schema, VERSION)
    helpers.execute_function(f46.CREATE_QUEUE_45, schema)
    for index in reversed(INDEXES):
        helpers.drop_index(schema, index.suffix, concurrently=False)
    helpers.run_sql(
        f"ALTER TABLE {helpers.qualified(schema, 'queue')} "
        "DROP COLUMN retained_on, DROP COLUMN retained_count"
    )
    helpers.set_version(schema, VERSION - 1)
