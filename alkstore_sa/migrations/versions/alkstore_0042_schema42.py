"""pg-boss schema version 42 (pg-boss 12.33.0): ``job_now()``, the schema's clock.

Revision ID: alkstore_0042
Revises: alkstore_0041
Create Date: 2026-12-01

From schema 42 on, every statement pg-boss runs reads the time through
``<schema>.job_now()``: the transaction timestamp, in a function a test clock can
replace. ``create_queue()`` stamps new queues with it. Column defaults keep ``now()``.
"""

from __future__ import annotations

from collections.abc import Sequence

from alkstore_sa.migrations import functions_38_46 as f46
from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0042"
down_revision: str | None = "alkstore_0041"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 42


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        helpers.execute_function(f46.JOB_NOW, schema)
        helpers.execute_function(f46.CREATE_QUEUE_42, schema)
        helpers.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    # create_queue() calls job_now() from 42 on: restore the older one first.
    helpers.execute_function(f46.CREATE_QUEUE_40, schema)
    helpers.run_sql(f"DROP FUNCTION {helpers.quote_schema(schema)}.job_now()")
    helpers.set_version(schema, VERSION - 1)
