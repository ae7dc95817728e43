"""pg-boss schema version 38 (pg-boss 12.28.0): key_strict_fifo head index.

Revision ID: alkstore_0038
Revises: alkstore_0037
Create Date: 2026-12-01

A key_strict_fifo fetch claims only the head job of each key; ``job_i10`` serves that
scan. New key_strict_fifo partitions get it from ``create_queue()``; ``job_common`` and
the existing key_strict_fifo partitions get it built concurrently after the migration
transaction, as pg-boss's ``pg-boss migrate`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

from alkstore_sa.migrations import functions, helpers, schema_name
from alkstore_sa.migrations import functions_38_46 as f46

revision: str = "alkstore_0038"
down_revision: str | None = "alkstore_0037"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 38
POLICY = "key_strict_fifo"
HEAD_INDEX = f46.I10


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        helpers.execute_function(f46.CREATE_QUEUE_38, schema)
        helpers.set_version(schema, VERSION)
    # Only the tables that can hold key_strict_fifo jobs: pg-boss scopes this build to
    # job_common and the partitions of that policy.
    helpers.create_index(schema, HEAD_INDEX, policy=POLICY)
    helpers.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    helpers.forget_unfinished_builds(schema, VERSION)
    helpers.execute_function(functions.CREATE_QUEUE_33, schema)
    helpers.drop_index(schema, "i10", concurrently=False)
    helpers.set_version(schema, VERSION - 1)
