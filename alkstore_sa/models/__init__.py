"""Declarative models of the pg-boss schema-26 tables.

The tables are declared in the placeholder schema :data:`~alkstore_sa.names.DEFAULT_SCHEMA`
(``pgboss``); services and migrations map it to the schema in use with
``schema_translate_map``, so one set of models serves every schema.
"""

from .base import Base, metadata
from .enums import JobState, QueuePolicy, job_state_type
from .tables import Job, JobCommon, Queue, Schedule, Subscription, Version

__all__ = [
    "Base",
    "Job",
    "JobCommon",
    "JobState",
    "Queue",
    "QueuePolicy",
    "Schedule",
    "Subscription",
    "Version",
    "job_state_type",
    "metadata",
]
