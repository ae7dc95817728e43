"""The job indexes and the functions added or replaced by pg-boss schema versions 38 to 46.

Like :mod:`alkstore_sa.migrations.functions` (27 to 37), function bodies are
alkstore_sa's own code with pg-boss's names and signatures, and each version's
``create_queue`` is kept so that a downgrade restores the one it replaced.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .functions import (
    HEARTBEAT_COLUMN,
    I4,
    I7,
    I8,
    I9,
    NOTIFY_COLUMN,
    POLICY_CHECKS_28,
    POLICY_INDEXES_27,
    QUEUE_COLUMNS_26,
    create_queue_function,
)
from .helpers import JobIndex

# ------------------------------------------------------------------ job indexes

I10 = JobIndex(
    "i10",
    "name, singleton_key, state DESC, created_on, id",
    "state < 'active' AND NOT blocked AND policy = 'key_strict_fifo'",
    include="start_after",
)
"""The head of each key on ``key_strict_fifo`` queues, index-only (schema 38)."""
I11 = JobIndex(
    "i11", "name, priority DESC, created_on, start_after", "state < 'active' AND NOT blocked"
)
"""The fetch index in the fetch's own order; replaces i5 (schema 40)."""
I5 = JobIndex("i5", "name, start_after", "state < 'active' AND NOT blocked")
"""The fetch index i11 replaces, as schema 33 to 39 have it."""
I12 = JobIndex("i12", "source_root_id", "source_root_id IS NOT NULL")
"""Dead-letter/redrive chains by their first job, across queues (schema 43)."""
I13 = JobIndex("i13", "name, singleton_key", "state = 'created' AND upsert_by_key", unique=True)
"""One queued upserted job per key (schema 45)."""
I14 = JobIndex(
    "i14", "name, state, blocked, start_after", "state IN ('created', 'retry', 'active', 'failed')"
)
"""Live jobs, for the monitor's counts (schema 46)."""
I15 = JobIndex("i15", "name, created_on")
"""Every job by creation time (schema 46)."""
I16 = JobIndex("i16", "name, completed_on", "completed_on IS NOT NULL")
"""Finished jobs by completion time, for maintenance (schema 46)."""
I17 = JobIndex(
    "i17", "name, singleton_key, created_on", "state < 'active' AND singleton_key IS NOT NULL"
)
"""Queued jobs by key, for update() and upsert() by key (schema 46)."""

# ------------------------------------------------------------------ job_now()

JOB_NOW = """
CREATE OR REPLACE FUNCTION @S@.job_now()
RETURNS timestamp with time zone
LANGUAGE sql
STABLE
AS $body$ SELECT pg_catalog.now() $body$
"""
"""The schema's clock (schema 42): the transaction timestamp. A one-line SQL function,
STABLE so that the planner inlines it and a statement reads one time throughout."""

# ------------------------------------------------------------------ create_queue

POLICY_INDEXES_38: Mapping[str, Sequence[JobIndex]] = {
    **POLICY_INDEXES_27,
    "key_strict_fifo": (I8, I10),
}
_COLUMNS_33 = (*QUEUE_COLUMNS_26, HEARTBEAT_COLUMN, NOTIFY_COLUMN)
# From 42 on, the queue row is stamped with the schema's clock.
_COLUMNS_42 = (*_COLUMNS_33, ("created_on", "@S@.job_now()"), ("updated_on", "@S@.job_now()"))

QUEUE_COLUMNS_46 = _COLUMNS_42
"""The queue row ``create_queue`` writes at 46: ``(column, expression)``, ``@S@`` the schema."""

CREATE_QUEUE_38 = create_queue_function(
    _COLUMNS_33, (I5, I4, I7, I9), POLICY_INDEXES_38, POLICY_CHECKS_28
)
"""Schema 38: ``key_strict_fifo`` partitions also get the head index i10."""

CREATE_QUEUE_40 = create_queue_function(
    _COLUMNS_33, (I11, I4, I7, I9), POLICY_INDEXES_38, POLICY_CHECKS_28
)
"""Schema 40 (current through 41): the fetch index i11 instead of i5."""

CREATE_QUEUE_42 = create_queue_function(
    _COLUMNS_42, (I11, I4, I7, I9), POLICY_INDEXES_38, POLICY_CHECKS_28
)
"""Schema 42: the queue's ``created_on``/``updated_on`` come from ``job_now()``."""

CREATE_QUEUE_43 = create_queue_function(
    _COLUMNS_42, (I11, I4, I7, I9, I12), POLICY_INDEXES_38, POLICY_CHECKS_28
)
"""Schema 43 (current through 44): the lineage index i12."""

CREATE_QUEUE_45 = create_queue_function(
    _COLUMNS_42, (I11, I4, I7, I9, I12, I13), POLICY_INDEXES_38, POLICY_CHECKS_28
)
"""Schema 45: the upsert index i13."""

CREATE_QUEUE_46 = create_queue_function(
    _COLUMNS_42,
    (I11, I4, I7, I9, I12, I13, I14, I15, I16, I17),
    POLICY_INDEXES_38,
    POLICY_CHECKS_28,
)
"""Schema 46: the monitor and maintenance indexes i14 to i17."""
