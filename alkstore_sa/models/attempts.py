"""The attempt history: every failed attempt's error, a table of ours beside pg-boss's.

pg-boss keeps only the last attempt's output in the job row. ``alkstore_job_attempt``
keeps each failed attempt (when, which attempt, why, the error written, which worker),
up to :data:`~alkstore_sa.limits.ATTEMPTS_KEPT` per job. Its name starts with
``alkstore_``, so Node pg-boss, its drift check and users' autogenerate filters leave it
alone (the "Attempt history" page). It is written by the statement that fails the
attempt and read by :meth:`~alkstore_sa.QueueService.get_job_attempts`; supervision
removes the rows of jobs that no longer exist.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import (
    BigInteger,
    DateTime,
    Identity,
    Index,
    Integer,
    PrimaryKeyConstraint,
    Table,
    Text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base

ATTEMPT_TABLE = "alkstore_job_attempt"
"""The attempt history's table name (in the queue schema)."""


class JobAttemptRow(Base):
    """One failed attempt of one job."""

    __tablename__ = ATTEMPT_TABLE
    __table_args__ = (
        PrimaryKeyConstraint("id", name="alkstore_job_attempt_pkey"),
        # A job's attempts, newest last: the job page, get_job_attempts and the trim of
        # each fail read this.
        Index("alkstore_job_attempt_i1", "name", "job_id", "id"),
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=False))
    name: Mapped[str] = mapped_column(Text)
    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    attempt: Mapped[int] = mapped_column(Integer)
    """1 for the first attempt: the job's ``retry_count`` during it, plus one."""
    cause: Mapped[str] = mapped_column(Text)
    """``failed`` (a handler or a client failed it), ``expired`` (its lease ran out),
    ``heartbeat`` (its heartbeat stopped) or ``poison`` (a row no worker can run)."""
    failed_on: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    started_on: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True))
    error: Mapped[Any] = mapped_column(JSONB, nullable=True)
    """The output the fail wrote (``{name, message, stack}`` for a Python exception)."""
    worker: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))


ATTEMPT: Table = JobAttemptRow.__table__  # type: ignore[assignment]
"""The attempt history table (Core), for statements and DDL."""
