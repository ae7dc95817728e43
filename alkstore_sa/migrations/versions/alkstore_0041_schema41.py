"""pg-boss schema version 41 (pg-boss 12.31.0): schedule kinds, last job, UTC default.

Revision ID: alkstore_0041
Revises: alkstore_0040
Create Date: 2026-12-01

* ``schedule.kind`` says whether ``cron`` holds a cron expression or an RFC 5545
  recurrence rule. Existing rows that read as a rule are labelled ``rrule``, as pg-boss
  does: an iCalendar property (``DTSTART``, ``RRULE``, ``RDATE``, ``EXDATE`` followed by
  ``;`` or ``:``) starting a line, or ``FREQ=`` at the start, after whitespace or after
  ``;``. No cron expression can match (no cron field holds ``=``, ``;`` or ``:``);
* ``schedule.last_job_id``: the job a schedule last sent, without a foreign key (the
  job is subject to retention);
* a NULL ``timezone`` becomes ``'UTC'``, now also the column default.
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

from alkstore_sa.migrations import helpers, schema_name

revision: str = "alkstore_0041"
down_revision: str | None = "alkstore_0040"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 41
# A rule, told apart from a cron expression. PostgreSQL's "^" anchors the whole
# string, so a property on a later line is found through the whitespace before it.
RULE_PATTERNS = (
    "(^|[[:space:]]|;)FREQ=",
    "(^|[[:space:]])(DTSTART|RRULE|RDATE|EXDATE)[;:]",
)


def upgrade() -> None:
    schema = schema_name()
    if helpers.begin_upgrade(schema, VERSION):
        schedule = helpers.qualified(schema, "schedule")
        helpers.run_sql(
            f"ALTER TABLE {schedule} ADD COLUMN IF NOT EXISTS kind text NOT NULL "
            "DEFAULT 'cron' CHECK (kind IN ('cron', 'rrule'))"
        )
        is_rule = " OR ".join(f"cron ~* {helpers.literal(p)}" for p in RULE_PATTERNS)
        helpers.run_sql(f"UPDATE {schedule} SET kind = 'rrule' WHERE kind = 'cron' AND ({is_rule})")
        helpers.run_sql(f"UPDATE {schedule} SET timezone = 'UTC' WHERE timezone IS NULL")
        helpers.run_sql(f"ALTER TABLE {schedule} ALTER COLUMN timezone SET DEFAULT 'UTC'")
        helpers.run_sql(f"ALTER TABLE {schedule} ADD COLUMN IF NOT EXISTS last_job_id uuid")
        helpers.set_version(schema, VERSION)


def downgrade() -> None:
    schema = schema_name()
    helpers.begin_downgrade(schema, VERSION)
    # The CHECK on kind goes with its column. pg-boss's own rollback keeps the 'UTC'
    # default; we drop it, so that a downgraded schema has exactly the catalog of
    # version 40. The zones set to UTC stay (a NULL zone never meant anything else).
    op.drop_column("schedule", "kind", schema=schema)
    op.drop_column("schedule", "last_job_id", schema=schema)
    helpers.run_sql(
        f"ALTER TABLE {helpers.qualified(schema, 'schedule')} ALTER COLUMN timezone DROP DEFAULT"
    )
    helpers.set_version(schema, VERSION - 1)
