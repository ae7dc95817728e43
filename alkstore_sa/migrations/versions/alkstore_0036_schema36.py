"""pg-boss schema version 36 (pg-boss 12.24.1): bam.created_on defaults to clock_timestamp().

Revision ID: alkstore_0036
Revises: alkstore_0035
Create Date: 2026-12-01

Carries schema 33's default change to databases that passed 33 before it was added
there; on a schema migrated through our 33 it is already in place. Downgrading
changes nothing (pg-boss keeps the default too).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0036"
down_revision: str | None = "alkstore_0035"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 36
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        op.alter_column(
            "bam", "created_on", server_default=sa.text("clock_timestamp()"), schema=schema
        )
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    h.set_version(schema, VERSION - 1)
