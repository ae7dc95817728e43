"""pg-boss schema version 34 (pg-boss 12.23): dead-letter provenance.

Revision ID: alkstore_0034
Revises: alkstore_0033
Create Date: 2026-12-01

``job.source_name``/``source_id``/``source_created_on``/``source_retry_count``: where a
dead-letter copy came from, for redrive.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0034"
down_revision: str | None = "alkstore_0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 34
TZ = sa.DateTime(timezone=True)

COLUMNS = (
    ("source_name", sa.Text()),
    ("source_id", sa.Uuid()),
    ("source_created_on", TZ),
    ("source_retry_count", sa.Integer()),
)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        for name, type_ in COLUMNS:
            op.add_column("job", sa.Column(name, type_), schema=schema)
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    for name, _ in COLUMNS:
        op.drop_column("job", name, schema=schema)
    h.set_version(schema, VERSION - 1)
