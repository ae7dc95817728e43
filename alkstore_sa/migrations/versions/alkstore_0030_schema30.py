"""pg-boss schema version 30 (pg-boss 12.12): job heartbeats.

Revision ID: alkstore_0030
Revises: alkstore_0029
Create Date: 2026-12-01

``job.heartbeat_on``/``heartbeat_seconds`` and ``queue.heartbeat_seconds``;
``create_queue`` stores the queue's ``heartbeatSeconds`` option.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import functions as f
from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0030"
down_revision: str | None = "alkstore_0029"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 30
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        op.add_column("job", sa.Column("heartbeat_on", TZ), schema=schema)
        op.add_column("job", sa.Column("heartbeat_seconds", sa.Integer()), schema=schema)
        op.add_column("queue", sa.Column("heartbeat_seconds", sa.Integer()), schema=schema)
        h.execute_function(f.CREATE_QUEUE_30, schema)
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    h.execute_function(f.CREATE_QUEUE_28, schema)
    op.drop_column("queue", "heartbeat_seconds", schema=schema)
    op.drop_column("job", "heartbeat_seconds", schema=schema)
    op.drop_column("job", "heartbeat_on", schema=schema)
    h.set_version(schema, VERSION - 1)
