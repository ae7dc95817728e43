"""pg-boss schema version 45 (pg-boss 12.38.0): one queued job per key for ``upsert()``.

Revision ID: alkstore_0045
Revises: alkstore_0044
Create Date: 2026-12-01

``job.upsert_by_key`` marks a job inserted by an upsert by key; the unique ``job_i13``
over those queued jobs keeps two concurrent upserts of one key from creating two jobs.
No existing job carries the flag, so the index starts empty and cannot fail on
duplicates. It is built concurrently on every job table; new partitions get it from
``create_queue()``.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from alkstore_sa.migrations import functions_38_46 as f46
from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0045"
down_revision: str | None = "alkstore_0044"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 45
UPSERT_INDEX = f46.I13


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        helpers.run_sql(
            f"ALTER TABLE {helpers.qualified(schema, 'job')} "
            "ADD COLUMN IF NOT EXISTS upsert_by_key bool"
        )
        helpers.execute_function(f46.CREATE_QUEUE_45, schema)
        helpers.set_version(schema, VERSION)
    helpers.create_index(schema, UPSERT_INDEX)
    helpers.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    helpers.forget_unfinished_builds(schema, VERSION)
    helpers.execute_function(f46.CREATE_QUEUE_43, schema)
    helpers.drop_index(schema, UPSERT_INDEX.suffix, concurrently=False)
    op.drop_column("job", "upsert_by_key", schema=schema)
    helpers.set_version(schema, VERSION - 1)
