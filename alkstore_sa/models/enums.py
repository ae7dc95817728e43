"""Job states and queue policies."""

from __future__ import annotations

import enum

from sqlalchemy.dialects.postgresql import ENUM

from ..names import DEFAULT_SCHEMA


class JobState(enum.StrEnum):
    """The states of a job, **in lifecycle order**.

    The order is semantic: the SQL compares states with ``<`` and ``>``
    (queued = ``state < 'active'``, finished = ``state > 'active'``), exactly as
    pg-boss does, so members must never be reordered.
    """

    CREATED = "created"
    RETRY = "retry"
    ACTIVE = "active"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    FAILED = "failed"


class QueuePolicy(enum.StrEnum):
    """How a queue treats jobs that share a ``singleton_key``.

    * ``standard`` - no restriction (only throttling slots apply).
    * ``short`` - at most one *created* job per key; a second send returns ``None``.
    * ``singleton`` - at most one *active* job per key.
    * ``stately`` - at most one job per key in each of created, retry and active.
    * ``exclusive`` - at most one queued-or-active job per key.
    * ``key_strict_fifo`` - each key's jobs run one at a time, in the order sent;
      every job needs a key. Only on schemas at version 46 (pg-boss 12): a schema-26
      queue cannot have it.
    """

    STANDARD = "standard"
    SHORT = "short"
    SINGLETON = "singleton"
    STATELY = "stately"
    EXCLUSIVE = "exclusive"
    KEY_STRICT_FIFO = "key_strict_fifo"


job_state_type = ENUM(
    *[s.value for s in JobState],
    name="job_state",
    schema=DEFAULT_SCHEMA,
    metadata=None,
    create_type=False,
)
"""The ``job_state`` enum type (schema translated like the tables)."""
