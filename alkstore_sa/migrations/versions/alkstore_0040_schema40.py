"""pg-boss schema version 40 (pg-boss 12.30.0): monitor claim, stats backoff, fetch index.

Revision ID: alkstore_0040
Revises: alkstore_0039
Create Date: 2026-12-01

* ``version.monitor_backoff_on``: pg-boss's global backoff of the stats refresh;
* ``queue.monitor_claim_on``: the monitor's claim, apart from the stats stamp
  ``monitor_on``. It is seeded from ``monitor_on``, as pg-boss does, so the queues do
  not all fall due at once after the upgrade;
* the fetch index ``job_i11`` (the order of pg-boss's fetch) replaces ``job_i5``: built
  concurrently on every job table first, then ``job_i5`` is dropped concurrently.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from alkstore_sa.migrations import functions_38_46 as f46
from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0040"
down_revision: str | None = "alkstore_0039"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 40
FETCH_INDEX = f46.I11
RETIRED_INDEX = f46.I5


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        version_table = helpers.qualified(schema, "version")
        queue = helpers.qualified(schema, "queue")
        helpers.run_sql(
            f"ALTER TABLE {version_table} "
            "ADD COLUMN IF NOT EXISTS monitor_backoff_on timestamp with time zone"
        )
        helpers.run_sql(
            f"ALTER TABLE {queue} "
            "ADD COLUMN IF NOT EXISTS monitor_claim_on timestamp with time zone"
        )
        helpers.run_sql(
            f"UPDATE {queue} SET monitor_claim_on = monitor_on WHERE monitor_claim_on IS NULL"
        )
        helpers.execute_function(f46.CREATE_QUEUE_40, schema)
        helpers.set_version(schema, VERSION)
    # Build before retire: job_i5 goes only once job_i11 is valid everywhere.
    helpers.create_index(schema, FETCH_INDEX)
    helpers.drop_index(schema, RETIRED_INDEX.suffix)
    helpers.settle_bam(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    helpers.forget_unfinished_builds(schema, VERSION)
    helpers.execute_function(f46.CREATE_QUEUE_38, schema)
    # Restore before retire, inside the transaction, as pg-boss's rollback does.
    helpers.create_index_in_transaction(schema, RETIRED_INDEX)
    helpers.drop_index(schema, FETCH_INDEX.suffix, concurrently=False)
    op.drop_column("queue", "monitor_claim_on", schema=schema)
    op.drop_column("version", "monitor_backoff_on", schema=schema)
    helpers.set_version(schema, VERSION - 1)
