"""pg-boss schema version 29 (pg-boss 12.11): the warning table.

Revision ID: alkstore_0029
Revises: alkstore_0028
Create Date: 2026-12-01

Where pg-boss keeps the warnings it emits (slow queries, backlogs, clock skew) when
asked to persist them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0029"
down_revision: str | None = "alkstore_0028"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 29
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        op.create_table(
            "warning",
            sa.Column("id", sa.Uuid(), server_default=sa.text("gen_random_uuid()"), nullable=False),
            sa.Column("type", sa.Text(), nullable=False),
            sa.Column("message", sa.Text(), nullable=False),
            sa.Column("data", sa.dialects.postgresql.JSONB()),
            sa.Column("created_on", TZ, server_default=sa.text("now()"), nullable=False),
            sa.PrimaryKeyConstraint("id", name="warning_pkey"),
            schema=schema,
        )
        op.create_index("warning_i1", "warning", [sa.text("created_on DESC")], schema=schema)
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    op.drop_index("warning_i1", table_name="warning", schema=schema)
    op.drop_table("warning", schema=schema)
    h.set_version(schema, VERSION - 1)
