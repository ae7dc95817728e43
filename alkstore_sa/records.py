"""Frozen records returned by the services (never ORM instances)."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .models.enums import JobState, QueuePolicy


@dataclass(frozen=True, slots=True)
class Job:
    """A job row as it was when the statement that returned it ran."""

    id: uuid.UUID
    name: str
    data: Any
    state: JobState
    priority: int
    retry_limit: int
    retry_count: int
    retry_delay: int
    retry_backoff: bool
    retry_delay_max: int | None
    expire_seconds: int
    deletion_seconds: int
    singleton_key: str | None
    singleton_on: dt.datetime | None
    start_after: dt.datetime
    created_on: dt.datetime
    started_on: dt.datetime | None
    completed_on: dt.datetime | None
    keep_until: dt.datetime
    output: Any
    dead_letter: str | None
    policy: str | None

    @property
    def queue(self) -> str:
        """The queue name (alias of :attr:`name`)."""
        return self.name

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Job:
        values = dict(row)
        values["state"] = JobState(values["state"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue's settings and its counters as last cached by the monitor."""

    name: str
    policy: QueuePolicy
    retry_limit: int
    retry_delay: int
    retry_backoff: bool
    retry_delay_max: int | None
    expire_seconds: int
    retention_seconds: int
    deletion_seconds: int
    dead_letter: str | None
    partition: bool
    table_name: str
    deferred_count: int
    queued_count: int
    warning_queued: int
    active_count: int
    total_count: int
    singletons_active: list[str] | None
    monitor_on: dt.datetime | None
    maintain_on: dt.datetime | None
    created_on: dt.datetime
    updated_on: dt.datetime

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> QueueInfo:
        values = dict(row)
        values["policy"] = QueuePolicy(values["policy"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Live counts of one queue's jobs, computed when asked."""

    name: str
    deferred_count: int
    queued_count: int
    active_count: int
    total_count: int
    singletons_active: list[str]


@dataclass(frozen=True, slots=True)
class ScheduleInfo:
    """A stored cron schedule."""

    name: str
    key: str
    cron: str
    timezone: str | None
    data: Any
    options: dict[str, Any] | None
    created_on: dt.datetime
    updated_on: dt.datetime


@dataclass(frozen=True, slots=True)
class Settled:
    """What ``complete``/``fail``/``cancel``/... did: ids asked for and ids changed."""

    requested: int
    affected: list[uuid.UUID]

    @property
    def count(self) -> int:
        """How many jobs changed."""
        return len(self.affected)
