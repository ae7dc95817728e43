"""The schema-26 tables, column for column and constraint for constraint.

Column order, defaults, constraint and index names follow pg-boss 11.1.2 exactly
(a golden test compares the catalog with Node pg-boss's own construction plan).
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    Boolean,
    CheckConstraint,
    DateTime,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base
from .enums import job_state_type

TZ = DateTime(timezone=True)


class VersionRow(Base):
    """The single row naming the schema version (26) and the cron throttle."""

    __tablename__ = "version"
    __table_args__ = (PrimaryKeyConstraint("version", name="version_pkey"),)

    version: Mapped[int] = mapped_column(Integer, autoincrement=False)
    cron_on: Mapped[dt.datetime | None] = mapped_column(TZ)


class QueueRow(Base):
    """A queue: its policy, retry and retention defaults, and cached counters."""

    __tablename__ = "queue"
    __table_args__ = (
        PrimaryKeyConstraint("name", name="queue_pkey"),
        ForeignKeyConstraint(["dead_letter"], ["queue.name"], name="queue_dead_letter_fkey"),
        CheckConstraint("dead_letter IS DISTINCT FROM name", name="queue_check"),
    )

    name: Mapped[str] = mapped_column(Text)
    policy: Mapped[str] = mapped_column(Text)
    retry_limit: Mapped[int] = mapped_column(Integer)
    retry_delay: Mapped[int] = mapped_column(Integer)
    retry_backoff: Mapped[bool] = mapped_column(Boolean)
    retry_delay_max: Mapped[int | None] = mapped_column(Integer)
    expire_seconds: Mapped[int] = mapped_column(Integer)
    retention_seconds: Mapped[int] = mapped_column(Integer)
    deletion_seconds: Mapped[int] = mapped_column(Integer)
    dead_letter: Mapped[str | None] = mapped_column(Text)
    partition: Mapped[bool] = mapped_column(Boolean)
    table_name: Mapped[str] = mapped_column(Text)
    deferred_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    queued_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    warning_queued: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    active_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    total_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    singletons_active: Mapped[list[str] | None] = mapped_column(ARRAY(Text))
    monitor_on: Mapped[dt.datetime | None] = mapped_column(TZ)
    maintain_on: Mapped[dt.datetime | None] = mapped_column(TZ)
    created_on: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())
    updated_on: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())


class ScheduleRow(Base):
    """A cron schedule; ``key`` lets one queue carry several schedules."""

    __tablename__ = "schedule"
    __table_args__ = (PrimaryKeyConstraint("name", "key", name="schedule_pkey"),)

    name: Mapped[str] = mapped_column(
        Text, ForeignKey("queue.name", ondelete="CASCADE", name="schedule_name_fkey")
    )
    key: Mapped[str] = mapped_column(Text, server_default=text("''"))
    cron: Mapped[str] = mapped_column(Text)
    timezone: Mapped[str | None] = mapped_column(Text)
    data: Mapped[Any] = mapped_column(JSONB, nullable=True)
    options: Mapped[Any] = mapped_column(JSONB, nullable=True)
    created_on: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())
    updated_on: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())


class SubscriptionRow(Base):
    """Maps a published event to the queues that receive it."""

    __tablename__ = "subscription"
    __table_args__ = (PrimaryKeyConstraint("event", "name", name="subscription_pkey"),)

    event: Mapped[str] = mapped_column(Text)
    name: Mapped[str] = mapped_column(
        Text, ForeignKey("queue.name", ondelete="CASCADE", name="subscription_name_fkey")
    )
    created_on: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())
    updated_on: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())


class _JobColumns:
    """The 22 job columns, in pg-boss order (shared by ``job`` and ``job_common``)."""

    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), server_default=func.gen_random_uuid())
    name: Mapped[str] = mapped_column(Text)
    priority: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    data: Mapped[Any] = mapped_column(JSONB, nullable=True)
    state: Mapped[str] = mapped_column(job_state_type, server_default=text("'created'"))
    retry_limit: Mapped[int] = mapped_column(Integer, server_default=text("2"))
    retry_count: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    retry_delay: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    retry_backoff: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    retry_delay_max: Mapped[int | None] = mapped_column(Integer)
    expire_seconds: Mapped[int] = mapped_column(Integer, server_default=text("900"))
    deletion_seconds: Mapped[int] = mapped_column(Integer, server_default=text("604800"))
    singleton_key: Mapped[str | None] = mapped_column(Text)
    singleton_on: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=False))
    start_after: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())
    created_on: Mapped[dt.datetime] = mapped_column(TZ, server_default=func.now())
    started_on: Mapped[dt.datetime | None] = mapped_column(TZ)
    completed_on: Mapped[dt.datetime | None] = mapped_column(TZ)
    keep_until: Mapped[dt.datetime] = mapped_column(
        TZ, server_default=text("now() + interval '1209600'")
    )
    output: Mapped[Any] = mapped_column(JSONB, nullable=True)
    dead_letter: Mapped[str | None] = mapped_column(Text)
    policy: Mapped[str | None] = mapped_column(Text)


class JobRow(_JobColumns, Base):
    """The partitioned job table (``PARTITION BY LIST (name)``).

    Statements address this parent; PostgreSQL routes rows to ``job_common`` or to
    a queue's dedicated partition by name.
    """

    __tablename__ = "job"
    __table_args__ = (
        PrimaryKeyConstraint("name", "id", name="job_pkey"),
        {"postgresql_partition_by": "LIST (name)"},
    )


def _key() -> Any:
    return func.coalesce(text("singleton_key"), text("''"))


class JobCommonRow(_JobColumns, Base):
    """The DEFAULT partition holding every non-partitioned queue's jobs.

    Its indexes are named ``job_i1`` ... ``job_i6`` (a pg-boss quirk kept for
    compatibility); the ``policy`` column of each row selects which unique index
    applies to it.
    """

    __tablename__ = "job_common"
    __table_args__ = (
        PrimaryKeyConstraint("name", "id", name="job_common_pkey"),
        ForeignKeyConstraint(
            ["name"],
            ["queue.name"],
            name="q_fkey",
            ondelete="RESTRICT",
            deferrable=True,
            initially="DEFERRED",
        ),
        ForeignKeyConstraint(
            ["dead_letter"],
            ["queue.name"],
            name="dlq_fkey",
            ondelete="RESTRICT",
            deferrable=True,
            initially="DEFERRED",
        ),
        Index(
            "job_i1",
            "name",
            _key(),
            unique=True,
            postgresql_where=text("state = 'created' AND policy = 'short'"),
        ),
        Index(
            "job_i2",
            "name",
            _key(),
            unique=True,
            postgresql_where=text("state = 'active' AND policy = 'singleton'"),
        ),
        Index(
            "job_i3",
            "name",
            "state",
            _key(),
            unique=True,
            postgresql_where=text("state <= 'active' AND policy = 'stately'"),
        ),
        Index(
            "job_i4",
            "name",
            "singleton_on",
            _key(),
            unique=True,
            postgresql_where=text("state <> 'cancelled' AND singleton_on IS NOT NULL"),
        ),
        Index(
            "job_i5",
            "name",
            "start_after",
            postgresql_include=["priority", "created_on", "id"],
            postgresql_where=text("state < 'active'"),
        ),
        Index(
            "job_i6",
            "name",
            _key(),
            unique=True,
            postgresql_where=text("state <= 'active' AND policy = 'exclusive'"),
        ),
    )
