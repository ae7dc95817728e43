"""Frozen records returned by the services (never ORM instances)."""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .limits import MAX_JSON_DEPTH
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
    # The columns schema 46 (pg-boss 12) adds; on a schema-26 database they keep
    # these defaults (the "Compatibility with pg-boss, and deliberate differences" page).
    group_id: str | None = None
    group_tier: str | None = None
    heartbeat_on: dt.datetime | None = None
    heartbeat_seconds: int | None = None
    blocked: bool = False
    blocking: bool = False
    pending_dependencies: int = 0
    source_name: str | None = None
    source_id: uuid.UUID | None = None
    source_created_on: dt.datetime | None = None
    source_retry_count: int | None = None
    source_output: Any = None
    source_root_id: uuid.UUID | None = None
    trace_context: Any = None
    upsert_by_key: bool | None = None

    @property
    def queue(self) -> str:
        """The queue name (alias of :attr:`name`)."""
        return self.name

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Job:
        """From a row of the job table (every column of :class:`Job`)."""
        values = dict(row)
        values["state"] = JobState(values["state"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class UnreadableJob(Job):
    """A job row holding values Python cannot represent (written by another client).

    Returned by ``get_job``, ``get_jobs`` and ``list_jobs`` so that one such row never
    makes them fail; ``fetch`` never returns one: it fails the job instead (see
    the "Limits" page). Each field named in :attr:`unreadable` holds a
    stand-in: ``None`` for JSON, the nearest readable instant for a timestamp.
    """

    unreadable: dict[str, str] = field(default_factory=dict)
    """Why each unreadable field could not be read, by field name."""


# A JSON string (escapes included) or a bracket; brackets inside strings do not nest.
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|([\[{])|[\]}]')


def json_text_depth_exceeds(text: str, limit: int) -> bool:
    """Does the JSON ``text`` nest arrays and objects more than ``limit`` levels?

    ``[]`` is one level, as for :func:`alkstore_sa.options.json_depth_exceeds`. Text
    with at most ``limit`` brackets cannot be deeper, and counting them is cheap, so
    ordinary documents are never scanned.
    """
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for token in _JSON_TOKEN.finditer(text):
        if token.group(1):
            depth += 1
            if depth > limit:
                return True
        elif token.group()[0] != '"':
            depth -= 1
    return False


def decode_json(text: str | None) -> tuple[Any, str | None]:
    """Decode a JSON column read as text: ``(value, None)``, or ``(None, why)`` when
    the text nests past :data:`~alkstore_sa.limits.MAX_JSON_DEPTH` or does not decode.

    The depth is checked before decoding: Python's decoder recurses once per level
    and would raise ``RecursionError`` (or exhaust a small thread stack) on it.
    """
    if text is None:
        return None, None
    if json_text_depth_exceeds(text, MAX_JSON_DEPTH):
        return None, f"nests arrays and objects deeper than {MAX_JSON_DEPTH} levels"
    try:
        return json.loads(text), None
    except (RecursionError, ValueError) as exc:
        return None, f"cannot be decoded: {type(exc).__name__}: {exc}"


JSON_FIELDS = ("data", "output", "source_output", "trace_context")
"""The fields of :class:`Job` read from jsonb columns (as text, see :func:`read_job`)."""


OUTSIDE_DATETIME = " is outside the range of Python's datetime"
"""How :func:`read_record` ends the problem of a clamped timestamp, after its stored text."""


def read_record(
    row: Mapping[Any, Any], json_fields: Sequence[str], quiet: Sequence[str] = ()
) -> tuple[dict[str, Any], dict[str, str]]:
    """The values of a row of :func:`alkstore_sa.sql.common.reading.readable_columns`, its
    ``json_fields`` decoded, and what could not be read, by field name (a stand-in
    is in its place: ``None`` for JSON, the nearest instant for a timestamp).

    Never raises for what the row holds. A field in ``quiet`` that does not decode
    is ``None`` without a problem."""
    return _read_values(dict(row), json_fields, quiet)


def _read_values(
    values: dict[str, Any], json_fields: Sequence[str], quiet: Sequence[str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """:func:`read_record` on a dict of the row's values (changed in place)."""
    problems: dict[str, str] = {}
    marks = values.pop("unreadable")
    if marks:
        for mark in marks.split(";"):
            name, _, stored = mark.partition("=")
            problems[name] = stored + OUTSIDE_DATETIME
    for name in json_fields:
        text = values.get(name)
        if text is None:
            continue  # SQL NULL, or a schema-26 row (no source_output, trace_context)
        values[name], problem = decode_json(text)
        if problem is not None and name not in quiet:
            problems[name] = problem
    return values, problems


_QUIET_TRACE = ("trace_context",)


def read_job(row: Mapping[Any, Any]) -> Job:
    """A :class:`Job` from a row of :func:`alkstore_sa.sql.common.reading.readable_columns`.

    Never raises for what the row holds: a row with values Python cannot represent
    becomes an :class:`UnreadableJob`.
    """
    return _job(dict(row))


def read_jobs(keys: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[Job]:
    """:func:`read_job` for each of ``rows`` (tuples of the values of ``keys``, as
    ``Result.keys()`` and ``Result.all()`` give them): the hot path of a claim,
    which skips building a mapping per row."""
    return [_job(dict(zip(keys, row, strict=True))) for row in rows]


def _job(values: dict[str, Any]) -> Job:
    # A trace context Python cannot read is no trace context: tracing never
    # fails a job (alkstore_sa/tracing.py).
    values, problems = _read_values(values, JSON_FIELDS, _QUIET_TRACE)
    values["state"] = JobState(values["state"])
    if problems:
        return UnreadableJob(**values, unreadable=problems)
    return Job(**values)


@dataclass(frozen=True, slots=True)
class QueueInfo:
    """A queue's settings and its counters as last cached by the monitor.

    ``policy`` is a :class:`QueuePolicy`, or the raw text of a policy this release
    does not know (written by another client): such a queue is listed, never served
    (:class:`~alkstore_sa.errors.UnknownPolicyError`)."""

    name: str
    policy: QueuePolicy | str
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
    # Settings schema 46 (pg-boss 12) adds; on a schema-26 database they keep
    # these defaults.
    heartbeat_seconds: int | None = None
    notify: bool = False
    unreadable: dict[str, str] = field(default_factory=dict)
    """Times another client wrote that Python cannot hold (``infinity``, a year past
    9999), with their stored text; the nearest time Python holds stands in. Empty for
    a row that is fine."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> QueueInfo:
        """From a row of the queue table (read through ``readable_columns``: never
        raises for a time it holds); a policy this release does not know is kept as its
        text."""
        values, problems = read_record(row, ()) if "unreadable" in row else (dict(row), {})
        if values["policy"] in QueuePolicy.__members__.values():
            values["policy"] = QueuePolicy(values["policy"])
        # else kept as written (see the class)
        return cls(**values, unreadable=problems)


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
    """A stored schedule.

    ``cron`` holds its expression whatever the format; ``kind`` says which:
    ``"cron"`` or, at schema 46, ``"rrule"`` (an RFC 5545 recurrence rule).
    ``last_job_id`` (schema 46) is the job its latest occurrence sent, or
    ``None``; at schema 26 it is always ``None``.
    """

    name: str
    key: str
    cron: str
    timezone: str | None
    data: Any
    options: dict[str, Any] | None
    created_on: dt.datetime
    updated_on: dt.datetime
    kind: str = "cron"
    last_job_id: uuid.UUID | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
    """Fields another client wrote that Python cannot read, with why (``data`` or
    ``options`` is then ``None``); empty for a row that is fine. Such a schedule
    is reported and skipped when it is due."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> ScheduleInfo:
        """From a row of ``readable_columns``: never raises for what it holds."""
        values, problems = read_record(row, ("data", "options"))
        return cls(**values, unreadable=problems)


@dataclass(frozen=True, slots=True)
class EventSubscription:
    """A queue's subscription to a published event (a ``subscription`` row):
    :meth:`~alkstore_sa.QueueService.publish` of ``event`` sends a job to ``name``."""

    event: str
    name: str
    created_on: dt.datetime
    updated_on: dt.datetime
    unreadable: dict[str, str] = field(default_factory=dict)
    """Times another client wrote that Python cannot hold, with their stored text (the
    nearest time Python holds stands in); empty for a row that is fine."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> EventSubscription:
        """From a row of ``readable_columns``: never raises for what it holds."""
        values, problems = read_record(row, ())
        return cls(**values, unreadable=problems)


# ---------------------------------------------------------------- results
#
# One result type per family of calls (the "API reference" page, "Results"):
# calls that change jobs named by id or Job return Settled (FailResult for fail,
# which also says where each job went); calls that delete by state return an
# int count; supervision returns a SupervisionReport.


@dataclass(frozen=True, slots=True)
class Settlement:
    """One item of ``complete_many``/``fail_many``/``extend_leases``: a job id, its
    output and, for worker code, the fencing token.

    With ``started_on`` (the fetched :class:`Job`'s) the settlement is fenced: it
    applies only while the job is still ``active`` in the attempt that started
    then. Without it (``None``) it is UNFENCED and follows pg-boss's by-id rules;
    ``extend_leases`` is always fenced, so an unfenced item matches no job there.
    Passing the fetched Job, or ``(job, output)``, builds the fenced form for you.
    """

    id: uuid.UUID
    output: Any = None
    started_on: dt.datetime | None = None


class NotSettled(enum.StrEnum):
    """Why a job named in a settle call was left as it was (see :class:`JobOutcome`)."""

    NOT_FOUND = "not_found"
    """No job with that id, in any queue."""
    WRONG_QUEUE = "wrong_queue"
    """The id is a job of another queue (:attr:`JobOutcome.queue` names it)."""
    NOT_ACTIVE = "not_active"
    """The job is in a state the call does not apply to: not ``active`` for
    ``complete`` and for a fetched Job, finished for an unfenced ``fail`` (by id)."""
    NOT_OURS = "not_ours"
    """The job is ``active`` again, in another attempt than the fetched Job's
    (its lease lapsed and it was fetched again): the fence refused it."""


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What a settle call did to one job it was given (``per_job=True``).

    One per item, in the order given. ``reason`` is ``None`` when the job was
    settled, else why not; ``state`` is the job's state after the call (the new
    one when settled; ``None`` when there is no such job); ``queue`` is the queue
    the job was found in (another than the call's for ``wrong_queue``).

    :ivar id: the job's id.
    :ivar settled: whether the call changed the job.
    :ivar reason: a :class:`NotSettled` member, or ``None``.
    :ivar state: the job's state after the call, or ``None``.
    :ivar queue: the queue holding the job, or ``None``.
    """

    id: uuid.UUID
    settled: bool
    reason: NotSettled | None
    state: JobState | None
    queue: str | None


@dataclass(frozen=True, slots=True)
class Settled:
    """What a call that changes jobs by id (or by fetched :class:`Job`) did.

    Returned by ``complete``, ``complete_many``, ``cancel``, ``resume``, ``retry``,
    ``delete_job`` and ``delete_jobs``; ``fail`` and ``fail_many`` return a
    :class:`FailResult`, a Settled that also says where each failed job went.
    ``requested - count`` jobs were unknown, or not in a state the call applies
    to (a stale fenced settlement included). Deletes by state
    (``delete_queued_jobs`` ...) know no ids and return a count instead.

    :ivar requested: how many jobs the call named.
    :ivar affected: the ids of the jobs it changed.
    :ivar outcomes: per job, whether it changed and why not (``per_job=True``).
    """

    requested: int
    affected: list[uuid.UUID]
    outcomes: list[JobOutcome] | None = field(default=None, kw_only=True)
    """With ``per_job=True`` (``complete_many``, ``fail_many``): one
    :class:`JobOutcome` per item, in the order given; else ``None``."""

    @property
    def count(self) -> int:
        """How many jobs changed."""
        return len(self.affected)


@dataclass(frozen=True, slots=True)
class FailResult(Settled):
    """What ``fail`` or ``fail_many`` did: a :class:`Settled` with each job's new state.

    A job with retries left went to ``retry`` (with its delay and backoff); the
    others to ``failed``, each with a copy sent to its dead letter queue if it
    has one.

    :ivar states: the new state of each affected job (``retry`` or ``failed``).
    :ivar dead_lettered: how many copies were sent to dead letter queues.
    """

    states: dict[uuid.UUID, JobState]
    dead_lettered: int

    @property
    def retried(self) -> list[uuid.UUID]:
        """The affected jobs that will be tried again."""
        return [i for i in self.affected if self.states.get(i) == JobState.RETRY]

    @property
    def failed(self) -> list[uuid.UUID]:
        """The affected jobs that failed for good."""
        return [i for i in self.affected if self.states.get(i) == JobState.FAILED]


@dataclass(frozen=True, slots=True)
class QueueWarning:
    """A queue holds more queued jobs than its threshold (found by supervision).

    :ivar queue: the queue's name.
    :ivar queued: its queued (created and retry) jobs when counted.
    :ivar threshold: the queue's ``warning_queued``, else the supervisor's
        ``warning_queue_size``.
    """

    queue: str
    queued: int
    threshold: int


@dataclass(frozen=True, slots=True)
class SupervisionReport:
    """What one supervision pass did (empty collections: nothing to do, or not our turn).

    Returned by ``QueueService.supervise`` and by the supervisors' ``run_once``.

    :ivar monitored: queues whose counters this pass refreshed (it won their turn).
    :ivar warnings: queues over their queued-jobs threshold.
    :ivar expired: active jobs failed for running past their lease, per queue.
    :ivar maintained: queues whose old jobs this pass deleted (it won their turn).
    :ivar deleted: jobs deleted per queue.
    :ivar cron_checked: this pass won the cluster-wide cron turn and evaluated schedules.
    :ivar fired: schedules (``"<queue>__<key>"``) sent to ``__pgboss__send-it``.
    :ivar sent: jobs created in their target queues from ``__pgboss__send-it``.
    :ivar skew_seconds: database clock minus local clock, as last measured.
    :ivar busy: steps skipped because another session held their advisory lock.
    :ivar errors: steps that failed (each also logged).
    :ivar recorded: queues whose queue-stats history row this pass wrote (schema 46;
        see the "Supervision and cron" page, "Queue-stats history").
    :ivar flows_resolved: completed flow parents resolved (schema 46, flow turn).
    :ivar released: flow children unblocked because their last parent completed.
    :ivar bam: ``bam`` commands run, as ``"<name> (<table>): completed|failed"``.
    :ivar reindexed: job indexes rebuilt (and ``*_ccnew`` leftovers dropped).
    """

    monitored: tuple[str, ...] = ()
    warnings: tuple[QueueWarning, ...] = ()
    expired: Mapping[str, int] = field(default_factory=dict)
    maintained: tuple[str, ...] = ()
    deleted: Mapping[str, int] = field(default_factory=dict)
    cron_checked: bool = False
    fired: tuple[str, ...] = ()
    sent: int = 0
    skew_seconds: float | None = None
    busy: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    recorded: tuple[str, ...] = ()
    flows_resolved: int = 0
    released: int = 0
    bam: tuple[str, ...] = ()
    reindexed: tuple[str, ...] = ()

    @property
    def idle(self) -> bool:
        """True when the pass changed nothing and found nothing to report."""
        return not (
            self.monitored
            or self.maintained
            or self.cron_checked
            or self.sent
            or self.errors
            or self.flows_resolved
            or self.bam
            or self.reindexed
        )


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """What ``QueueService.update`` edited (pg-boss's UpdateResponse).

    :ivar jobs: ids of the jobs edited in place.
    :ivar updated: how many (``len(jobs)``); 0 when no job that has not started
        matched.
    """

    jobs: tuple[uuid.UUID, ...] = ()
    updated: int = 0


@dataclass(frozen=True, slots=True)
class UpsertResult(UpdateResult):
    """What ``QueueService.upsert`` did (pg-boss's UpsertResponse): it either edited
    the matching job(s) in place (``updated``) or inserted one (``inserted``).

    :ivar inserted: 1 when a new job was inserted, else 0.
    :ivar rejected: neither happened: the queue's policy refused a new job (say an
        ``exclusive`` queue whose key is active), the upsert deadlocked with another
        transaction, or, at REPEATABLE READ and above, a concurrent upsert's job is
        not visible to this transaction. Nothing was written; the transaction stays
        usable.
    """

    inserted: int = 0

    @property
    def rejected(self) -> bool:
        """No job was edited and none inserted."""
        return self.updated == 0 and self.inserted == 0


@dataclass(frozen=True, slots=True)
class JobDependency:
    """A parent or a child of a flow job (schema 46), as
    ``QueueService.get_dependencies`` and ``get_dependents`` return it: pg-boss's
    ``DependencyRef`` (``name``, ``id``) with the job's state.

    :ivar name: the related job's queue.
    :ivar id: the related job's id.
    :ivar state: its state when read; ``None`` if the job no longer exists (it was
        deleted, and maintenance has not yet dropped the dependency).
    """

    name: str
    id: uuid.UUID
    state: JobState | None


# ---------------------------------------------------------------- observability


@dataclass(frozen=True, slots=True)
class QueueStatsPercentile:
    """One percentile of a snapshot's wait and run histograms, in seconds.

    :ivar p: the percent asked for (1 to 100).
    :ivar wait_seconds: the wait time under which ``p`` percent of the jobs
        fall (``None`` when the snapshot has no wait histogram or it is empty).
    :ivar run_seconds: the same for run times.
    """

    p: float
    wait_seconds: float | None
    run_seconds: float | None


@dataclass(frozen=True, slots=True)
class QueueStatsSnapshot:
    """One point of a queue's recorded statistics (schema 46; pg-boss's ``QueueStats``).

    Returned by ``QueueService.get_queue_stats_history``: a ``queue_stats`` row
    (written by a supervision pass, ours or Node's, with queue-stats history on),
    or one bucket of them. The gauges (``*_count``) are the queue's counts when
    captured (in a bucket: their max, min or rounded mean); the deltas are the
    jobs created, completed and failed for good in the ``delta_seconds`` before
    ``delta_on`` (in a bucket: summed). ``None`` where nothing counted them.

    :ivar captured_on: when the row was captured (a bucket: its start).
    :ivar wait_bins: counts of the finished jobs' wait times in 48 log-spaced
        slots (under 10 ms, then growing by a factor of √2 per slot); ``None`` where not counted.
    :ivar run_bins: their run times, in the same slots.
    :ivar ready_oldest_seconds: how long the oldest ready job had waited.
    :ivar percentiles: with ``percentiles=``, one entry per percent asked for,
        read from this snapshot's histograms; else ``None``.
    :ivar unreadable: what another client wrote that Python cannot hold or that is
        not a histogram of ours, by field, with why: a time such as ``infinity``
        (the nearest time Python holds stands in), a histogram past 48 slots (kept as
        stored; its percentiles count the slots past the 48th in the last), with
        negative counts (counted as 0), or of more than one dimension (``None``).
        In a bucket, those of its rows. Empty for a row that is fine.
    """

    name: str
    deferred_count: int
    queued_count: int
    ready_count: int
    active_count: int
    failed_count: int
    total_count: int
    created_delta: int | None
    completed_delta: int | None
    failed_delta: int | None
    delta_seconds: int | None
    delta_on: dt.datetime | None
    wait_bins: tuple[int, ...] | None
    run_bins: tuple[int, ...] | None
    ready_oldest_seconds: int | None
    captured_on: dt.datetime
    percentiles: tuple[QueueStatsPercentile, ...] | None = None
    unreadable: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PersistedWarning:
    """A row of the ``warning`` table (schema 46), written by a supervisor with
    ``persist_warnings`` (ours or Node's ``persistWarnings``).

    :ivar type: what it is about: ``queue_backlog``, ``monitor_backoff``,
        ``invalid_schedule``, ``index_bloat``, or one of the types only Node
        writes (the "Observe queues, warnings and workers" page).
    :ivar data: the details, as the writer stored them (JSON).
    """

    id: uuid.UUID
    type: str
    message: str
    data: Any
    created_on: dt.datetime
    unreadable: dict[str, str] = field(default_factory=dict)
    """Fields another client wrote that Python cannot read, with why (``data`` is
    then ``None``); empty for a row that is fine."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> PersistedWarning:
        """From a row of ``readable_columns``: never raises for what it holds."""
        values, problems = read_record(row, ("data",))
        return cls(**values, unreadable=problems)


@dataclass(frozen=True, slots=True)
class Instance:
    """A registered client in the ``instance`` table (schema 46): a Node PgBoss
    object or an alkstore_sa worker, as its last heartbeat left it.

    :ivar version: the client's version (``alkstore_sa <version>`` for ours).
    :ivar node_version: its runtime (``v22.x`` for Node, ``Python 3.x`` for ours).
    :ivar workers: one mapping per ``work()`` call (per handler for ours), with
        pg-boss's keys (``queue``, ``localConcurrency``, ``active``, ...).
    :ivar metrics: the process's resource sample at the last heartbeat, in
        pg-boss's keys (ours: CPU, RSS and the host's limits; no heap or event loop).
    :ivar config: the options it runs with (no connection details).
    :ivar live: not stopped, and heard from within three heartbeats.
    """

    id: uuid.UUID
    name: str | None
    host: str
    pid: int
    version: str
    node_version: str
    application_name: str | None
    heartbeat_seconds: int
    supervise: bool
    schedule: bool
    migrate: bool
    persist_queue_stats: bool
    persist_warnings: bool
    pool_max: int | None
    pool_total: int | None
    pool_idle: int | None
    pool_waiting: int | None
    workers: list[dict[str, Any]]
    metrics: dict[str, Any] | None
    config: dict[str, Any]
    crash_restarts: int
    crash_restarts_since: dt.datetime | None
    started_on: dt.datetime
    heartbeat_on: dt.datetime
    stopped_on: dt.datetime | None
    live: bool
    unreadable: dict[str, str] = field(default_factory=dict)
    """Fields another client wrote that Python cannot read, with why (a JSON field
    is then ``None``); empty for a row that is fine."""

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Instance:
        """From a row of ``readable_columns``: never raises for what it holds."""
        values, problems = read_record(row, ("workers", "metrics", "config"))
        for name, empty in (("workers", []), ("config", {})):
            if values[name] is None:
                values[name] = empty
        return cls(**values, unreadable=problems)


@dataclass(frozen=True, slots=True)
class JobAttempt:
    """One failed attempt of a job, from the attempt history
    (:meth:`~alkstore_sa.QueueService.get_job_attempts`; the "Attempt history" page).

    :ivar attempt: which attempt it was, 1 for the first.
    :ivar cause: ``failed`` (a handler or a client failed it), ``expired`` (its lease
        ran out), ``heartbeat`` (its heartbeat stopped) or ``poison`` (a row no worker
        can run, failed for good).
    :ivar failed_on: when it was failed, by the schema's clock.
    :ivar started_on: when the attempt started (``None`` if it never did).
    :ivar error: the output the fail wrote: ``{name, message, stack}`` for a Python
        exception, pg-boss's timeout message for an expiry; over
        :data:`~alkstore_sa.limits.MAX_ATTEMPT_ERROR_BYTES`, shortened (with ``truncated``,
        its size in bytes).
    :ivar worker: the worker that failed it, as ``name@host:pid`` (``None`` for expiry,
        a poison row, or a fail by a service call).
    :ivar worker_id: that worker's id in the instance registry (schema 46).
    """

    id: int
    name: str
    job_id: uuid.UUID
    attempt: int
    cause: str
    failed_on: dt.datetime
    started_on: dt.datetime | None
    error: Any
    worker: str | None
    worker_id: uuid.UUID | None
    unreadable: dict[str, str] = field(default_factory=dict)
    """Fields that Python cannot read, with why (``error`` is then ``None``); empty for
    a row that is fine."""

    @property
    def error_type(self) -> str | None:
        """The error's type name (``error["name"]``), when it has one."""
        return _text_field(self.error, "name")

    @property
    def message(self) -> str | None:
        """The error's message (``error["message"]``, or the text of a ``{"value": ...}``
        output), when it has one."""
        found = _text_field(self.error, "message")
        if found is None and isinstance(self.error, dict):
            value = self.error.get("value")
            found = _text_field(value, "message") if isinstance(value, dict) else None
            if found is None and isinstance(value, str):
                found = value
        return found

    @property
    def stack(self) -> str | None:
        """The traceback (``error["stack"]``), when one was written."""
        return _text_field(self.error, "stack")

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> JobAttempt:
        """From a row of ``readable_columns``: never raises for what it holds."""
        values, problems = read_record(row, ("error",))
        return cls(**values, unreadable=problems)


def _text_field(value: Any, key: str) -> str | None:
    found = value.get(key) if isinstance(value, dict) else None
    return found if isinstance(found, str) else None


@dataclass(frozen=True, slots=True)
class JobPage:
    """One page of :meth:`~alkstore_sa.QueueService.find_jobs`, newest first.

    :ivar jobs: the page's jobs (unreadable rows as :class:`UnreadableJob`).
    :ivar next_cursor: pass it as ``after`` for the next page; ``None`` on the last.
    """

    jobs: list[Job]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class JobCounts:
    """One queue's jobs counted by state (:meth:`~alkstore_sa.QueueService.count_jobs`).

    :ivar name: the queue.
    :ivar counts: jobs per state, every state present (0 when none).
    :ivar oldest_ready_seconds: how long the longest-waiting ready job (created
        or retry, its ``start_after`` passed) has been ready, by the database
        clock; ``None`` when no job is ready.
    """

    name: str
    counts: dict[str, int]
    oldest_ready_seconds: float | None
