"""pg-boss schema version 27 (pg-boss 12.6): group columns, the bam table, job_table_*.

Revision ID: alkstore_0027
Revises: alkstore_0001
Create Date: 2026-12-01

Adds ``job.group_id``/``group_tier``, ``version.bam_on``, the ``bam`` table (pg-boss's
record of background index builds), the ``job_table_format``/``job_table_run``/
``job_table_run_async`` functions, renames job_common's indexes ``job_iN`` to
``job_common_iN`` and builds the group index i7 on job_common and every partition
(concurrently, after the migration commits, as ``pg-boss migrate`` does).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import functions as f
from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0027"
down_revision: str | None = "alkstore_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 27
TZ = sa.DateTime(timezone=True)
RENAMED = ("i1", "i2", "i3", "i4", "i5", "i6", "i7")


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        op.add_column("version", sa.Column("bam_on", TZ), schema=schema)
        op.create_table(
            "bam",
            sa.Column("id", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False),
            sa.Column("name", sa.Text(), nullable=False),
            sa.Column("version", sa.Integer(), nullable=False),
            sa.Column("status", sa.Text(), server_default=sa.text("'pending'"), nullable=False),
            sa.Column("queue", sa.Text()),
            sa.Column("table_name", sa.Text(), nullable=False),
            sa.Column("command", sa.Text(), nullable=False),
            sa.Column("error", sa.Text()),
            sa.Column("created_on", TZ, server_default=sa.text("now()"), nullable=False),
            sa.Column("started_on", TZ),
            sa.Column("completed_on", TZ),
            sa.PrimaryKeyConstraint("id", name="bam_pkey"),
            schema=schema,
        )
        h.execute_function(f.JOB_TABLE_FORMAT_27, schema)
        h.execute_function(f.JOB_TABLE_RUN_ASYNC, schema)
        h.execute_function(f.JOB_TABLE_RUN, schema)
        op.add_column("job", sa.Column("group_id", sa.Text()), schema=schema)
        op.add_column("job", sa.Column("group_tier", sa.Text()), schema=schema)
        h.execute_function(f.CREATE_QUEUE_27, schema)
        # From 27 on, job_common's indexes carry its own name, like every partition's.
        for suffix in RENAMED:
            h.run_sql(
                f"ALTER INDEX IF EXISTS {h.qualified(schema, 'job_' + suffix)} "
                f"RENAME TO {h.quote_ident('job_common_' + suffix)}"
            )
        h.set_version(schema, VERSION)
    h.create_index(schema, f.I7)
    h.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    for suffix in reversed(RENAMED[:6]):
        h.run_sql(
            f"ALTER INDEX IF EXISTS {h.qualified(schema, 'job_common_' + suffix)} "
            f"RENAME TO {h.quote_ident('job_' + suffix)}"
        )
    h.drop_index(schema, "i7", concurrently=False)
    h.execute_function(f.CREATE_QUEUE_26, schema)
    s = h.quote_schema(schema)
    h.run_sql(f"DROP FUNCTION {s}.job_table_run(text, text, text)")
    h.run_sql(f"DROP FUNCTION {s}.job_table_run_async(text, integer, text, text, text)")
    h.run_sql(f"DROP FUNCTION {s}.job_table_format(text, text)")
    op.drop_table("bam", schema=schema)
    op.drop_column("version", "bam_on", schema=schema)
    op.drop_column("job", "group_tier", schema=schema)
    op.drop_column("job", "group_id", schema=schema)
    h.set_version(schema, VERSION - 1)
