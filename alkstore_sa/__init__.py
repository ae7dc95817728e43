"""alkstore_sa: a PostgreSQL job queue for SQLAlchemy, schema-compatible with pg-boss 26.

>>> from alkstore_sa import QueueService
>>> with Session(engine) as session, session.begin():      # doctest: +SKIP
...     session.add(order)
...     session.flush()                                     # order.id is known now
...     QueueService(session).send("emails", {"order": order.id})
"""

from .errors import (
    AlkstoreError,
    ForeignRevisionError,
    InvalidNameError,
    InvalidOptionsError,
    JobLostError,
    QueueExistsError,
    QueueNotFoundError,
    SchemaNotInstalledError,
    SchemaVersionError,
)
from .models.enums import JobState, QueuePolicy
from .names import DEFAULT_SCHEMA, SCHEMA_VERSION
from .options import JobSpec, QueueOptions, SendOptions
from .records import Job, QueueInfo, QueueStats, ScheduleInfo, Settled, UnreadableJob
from .service import QueueService
from .service_async import AsyncQueueService
from .worker import AsyncWorker, Worker

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_SCHEMA",
    "SCHEMA_VERSION",
    "AlkstoreError",
    "AsyncQueueService",
    "AsyncWorker",
    "ForeignRevisionError",
    "InvalidNameError",
    "InvalidOptionsError",
    "Job",
    "JobLostError",
    "JobSpec",
    "JobState",
    "QueueExistsError",
    "QueueInfo",
    "QueueNotFoundError",
    "QueueOptions",
    "QueuePolicy",
    "QueueService",
    "QueueStats",
    "ScheduleInfo",
    "SchemaNotInstalledError",
    "SchemaVersionError",
    "SendOptions",
    "Settled",
    "UnreadableJob",
    "Worker",
]
