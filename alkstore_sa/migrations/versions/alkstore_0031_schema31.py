"""pg-boss schema version 31 (pg-boss 12.19): job dependencies (flows).

Revision ID: alkstore_0031
Revises: alkstore_0030
Create Date: 2026-12-01

``job.blocked``/``blocking``/``pending_dependencies`` and the ``job_dependency`` table.
New partitions' fetch index leaves blocked jobs out; existing fetch indexes stay as
they are until schema 33 reshapes them (pg-boss 12.24.1 and later do the same).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import functions as f
from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0031"
down_revision: str | None = "alkstore_0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 31
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        false = sa.text("false")
        op.add_column(
            "job",
            sa.Column("blocked", sa.Boolean(), server_default=false, nullable=False),
            schema=schema,
        )
        op.add_column(
            "job",
            sa.Column("blocking", sa.Boolean(), server_default=false, nullable=False),
            schema=schema,
        )
        op.add_column(
            "job",
            sa.Column(
                "pending_dependencies", sa.Integer(), server_default=sa.text("0"), nullable=False
            ),
            schema=schema,
        )
        op.create_table(
            "job_dependency",
            sa.Column("child_name", sa.Text(), nullable=False),
            sa.Column("child_id", sa.Uuid(), nullable=False),
            sa.Column("parent_name", sa.Text(), nullable=False),
            sa.Column("parent_id", sa.Uuid(), nullable=False),
            sa.PrimaryKeyConstraint(
                "child_name", "child_id", "parent_name", "parent_id", name="job_dependency_pkey"
            ),
            schema=schema,
        )
        op.create_index(
            "job_dep_parent_idx", "job_dependency", ["parent_name", "parent_id"], schema=schema
        )
        h.execute_function(f.CREATE_QUEUE_31, schema)
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    op.drop_index("job_dep_parent_idx", table_name="job_dependency", schema=schema)
    op.drop_table("job_dependency", schema=schema)
    h.execute_function(f.CREATE_QUEUE_30, schema)
    # Partitions created at 31 or 32 have a fetch index over `blocked`, which the
    # column drop below would take with it: give them schema 26's instead.
    h.run_on_job_tables(
        schema,
        "DO $i5$ BEGIN IF EXISTS (SELECT 1 FROM pg_index x WHERE x.indexrelid = "
        "to_regclass(quote_ident(%1$L) || '.' || quote_ident(%2$L || '_i5')) "
        "AND pg_get_indexdef(x.indexrelid) LIKE '%%blocked%%') THEN "
        "EXECUTE format('DROP INDEX %%I.%%I', %1$L, %2$L || '_i5'); END IF; END $i5$",
    )
    h.create_index_in_transaction(schema, f.I5_COVERING)
    op.drop_column("job", "pending_dependencies", schema=schema)
    op.drop_column("job", "blocking", schema=schema)
    op.drop_column("job", "blocked", schema=schema)
    h.set_version(schema, VERSION - 1)
