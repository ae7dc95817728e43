"""alkstore_sa: a PostgreSQL job queue for SQLAlchemy, schema-compatible with pg-boss 26.

>>> from alkstore_sa import QueueService
>>> with Session(engine) as session, session.begin():      # doctest: +SKIP
...     session.add(order)
...     session.flush()                                     # order.id is known now
...     QueueService(session).send("emails", {"order": order.id})
"""

from ._version import __version__ as __version__
from .backends import Backend
from .errors import (
    AlkstoreError,
    FlowConflictError,
    ForeignRevisionError,
    InvalidNameError,
    InvalidOptionsError,
    JobLostError,
    PooledConnectionError,
    QueueExistsError,
    QueueNotFoundError,
    SchemaCatalogError,
    SchemaFeatureError,
    SchemaHealthError,
    SchemaNotInstalledError,
    SchemaProfileError,
    SchemaVersionChangedError,
    SchemaVersionError,
    UnfinishedIndexBuildError,
    UnknownPolicyError,
)
from .groups import GroupConcurrencyConfig
from .models.enums import JobState, QueuePolicy
from .names import DEFAULT_SCHEMA, SCHEMA_VERSION
from .options import FlowJob, JobSpec, QueueOptions, SendOptions, TimedSendOptions, UpdateOptions
from .records import (
    EventSubscription,
    FailResult,
    Instance,
    Job,
    JobAttempt,
    JobCounts,
    JobDependency,
    JobOutcome,
    JobPage,
    NotSettled,
    PersistedWarning,
    QueueInfo,
    QueueStats,
    QueueStatsPercentile,
    QueueStatsSnapshot,
    QueueWarning,
    ScheduleInfo,
    Settled,
    Settlement,
    SupervisionReport,
    UnreadableJob,
    UpdateResult,
    UpsertResult,
)
from .service import QueueService
from .service_async import AsyncQueueService
from .worker import AsyncWorker, HandlerSpec, Listener, QueueCounts, Worker
from .worker.listener import Subscription

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "AlkstoreError",
    "AsyncQueueService",
    "AsyncWorker",
    "Backend",
    "EventSubscription",
    "FailResult",
    "FlowConflictError",
    "FlowJob",
    "ForeignRevisionError",
    "GroupConcurrencyConfig",
    "HandlerSpec",
    "Instance",
    "InvalidNameError",
    "InvalidOptionsError",
    "Job",
    "JobAttempt",
    "JobCounts",
    "JobDependency",
    "JobLostError",
    "JobOutcome",
    "JobPage",
    "JobSpec",
    "JobState",
    "Listener",
    "NotSettled",
    "PersistedWarning",
    "PooledConnectionError",
    "QueueCounts",
    "QueueExistsError",
    "QueueInfo",
    "QueueNotFoundError",
    "QueueOptions",
    "QueuePolicy",
    "QueueService",
    "QueueStats",
    "QueueStatsPercentile",
    "QueueStatsSnapshot",
    "QueueWarning",
    "ScheduleInfo",
    "SchemaCatalogError",
    "SchemaFeatureError",
    "SchemaHealthError",
    "SchemaNotInstalledError",
    "SchemaProfileError",
    "SchemaVersionChangedError",
    "SchemaVersionError",
    "SendOptions",
    "Settled",
    "Settlement",
    "Subscription",
    "SupervisionReport",
    "TimedSendOptions",
    "UnfinishedIndexBuildError",
    "UnknownPolicyError",
    "UnreadableJob",
    "UpdateOptions",
    "UpdateResult",
    "UpsertResult",
    "Worker",
]
