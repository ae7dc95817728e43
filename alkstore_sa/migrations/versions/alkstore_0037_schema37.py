"""pg-boss schema version 37 (pg-boss 12.26): job_table_format() for any schema name.

Revision ID: alkstore_0037
Revises: alkstore_0036
Create Date: 2026-12-01

``job_table_format`` rewrites only the whole-word table reference ``.job`` and index
names ``job_i<digits>``, so a schema name containing ``.job`` or ``job_i`` is left
intact. No table changes.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from alkstore_sa.migrations import functions as f
from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0037"
down_revision: str | None = "alkstore_0036"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 37
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        h.execute_function(f.JOB_TABLE_FORMAT_37, schema)
        h.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    h.execute_function(f.JOB_TABLE_FORMAT_27, schema)
    h.set_version(schema, VERSION - 1)
