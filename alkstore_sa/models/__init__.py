"""Declarative models of the pg-boss schema-26 tables.

The tables are declared in the placeholder schema :data:`~alkstore_sa.names.DEFAULT_SCHEMA`
(``pgboss``); services and migrations map it to the schema in use with
``schema_translate_map``, so one set of models serves every schema.

Each class is named after its table with a ``Row`` suffix (:class:`JobRow` maps
``job``) so that it is never confused with the values the services return
(:class:`alkstore_sa.Job` is a job as read, not a mapped row).
"""

from .attempts import ATTEMPT_TABLE, JobAttemptRow
from .base import Base, metadata
from .claims import CLAIM_TABLE, CLAIMER_TABLE, ClaimerRow, ClaimRow
from .enums import JobState, QueuePolicy, job_state_type
from .tables import JobCommonRow, JobRow, QueueRow, ScheduleRow, SubscriptionRow, VersionRow

__all__ = [
    "ATTEMPT_TABLE",
    "CLAIMER_TABLE",
    "CLAIM_TABLE",
    "Base",
    "ClaimRow",
    "ClaimerRow",
    "JobAttemptRow",
    "JobCommonRow",
    "JobRow",
    "JobState",
    "QueuePolicy",
    "QueueRow",
    "ScheduleRow",
    "SubscriptionRow",
    "VersionRow",
    "job_state_type",
    "metadata",
]
