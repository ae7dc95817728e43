"""pg-boss schema version 28 (pg-boss 12.10): the key_strict_fifo queue policy.

Revision ID: alkstore_0028
Revises: alkstore_0027
Create Date: 2026-12-01

job_common gets the CHECK that key_strict_fifo jobs carry a singleton key, and the
unique index i8 (one active, retrying or failed job per key), built concurrently
after commit; ``create_queue`` gives new key_strict_fifo partitions both. No
key_strict_fifo partition can exist before 28, so existing partitions get neither.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from alkstore_sa.migrations import functions as f
from alkstore_sa.migrations import helpers as h
from alkstore_sa.migrations import schema_name

revision: str = "alkstore_0028"
down_revision: str | None = "alkstore_0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 28
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    schema = schema_name()
    if h.begin_upgrade(schema, VERSION):
        name, expression = f.KEY_STRICT_FIFO_CHECK
        op.create_check_constraint(name, "job_common", sa.text(expression), schema=schema)
        h.execute_function(f.CREATE_QUEUE_28, schema)
        h.set_version(schema, VERSION)
    h.create_index(schema, f.I8, tables=[h.JOB_COMMON])
    h.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    h.begin_downgrade(schema, VERSION)
    h.drop_index(schema, "i8", concurrently=False)
    h.run_on_job_tables(
        schema,
        "ALTER TABLE %1$I.%2$I DROP CONSTRAINT IF EXISTS " + f.KEY_STRICT_FIFO_CHECK[0],
    )
    h.execute_function(f.CREATE_QUEUE_27, schema)
    h.set_version(schema, VERSION - 1)
