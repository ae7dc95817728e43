"""pg-boss schema version 33 (pg-boss 12.22/12.24.1): flow resolver index, slim fetch index.

Revision ID: alkstore_0033
Revises: alkstore_0032
Create Date: 2026-12-01

``version.flow_on``; ``bam.created_on`` defaults to ``clock_timestamp()``; after
commit, concurrently on job_common and every partition: the flow resolver index i9,
then the fetch index i5 dropped and rebuilt without covering columns and without
blocked jobs (in pg-boss's order: i9 everywhere, the drops, the rebuilds).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import functions as f
from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0033"
down_revision: str | None = "alkstore_0032"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 33
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        op.add_column("version", sa.Column("flow_on", TZ), schema=schema)
        op.alter_column(
            "bam", "created_on", server_default=sa.text("clock_timestamp()"), schema=schema
        )
        h.execute_function(f.CREATE_QUEUE_33, schema)
        h.set_version(schema, VERSION)
    h.create_index(schema, f.I9)
    # A resumed run keeps the slim indexes the interrupted one already built.
    h.drop_index(schema, "i5", keep_if=lambda definition: "INCLUDE" not in definition)
    h.create_index(schema, f.I5_SLIM)
    h.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    h.execute_function(f.CREATE_QUEUE_32, schema)
    # Back to the fetch index the tables had at 32 (schema 26's covering one).
    h.drop_index(schema, "i5", concurrently=False)
    h.create_index_in_transaction(schema, f.I5_COVERING)
    h.drop_index(schema, "i9", concurrently=False)
    op.alter_column("bam", "created_on", server_default=sa.text("now()"), schema=schema)
    op.drop_column("version", "flow_on", schema=schema)
    h.set_version(schema, VERSION - 1)
