"""Our workers' claims at schema 26: which worker holds which attempt, and whether it lives.

Schema 26 (pg-boss 11.1.x) has no heartbeats, so a job whose worker died would stay
``active`` until its lease (``expire_seconds``) runs out. Our workers' claims record
each job they activate in ``alkstore_claim`` (in the claim statement itself) and each
worker renews its own row in ``alkstore_claimer``; a live worker's sweep fails for retry
the jobs still active in a recorded attempt whose claimer stopped renewing (the
"Guarantees" page). Node's claims never write them, so Node's jobs are never touched.
Both names start with ``alkstore_``: Node pg-boss, its drift check and users'
autogenerate filters leave them alone, as the attempt history.
"""

from __future__ import annotations

import datetime as dt
import uuid

from sqlalchemy import DateTime, Integer, PrimaryKeyConstraint, Table, Text
from sqlalchemy.dialects.postgresql import UUID
from sqlalchemy.orm import Mapped, mapped_column

from .base import Base

CLAIM_TABLE = "alkstore_claim"
"""The claims' table name (in the queue schema)."""

CLAIMER_TABLE = "alkstore_claimer"
"""The claimers' (workers') liveness table name (in the queue schema)."""


class ClaimRow(Base):
    """One attempt a worker of ours claimed: the job, and when that attempt started."""

    __tablename__ = CLAIM_TABLE
    __table_args__ = (PrimaryKeyConstraint("job_id", name="alkstore_claim_pkey"),)

    job_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    name: Mapped[str] = mapped_column(Text)
    started_on: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    """The attempt's ``started_on``: a row of an earlier attempt matches no active job."""
    owner: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    """The claiming worker (:class:`ClaimerRow`)."""


class ClaimerRow(Base):
    """One running worker: renewed by its lease keeper, one statement per interval."""

    __tablename__ = CLAIMER_TABLE
    __table_args__ = (PrimaryKeyConstraint("owner", name="alkstore_claimer_pkey"),)

    owner: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True))
    renewed_on: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    lapse_seconds: Mapped[int] = mapped_column(Integer)
    """Its claims are rescued once ``renewed_on + lapse_seconds`` has passed."""


CLAIM: Table = ClaimRow.__table__  # type: ignore[assignment]
CLAIMER: Table = ClaimerRow.__table__  # type: ignore[assignment]
