"""pg-boss schema version 32 (pg-boss 12.21): LISTEN/NOTIFY opt-in, queue counters.

Revision ID: alkstore_0032
Revises: alkstore_0031
Create Date: 2026-12-01

``queue.notify`` (stored by ``create_queue`` from the ``notify`` option), then
``queue.failed_count`` and ``queue.ready_count``, in pg-boss's order.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import functions as f
from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0032"
down_revision: str | None = "alkstore_0031"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 32
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        op.add_column(
            "queue",
            sa.Column("notify", sa.Boolean(), server_default=sa.text("false"), nullable=False),
            schema=schema,
        )
        h.execute_function(f.CREATE_QUEUE_32, schema)
        for column in ("failed_count", "ready_count"):
            op.add_column(
                "queue",
                sa.Column(column, sa.Integer(), server_default=sa.text("0"), nullable=False),
                schema=schema,
            )
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    op.drop_column("queue", "ready_count", schema=schema)
    op.drop_column("queue", "failed_count", schema=schema)
    h.execute_function(f.CREATE_QUEUE_31, schema)
    op.drop_column("queue", "notify", schema=schema)
    h.set_version(schema, VERSION - 1)
