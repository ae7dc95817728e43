"""pg-boss schema version 39 (pg-boss 12.29.0): the reindex pass's claim.

Revision ID: alkstore_0039
Revises: alkstore_0038
Create Date: 2026-12-01

``version.reindex_on`` is the interval claim of pg-boss's index-bloat pass, which one
instance at a time runs.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0039"
down_revision: str | None = "alkstore_0038"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 39


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        helpers.run_sql(
            f"ALTER TABLE {helpers.qualified(schema, 'version')} "
            "ADD COLUMN IF NOT EXISTS reindex_on timestamp with time zone"
        )
        helpers.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    op.drop_column("version", "reindex_on", schema=schema)
    helpers.set_version(schema, VERSION - 1)
