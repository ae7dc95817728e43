"""The pg-boss schema-46 tables as SQLAlchemy Core :class:`~sqlalchemy.Table` objects.

The builders of :mod:`alkstore_sa.sql.v46` read and write through these, named as
:mod:`alkstore_sa.sql.common.base` names the schema-26 tables (``JOB``, ``QUEUE``...).
They live on their own :data:`metadata`, apart from the schema-26 models, in the
placeholder schema ``pgboss`` that ``schema_translate_map`` points at the schema in
use, as for schema 26.

Columns, their order, nullability and server defaults are those of the catalog our
migrations build at 46, which is the catalog pg-boss 12.38.0's own migration builds
(the golden-schema tests hold both, and the runtime's schema-version tests compare
these objects with it). Nothing here emits DDL: the migrations own the schema, so the
constraints are declared only as far as statements need them (primary keys, for
``ON CONFLICT`` targets and identity), and indexes not at all.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Integer,
    MetaData,
    Table,
    Text,
    Uuid,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from ...models.enums import job_state_type
from ...names import DEFAULT_SCHEMA

metadata = MetaData(schema=DEFAULT_SCHEMA)
"""The schema-46 tables, in the placeholder schema ``pgboss``; never used for DDL."""

TZ = DateTime(timezone=True)

VERSION = Table(
    "version",
    metadata,
    Column("version", Integer(), primary_key=True, nullable=False),
    Column("cron_on", TZ, nullable=True),
    Column("bam_on", TZ, nullable=True),
    Column("flow_on", TZ, nullable=True),
    Column("reindex_on", TZ, nullable=True),
    Column("monitor_backoff_on", TZ, nullable=True),
)

QUEUE = Table(
    "queue",
    metadata,
    Column("name", Text(), primary_key=True, nullable=False),
    Column("policy", Text(), nullable=False),
    Column("retry_limit", Integer(), nullable=False),
    Column("retry_delay", Integer(), nullable=False),
    Column("retry_backoff", Boolean(), nullable=False),
    Column("retry_delay_max", Integer(), nullable=True),
    Column("expire_seconds", Integer(), nullable=False),
    Column("retention_seconds", Integer(), nullable=False),
    Column("deletion_seconds", Integer(), nullable=False),
    Column("dead_letter", Text(), nullable=True),
    Column("partition", Boolean(), nullable=False),
    Column("table_name", Text(), nullable=False),
    Column("deferred_count", Integer(), nullable=False, server_default=text("0")),
    Column("queued_count", Integer(), nullable=False, server_default=text("0")),
    Column("warning_queued", Integer(), nullable=False, server_default=text("0")),
    Column("active_count", Integer(), nullable=False, server_default=text("0")),
    Column("total_count", Integer(), nullable=False, server_default=text("0")),
    Column("singletons_active", ARRAY(Text()), nullable=True),
    Column("monitor_on", TZ, nullable=True),
    Column("maintain_on", TZ, nullable=True),
    Column("created_on", TZ, nullable=False, server_default=text("now()")),
    Column("updated_on", TZ, nullable=False, server_default=text("now()")),
    Column("heartbeat_seconds", Integer(), nullable=True),
    Column("notify", Boolean(), nullable=False, server_default=text("false")),
    Column("failed_count", Integer(), nullable=False, server_default=text("0")),
    Column("ready_count", Integer(), nullable=False, server_default=text("0")),
    Column(
        "ready_history", ARRAY(Integer()), nullable=False, server_default=text("'{}'::integer[]")
    ),
    Column("monitor_claim_on", TZ, nullable=True),
    Column("created_delta", Integer(), nullable=False, server_default=text("0")),
    Column("completed_delta", Integer(), nullable=False, server_default=text("0")),
    Column("failed_delta", Integer(), nullable=False, server_default=text("0")),
    Column("delta_on", TZ, nullable=True),
    Column("delta_seconds", Integer(), nullable=True),
    Column("blocked_count", Integer(), nullable=False, server_default=text("0")),
    Column("wait_bins", ARRAY(Integer()), nullable=True),
    Column("run_bins", ARRAY(Integer()), nullable=True),
    Column("ready_oldest_seconds", Integer(), nullable=True),
    Column("retained_count", Integer(), nullable=True),
    Column("retained_on", TZ, nullable=True),
)

SCHEDULE = Table(
    "schedule",
    metadata,
    Column("name", Text(), primary_key=True, nullable=False),
    Column("key", Text(), primary_key=True, nullable=False, server_default=text("''::text")),
    Column("cron", Text(), nullable=False),
    Column("timezone", Text(), nullable=True, server_default=text("'UTC'::text")),
    Column("data", JSONB(), nullable=True),
    Column("options", JSONB(), nullable=True),
    Column("created_on", TZ, nullable=False, server_default=text("now()")),
    Column("updated_on", TZ, nullable=False, server_default=text("now()")),
    Column("kind", Text(), nullable=False, server_default=text("'cron'::text")),
    Column("last_job_id", Uuid(), nullable=True),
)

SUBSCRIPTION = Table(
    "subscription",
    metadata,
    Column("event", Text(), primary_key=True, nullable=False),
    Column("name", Text(), primary_key=True, nullable=False),
    Column("created_on", TZ, nullable=False, server_default=text("now()")),
    Column("updated_on", TZ, nullable=False, server_default=text("now()")),
)


def _job_columns() -> list[Column[Any]]:
    """The columns of a job table at 46, fresh for each table (a Column belongs to one).

    ``job`` (the parent of the per-queue partitions) and ``job_common`` (where
    queues without their own partition live) are declared alike by pg-boss's
    migration, so they are declared here once.
    """
    return [
        Column(
            "id", Uuid(), primary_key=True, nullable=False, server_default=text("gen_random_uuid()")
        ),
        Column("name", Text(), primary_key=True, nullable=False),
        Column("priority", Integer(), nullable=False, server_default=text("0")),
        Column("data", JSONB(), nullable=True),
        Column(
            "state", job_state_type, nullable=False, server_default=text("'created'::job_state")
        ),
        Column("retry_limit", Integer(), nullable=False, server_default=text("2")),
        Column("retry_count", Integer(), nullable=False, server_default=text("0")),
        Column("retry_delay", Integer(), nullable=False, server_default=text("0")),
        Column("retry_backoff", Boolean(), nullable=False, server_default=text("false")),
        Column("retry_delay_max", Integer(), nullable=True),
        Column("expire_seconds", Integer(), nullable=False, server_default=text("900")),
        Column("deletion_seconds", Integer(), nullable=False, server_default=text("604800")),
        Column("singleton_key", Text(), nullable=True),
        Column("singleton_on", DateTime(timezone=False), nullable=True),
        Column("start_after", TZ, nullable=False, server_default=text("now()")),
        Column("created_on", TZ, nullable=False, server_default=text("now()")),
        Column("started_on", TZ, nullable=True),
        Column("completed_on", TZ, nullable=True),
        Column(
            "keep_until", TZ, nullable=False, server_default=text("(now() + '336:00:00'::interval)")
        ),
        Column("output", JSONB(), nullable=True),
        Column("dead_letter", Text(), nullable=True),
        Column("policy", Text(), nullable=True),
        Column("group_id", Text(), nullable=True),
        Column("group_tier", Text(), nullable=True),
        Column("heartbeat_on", TZ, nullable=True),
        Column("heartbeat_seconds", Integer(), nullable=True),
        Column("blocked", Boolean(), nullable=False, server_default=text("false")),
        Column("blocking", Boolean(), nullable=False, server_default=text("false")),
        Column("pending_dependencies", Integer(), nullable=False, server_default=text("0")),
        Column("source_name", Text(), nullable=True),
        Column("source_id", Uuid(), nullable=True),
        Column("source_created_on", TZ, nullable=True),
        Column("source_retry_count", Integer(), nullable=True),
        Column("source_output", JSONB(), nullable=True),
        Column("source_root_id", Uuid(), nullable=True),
        Column("trace_context", JSONB(), nullable=True),
        Column("upsert_by_key", Boolean(), nullable=True),
    ]


JOB = Table("job", metadata, *_job_columns())

JOB_COMMON = Table("job_common", metadata, *_job_columns())

JOB_DEPENDENCY = Table(
    "job_dependency",
    metadata,
    Column("child_name", Text(), primary_key=True, nullable=False),
    Column("child_id", Uuid(), primary_key=True, nullable=False),
    Column("parent_name", Text(), primary_key=True, nullable=False),
    Column("parent_id", Uuid(), primary_key=True, nullable=False),
)

BAM = Table(
    "bam",
    metadata,
    Column(
        "id", Uuid(), primary_key=True, nullable=False, server_default=text("gen_random_uuid()")
    ),
    Column("name", Text(), nullable=False),
    Column("version", Integer(), nullable=False),
    Column("status", Text(), nullable=False, server_default=text("'pending'::text")),
    Column("queue", Text(), nullable=True),
    Column("table_name", Text(), nullable=False),
    Column("command", Text(), nullable=False),
    Column("error", Text(), nullable=True),
    Column("created_on", TZ, nullable=False, server_default=text("clock_timestamp()")),
    Column("started_on", TZ, nullable=True),
    Column("completed_on", TZ, nullable=True),
)

WARNING = Table(
    "warning",
    metadata,
    Column(
        "id", Uuid(), primary_key=True, nullable=False, server_default=text("gen_random_uuid()")
    ),
    Column("type", Text(), nullable=False),
    Column("message", Text(), nullable=False),
    Column("data", JSONB(), nullable=True),
    Column("created_on", TZ, nullable=False, server_default=text("now()")),
)

QUEUE_STATS = Table(
    "queue_stats",
    metadata,
    Column(
        "id", Uuid(), primary_key=True, nullable=False, server_default=text("gen_random_uuid()")
    ),
    Column("name", Text(), nullable=False),
    Column("deferred_count", Integer(), nullable=False, server_default=text("0")),
    Column("queued_count", Integer(), nullable=False, server_default=text("0")),
    Column("ready_count", Integer(), nullable=False, server_default=text("0")),
    Column("active_count", Integer(), nullable=False, server_default=text("0")),
    Column("failed_count", Integer(), nullable=False, server_default=text("0")),
    Column("total_count", Integer(), nullable=False, server_default=text("0")),
    Column("captured_on", TZ, primary_key=True, nullable=False, server_default=text("now()")),
    Column("created_delta", Integer(), nullable=True),
    Column("completed_delta", Integer(), nullable=True),
    Column("failed_delta", Integer(), nullable=True),
    Column("delta_seconds", Integer(), nullable=True),
    Column("delta_on", TZ, nullable=True),
    Column("wait_bins", ARRAY(Integer()), nullable=True),
    Column("run_bins", ARRAY(Integer()), nullable=True),
    Column("ready_oldest_seconds", Integer(), nullable=True),
)

INSTANCE = Table(
    "instance",
    metadata,
    Column("id", Uuid(), primary_key=True, nullable=False),
    Column("name", Text(), nullable=True),
    Column("host", Text(), nullable=False),
    Column("pid", Integer(), nullable=False),
    Column("version", Text(), nullable=False),
    Column("node_version", Text(), nullable=False),
    Column("application_name", Text(), nullable=True),
    Column("heartbeat_seconds", Integer(), nullable=False),
    Column("supervise", Boolean(), nullable=False),
    Column("schedule", Boolean(), nullable=False),
    Column("migrate", Boolean(), nullable=False),
    Column("persist_queue_stats", Boolean(), nullable=False),
    Column("persist_warnings", Boolean(), nullable=False),
    Column("pool_max", Integer(), nullable=True),
    Column("pool_total", Integer(), nullable=True),
    Column("pool_idle", Integer(), nullable=True),
    Column("pool_waiting", Integer(), nullable=True),
    Column("workers", JSONB(), nullable=False, server_default=text("'[]'::jsonb")),
    Column("metrics", JSONB(), nullable=True),
    Column("config", JSONB(), nullable=False, server_default=text("'{}'::jsonb")),
    Column("crash_restarts", Integer(), nullable=False, server_default=text("0")),
    Column("crash_restarts_since", TZ, nullable=True),
    Column("started_on", TZ, nullable=False, server_default=text("now()")),
    Column("heartbeat_on", TZ, nullable=False, server_default=text("now()")),
    Column("stopped_on", TZ, nullable=True),
)

ALL_TABLES: tuple[Table, ...] = (
    VERSION,
    QUEUE,
    SCHEDULE,
    SUBSCRIPTION,
    JOB,
    JOB_COMMON,
    JOB_DEPENDENCY,
    BAM,
    WARNING,
    QUEUE_STATS,
    INSTANCE,
)
"""Every table above (the tests compare each with the catalog at 46)."""

JOB_COLUMNS = [c.name for c in JOB.columns]
"""The job columns at 46, in catalog order (``job`` and ``job_common`` have the same)."""
