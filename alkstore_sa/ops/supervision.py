"""Supervision as operations: monitor, expire, delete, cron
(as pg-boss's maintenance, failJobs and cron timekeeper do them).

A supervision pass is a generator of *units*. A unit is an ordinary operation
(it yields :class:`Call` objects) meant to run in one transaction of its own.
:class:`~alkstore_sa.supervision.Supervisor` gives each unit a short
transaction with pg-boss's lock timeouts and throws a unit's error back into
the pass, which records it and goes on with the next step.
:meth:`QueueService.supervise <alkstore_sa.QueueService.supervise>` runs every
unit inline in the caller's transaction instead (:func:`supervise_once`): each
statement in a savepoint, advisory locks only tried, never waited for, so the
caller's transaction stays usable whatever happens.

(One module, longer than most: the units, the pass that orders them and the
two ways of running it change together.)
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .. import options as opt
from ..cron import previous_fire
from ..errors import AlkstoreError, InvalidOptionsError, QueueNotFoundError, shown
from ..names import SEND_IT_QUEUE, queue_ref
from ..records import QueueWarning as QueueWarning  # re-exported: the supervisors report it
from ..records import SupervisionReport as SupervisionReport
from ..sql.common import locks
from ..sql.v26 import fail as fail_sql
from ..sql.v26 import supervision as sql
from ._core import Call, Conflict, Context, Op, contained, restated
from .queues import create_queue, get_queue
from .sending import send, send_many
from .working import Settlement, complete_many, fail_many, fetch

logger = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
X = TypeVar("X")

CHUNK = 100  # queue names per statement, as pg-boss
SEND_IT_BATCH = 50  # send-it jobs per fetch, as pg-boss
SEND_IT_ROUNDS = 20  # full batches worked per pass before yielding to the other steps
SLOT_SECONDS = 60  # a schedule fires at most once per slot


_INTERVALS: dict[str, tuple[float, float]] = {  # name: (pg-boss default, pg-boss maximum)
    "supervise_interval": (60, 86_400),
    "monitor_interval": (60, 86_400),
    "maintenance_interval": (86_400, 86_400),
    "cron_monitor_interval": (30, 45),
    "cron_worker_interval": (5, 45),
    "clock_monitor_interval": (600, 600),
    "flow_interval": (5, 86_400),
    "bam_interval": (60, 86_400),
    "reindex_interval": (86_400, 86_400),
}
_MINIMUM_INTERVALS = {"flow_interval": 1.0, "bam_interval": 10.0, "reindex_interval": 1.0}
_SWITCHES = (
    "supervise",
    "schedule",
    "persist_warnings",
    "persist_queue_stats",
    "flows",
    "bam",
    "reindex",
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Validated supervision settings; every interval is in seconds (pg-boss defaults).

    :ivar supervise: run the monitor (counters, warnings, expiration) and deletion.
    :ivar schedule: run the cron timekeeper and work ``__pgboss__send-it``.
    :ivar queues: only these queues (monitor and deletion); ``None`` = all.
    :ivar persist_warnings: at schema 46, also write warnings into the ``warning``
        table and apply its retention (pg-boss's ``persistWarnings``, off by default).
    :ivar persist_queue_stats: schema 46 only: write queue-stats history on every
        monitor turn won and prune it (pg-boss's ``persistQueueStats``, off by
        default). Without it history is still written in a turn won while another
        instance persists it (the "Supervision and cron" page, "Queue-stats history").
    :ivar warning_retention_days: days warnings are kept with ``persist_warnings``
        (pg-boss's ``warningRetentionDays``, 365, at most 365).
    :ivar queue_stats_retention_days: days of history kept with
        ``persist_queue_stats`` (pg-boss's ``queueStatRetentionDays``, 7, at most 365).
    :ivar flows: at schema 46, take the ``version.flow_on`` turn every
        ``flow_interval`` (pg-boss's ``flowIntervalSeconds``, 5; at least 1) and
        release the children of completed parents; with ``supervise`` only, as
        Node arms its flow resolver only when it supervises.
    :ivar bam: at schema 46, take the ``version.bam_on`` turn every
        ``bam_interval`` (``bamIntervalSeconds``, 60; at least 10) and run the
        index builds Node's migrations queued in ``bam`` (Node runs them on
        instances started with ``migrate: true``, its default).
    :ivar reindex: at schema 46, take the ``version.reindex_on`` turn every
        ``reindex_interval`` (``reindexIntervalSeconds``, 86400) at the end of a
        supervise pass and rebuild bloated job indexes (pg-boss's ``reindex``).
        Off, the turn is left to others (Node with ``reindex: false`` still
        reports bloat without claiming; we report nothing).
    """

    supervise: bool = True
    schedule: bool = True
    supervise_interval: float = 60
    monitor_interval: float = 60
    maintenance_interval: float = 86_400
    cron_monitor_interval: float = 30
    cron_worker_interval: float = 5
    clock_monitor_interval: float = 600
    warning_queue_size: int = 10_000
    delete_batch_size: int = 10_000
    expire_batch_size: int = 1_000
    queues: tuple[str, ...] | None = None
    persist_warnings: bool = False
    persist_queue_stats: bool = False
    queue_stats_retention_days: int = 7
    warning_retention_days: int = 365
    flows: bool = True
    flow_interval: float = 5
    bam: bool = True
    bam_interval: float = 60
    reindex: bool = True
    reindex_interval: float = 86_400

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Settings:
        """Validate keyword settings; :class:`InvalidOptionsError` names the bad one."""
        allowed = frozenset(f.name for f in dataclasses.fields(cls))
        opt.check_unknown(options, allowed, "supervision")
        values: dict[str, Any] = {}
        for key, value in options.items():
            if key in _SWITCHES:
                values[key] = opt.check_bool(key, value)
            elif key in ("queue_stats_retention_days", "warning_retention_days"):
                values[key] = opt.check_int(key, value, minimum=1, maximum=365)
            elif key in _INTERVALS:
                top = _INTERVALS[key][1]
                low = _MINIMUM_INTERVALS.get(key)
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                if not ok or not math.isfinite(value) or not 0 < value <= top:
                    raise InvalidOptionsError(
                        key, f"must be seconds in (0, {top}], not {shown(value)}"
                    )
                if low is not None and value < low:
                    raise InvalidOptionsError(
                        key, f"must be at least {low:g} seconds, not {shown(value)}"
                    )
                values[key] = value
            elif key == "queues":
                values[key] = _queue_names(value)
            else:
                values[key] = opt.check_int(key, value, minimum=1)
        return cls(**values)

    def check_version(self, version: int) -> None:
        """Refuse the settings the schema at ``version`` does not have (set to other
        than their default), as :func:`alkstore_sa.options.check_version` refuses
        queue and send options: :class:`InvalidOptionsError` before any statement."""
        for key, since in SETTINGS_SINCE.items():
            field = next(f for f in dataclasses.fields(self) if f.name == key)
            if since > version and getattr(self, key) != field.default:
                raise InvalidOptionsError(
                    key,
                    f"needs pg-boss schema {since} (a supervision option of pg-boss 12); "
                    f"this schema is at {version}",
                )


SETTINGS_SINCE = {"persist_queue_stats": 46, "queue_stats_retention_days": 46}
"""The first pg-boss schema version of each supervision setting newer than 26."""


def _queue_names(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (queue_ref(value, "queues"),)
    if not isinstance(value, Sequence) or not value:
        raise InvalidOptionsError(
            "queues", f"must be a queue name or a list of them: {shown(value)}"
        )
    return tuple(queue_ref(v, "queues") for v in value)


@dataclass(frozen=True, slots=True)
class PassPlan:
    """Which steps one pass runs, and at what time.

    :ivar now: time bound into the statements instead of ``now()`` (a fake clock).
    :ivar cron_now: time schedules are evaluated at (local clock + skew); ``None``
        = ``now``, or the database clock.
    :ivar force: ignore the cluster-wide throttles (still stamping them).
    :ivar wait_for_locks: wait for advisory locks (own transactions) or only try
        them (the caller's transaction).
    :ivar flows: take the flow turn (schema 46).
    :ivar bam: take the BAM turn (schema 46; own transactions only).
    """

    settings: Settings
    monitor: bool = True
    cron: bool = True
    send_it: bool = True
    now: dt.datetime | None = None
    cron_now: dt.datetime | None = None
    force: bool = False
    wait_for_locks: bool = True
    skew_seconds: float | None = None
    flows: bool = False
    bam: bool = False


class Busy(AlkstoreError):
    """An advisory lock was held by another session and the step was skipped."""


# ------------------------------------------------------------------ units


def _lock(ctx: Context, key: str, plan: PassPlan) -> Op[None]:
    params = {"lock_schema": ctx.schema, "lock_key": key}
    if plan.wait_for_locks:
        yield Call(locks.xact_lock(), params)
        return
    result = yield Call(locks.try_xact_lock(), params)
    if not result.scalar_one():
        raise Busy(key)


def _interval(plan: PassPlan, seconds: float) -> float:
    return float("-inf") if plan.force else float(seconds)


def queue_tables(ctx: Context, names: Sequence[str] | None) -> Op[list[tuple[str, str]]]:
    params = None if names is None else {"names": list(names)}
    result = yield Call(sql.queue_tables(by_name=names is not None), params)
    return [(r.name, r.table_name) for r in result]


def claim_queues(
    ctx: Context, column: str, names: Sequence[str], seconds: float, plan: PassPlan
) -> Op[list[str]]:
    params = {"names": list(names), "interval": _interval(plan, seconds), "now": plan.now}
    result = yield Call(sql.claim_queues(column), params)
    return sorted(result.scalars().all())


def cache_stats(ctx: Context, names: Sequence[str], plan: PassPlan) -> Op[list[QueueWarning]]:
    """Refresh the counters; return the queues over their threshold."""
    yield from _lock(ctx, locks.QUEUE_STATS, plan)
    result = yield Call(sql.cache_stats(), {"names": list(names), "now": plan.now})
    warnings = []
    for row in result:
        threshold = row.warning_queued or plan.settings.warning_queue_size
        if row.queued_count > threshold:
            warnings.append(QueueWarning(row.name, row.queued_count, threshold))
    return warnings


def expire(ctx: Context, table: str, names: Sequence[str], plan: PassPlan) -> Op[dict[str, int]]:
    """Fail one batch of jobs past their lease, through the fail path."""
    yield from _lock(ctx, locks.table_key(table, "failJobsByTimeout"), plan)
    params = {
        "names": list(names),
        "limit": plan.settings.expire_batch_size,
        "timeout_output": opt.encode_json("output", fail_sql.TIMEOUT_OUTPUT),
        "now": plan.now,
    }
    result = yield Call(fail_sql.expire_jobs(), params)
    return dict(Counter(row.name for row in result))


def delete_old(
    ctx: Context, table: str, names: Sequence[str], plan: PassPlan
) -> Op[dict[str, int]]:
    """Delete one batch of finished jobs past deletion and queued jobs past keep_until."""
    yield from _lock(ctx, locks.table_key(table, "deletion"), plan)
    params = {"names": list(names), "limit": plan.settings.delete_batch_size, "now": plan.now}
    result = yield Call(sql.delete_expired(), params)
    return {row.name: int(row.deleted) for row in result}


def database_epoch(ctx: Context) -> Op[float]:
    result = yield Call(sql.database_epoch())
    return float(result.scalar_one())


def with_lock_timeouts(unit: Op[T]) -> Op[T]:
    """``unit`` in a transaction of its own, with pg-boss's lock and idle timeouts
    (``SET LOCAL``), so that a supervision step never waits long on a lock."""
    yield Call(sql.local_timeouts())
    return (yield from unit)


def ensure_send_it(ctx: Context) -> Op[None]:
    """Create ``__pgboss__send-it`` if missing (as Node does on start)."""
    if (yield from get_queue(ctx, SEND_IT_QUEUE)) is None:
        yield from create_queue(ctx, SEND_IT_QUEUE, True, {})


@dataclass(frozen=True, slots=True)
class CronOutcome:
    won: bool
    fired: tuple[str, ...] = ()
    problems: tuple[str, ...] = ()


def cron(ctx: Context, plan: PassPlan) -> Op[CronOutcome]:
    """Win the cron turn, then send every schedule due this minute to send-it.

    "Due" is pg-boss's rule: the schedule's last fire time (in its time zone) is
    less than a minute ago. The send-it job takes the slot ``SLOT_SECONDS`` wide
    keyed ``<queue>__<key>`` (unique index i4), so however many timekeepers -
    Python or Node - find it due in that minute, one job gets in.
    """
    interval = _interval(plan, plan.settings.cron_monitor_interval)
    won = yield Call(sql.claim_cron(), {"interval": interval, "now": plan.now})
    if won.first() is None:
        return CronOutcome(False)
    yield from ensure_send_it(ctx)
    schedules = (yield Call(sql.all_schedules())).all()
    at = plan.cron_now or plan.now
    if at is None:
        at = dt.datetime.fromtimestamp((yield from database_epoch(ctx)), dt.UTC)
    due, problems = [], []
    for row in schedules:
        # Each row on its own: one that cannot be read (its expression, or data
        # or options Python cannot decode or send) is reported and skipped.
        try:
            last = previous_fire(row.cron, row.timezone or "UTC", at)
            if last is None or (at - last).total_seconds() >= SLOT_SECONDS:
                continue
            payload = {
                "name": row.name,
                "data": decode_stored(row.data),
                "options": decode_stored(row.options),
            }
            opt.encode_json("data", payload)  # what send-it will carry, checked now
        except Exception as exc:
            reason = row_problem(exc)
            problems.append(f"schedule {row.name}__{row.key}: {reason}")
            logger.warning(
                "schedule %s__%s could not be evaluated: %s",
                row.name,
                row.key,
                reason,
                extra={"action": "invalid_schedule", "queue": row.name},
            )
            continue
        due.append((row, payload))
    if not due:
        return CronOutcome(True, (), tuple(problems))
    extra: dict[str, Any] = {}
    if plan.now is not None:
        # The slot is computed in SQL from now(); shift it onto the fake clock.
        db = yield from database_epoch(ctx)
        extra["singleton_offset"] = math.floor(plan.now.timestamp()) - math.floor(db)
    specs = [
        {
            "data": payload,
            "singleton_key": f"{row.name}__{row.key}",
            "singleton_seconds": SLOT_SECONDS,
            **extra,
        }
        for row, payload in due
    ]
    fired = yield from _file_occurrences(ctx, specs, problems)
    return CronOutcome(True, fired, tuple(problems))


def _file_occurrences(
    ctx: Context, specs: list[dict[str, Any]], problems: list[str]
) -> Op[tuple[str, ...]]:
    """Send the due schedules' jobs to send-it (:func:`file_occurrences`). The keys
    of the jobs sent (a slot another timekeeper filled first is not one)."""

    def send(batch: list[dict[str, Any]]) -> Op[list[str]]:
        ids = yield from send_many(ctx, SEND_IT_QUEUE, batch)
        return [s["singleton_key"] for s, i in zip(batch, ids, strict=True) if i is not None]

    def refused(spec: dict[str, Any], reason: str) -> Op[None]:
        key = spec["singleton_key"]
        problems.append(f"schedule {key}: {reason}")
        logger.warning(
            "schedule %s could not be sent: %s",
            key,
            reason,
            extra={"action": "invalid_schedule", "queue": spec["data"]["name"]},
        )
        yield from ()

    return tuple((yield from file_occurrences(specs, send, refused)))


def file_occurrences(
    items: Sequence[X],
    attempt: Callable[[list[X]], Op[list[R]]],
    refused: Callable[[X, str], Op[None]],
) -> Op[list[R]]:
    """``attempt`` on all the due schedules' ``items`` in one go; if the database (or
    a check of ours) refuses that, ``attempt`` on each item alone, its statements in
    savepoints (:func:`~alkstore_sa.ops._core.contained`): a refused item goes to
    ``refused(item, reason)`` and the others are filed. What the attempts returned."""
    if not items:
        return []
    try:
        return (yield from contained(attempt(list(items))))
    except (Conflict, InvalidOptionsError) as whole:
        logger.warning(
            "filing schedule occurrences failed (%s); filing them one schedule at a time",
            _refusal(whole),
            extra={"action": "invalid_schedule"},
        )
    out: list[R] = []
    for item in items:
        try:
            out += yield from contained(attempt([item]))
        except (Conflict, InvalidOptionsError) as one:
            yield from refused(item, _refusal(one))
    return out


def _refusal(exc: BaseException) -> str:
    """Why a statement was refused, in one line: the database's message (a
    :class:`Conflict` carries it) or our check's."""
    cause = getattr(exc, "error", None) or exc
    return " ".join(str(getattr(cause, "orig", None) or cause).split())[:300]


def row_problem(exc: BaseException) -> str:
    """How one row's failure is reported: our own errors by their message, any
    other by its type too."""
    return str(exc) if isinstance(exc, InvalidOptionsError) else f"{type(exc).__name__}: {exc}"


def decode_stored(text: str | None) -> Any:
    """A schedule's stored ``data`` or ``options`` (JSON text) as Python values.

    :raises Exception: the text is JSON Python cannot read (nested past the
        recursion limit, a number of more than 4,300 digits); the caller reports
        the row.
    """
    return None if text is None else json.loads(text)


def _unpack(data: Any) -> tuple[str, Any, dict[str, Any]]:
    if not isinstance(data, Mapping) or not isinstance(data.get("name"), str):
        raise InvalidOptionsError(
            "data", f"a send-it job needs {{name, data, options}}: {shown(data)}"
        )
    options = data.get("options")
    if options is not None and not isinstance(options, Mapping):
        raise InvalidOptionsError("options", f"must be an object, not {shown(options)}")
    return data["name"], data.get("data"), opt.from_pgboss_send_options(options)


SentHook = Callable[[str, Any, Any], None]
"""Told of each send-it job sent: ``(target queue, the send-it job, the new job's id)``."""


def work_send_it(ctx: Context, batch: int, on_sent: SentHook | None = None) -> Op[tuple[int, int]]:
    """Turn a batch of send-it jobs into jobs of their queues; ``(taken, sent)``.

    Sending and completing happen in one transaction: a crash in between leaves
    the send-it job to be worked again, never a lost or doubled schedule run.
    A job whose target cannot take it (queue gone, bad stored options) is failed
    with the reason, so it shows up instead of vanishing. ``on_sent`` hears of
    each job sent, before the send-it jobs are settled (the version at 46
    records ``schedule.last_job_id`` from it in the same transaction).
    """
    try:
        jobs = yield from fetch(ctx, SEND_IT_QUEUE, batch, True, False)
    except QueueNotFoundError:
        return 0, 0
    done, failed = [], []
    for job in jobs:
        try:
            target, data, options = _unpack(job.data)
            job_id = yield from send(ctx, target, data, options)
        except AlkstoreError as exc:
            wanted = job.data.get("name") if isinstance(job.data, Mapping) else None
            logger.warning(
                "scheduled job for %s not sent: %s",
                wanted,
                exc,
                extra={"action": "send_it_failed", "job_id": str(job.id)},
            )
            failed.append(Settlement(job.id, exc, job.started_on))
        else:
            done.append(Settlement(job.id, None, job.started_on))
            if on_sent is not None:
                on_sent(target, job, job_id)
    if done:
        yield from complete_many(ctx, SEND_IT_QUEUE, done)
    if failed:
        yield from fail_many(ctx, SEND_IT_QUEUE, failed)
    return len(jobs), len(done)


# ------------------------------------------------------------------ the pass

Pass = Generator[Op[Any], Any, SupervisionReport]


class _Tally:
    def __init__(self) -> None:
        self.monitored: list[str] = []
        self.warnings: list[QueueWarning] = []
        self.expired: Counter[str] = Counter()
        self.maintained: list[str] = []
        self.deleted: Counter[str] = Counter()
        self.cron_checked = False
        self.fired: list[str] = []
        self.sent = 0
        self.busy: list[str] = []
        self.errors: list[str] = []
        self.recorded: list[str] = []
        self.flows_resolved = 0
        self.released = 0
        self.bam: list[str] = []
        self.reindexed: list[str] = []

    def attempt(self, unit: Op[T], step: str) -> Generator[Op[Any], Any, T | None]:
        """Hand ``unit`` to the driver; a failure thrown back is recorded, not raised."""
        try:
            result: T = yield unit
            return result
        except Busy as exc:
            self.busy.append(f"{step}: {exc}")
            return None
        except Exception as exc:
            self.errors.append(f"{step}: {exc}")
            logger.error(
                "supervision step %s failed: %s", step, exc, extra={"action": "supervise_error"}
            )
            return None

    def report(self, plan: PassPlan) -> SupervisionReport:
        """What the pass did, as its caller reports it."""
        return SupervisionReport(
            monitored=tuple(self.monitored),
            warnings=tuple(self.warnings),
            expired=dict(self.expired),
            maintained=tuple(self.maintained),
            deleted=dict(self.deleted),
            cron_checked=self.cron_checked,
            fired=tuple(self.fired),
            sent=self.sent,
            skew_seconds=plan.skew_seconds,
            busy=tuple(self.busy),
            errors=tuple(self.errors),
            recorded=tuple(self.recorded),
            flows_resolved=self.flows_resolved,
            released=self.released,
            bam=tuple(self.bam),
            reindexed=tuple(self.reindexed),
        )


def _drain(
    unit: Callable[[], Op[dict[str, int]]], step: str, tally: _Tally, batch: int
) -> Generator[Op[Any], Any, Counter[str]]:
    # Repeat a bounded statement until a batch comes back short.
    total: Counter[str] = Counter()
    while True:
        done = yield from tally.attempt(unit(), step)
        if done is None:
            return total
        total.update(done)
        if sum(done.values()) < batch:
            return total


def _table_steps(
    ctx: Context, plan: PassPlan, table: str, chunk: list[str], tally: _Tally
) -> Generator[Op[Any], Any, None]:
    s = plan.settings
    watched: list[str] = (
        yield from tally.attempt(
            claim_queues(ctx, "monitor_on", chunk, s.monitor_interval, plan), "monitor"
        )
    ) or []
    if watched:
        tally.monitored += watched
        warnings = yield from tally.attempt(cache_stats(ctx, watched, plan), "stats")
        tally.warnings += warnings or []
        tally.expired += yield from _drain(
            lambda: expire(ctx, table, watched, plan), "expire", tally, s.expire_batch_size
        )
    tidied: list[str] = (
        yield from tally.attempt(
            claim_queues(ctx, "maintain_on", chunk, s.maintenance_interval, plan), "maintain"
        )
    ) or []
    if tidied:
        tally.maintained += tidied
        tally.deleted += yield from _drain(
            lambda: delete_old(ctx, table, tidied, plan), "delete", tally, s.delete_batch_size
        )


def _chunks(
    ctx: Context, plan: PassPlan, tally: _Tally
) -> Generator[Op[Any], Any, list[tuple[str, list[str]]]]:
    # The queues to supervise grouped by job table, in chunks of CHUNK: the
    # monitor and maintenance of one chunk are one statement each.
    rows = yield from tally.attempt(queue_tables(ctx, plan.settings.queues), "queues")
    tables: dict[str, list[str]] = {}
    for name, table in rows or []:
        tables.setdefault(table, []).append(name)
    return [
        (table, names[start : start + CHUNK])
        for table, names in tables.items()
        for start in range(0, len(names), CHUNK)
    ]


def _cron_step(unit: Op[CronOutcome], tally: _Tally) -> Generator[Op[Any], Any, None]:
    outcome = yield from tally.attempt(unit, "cron")
    if outcome is not None:
        tally.cron_checked = outcome.won
        tally.fired += outcome.fired
        tally.errors += outcome.problems


def _send_it_rounds(
    work: Callable[[int], Op[tuple[int, int]]], tally: _Tally
) -> Generator[Op[Any], Any, None]:
    # Rounds of SEND_IT_BATCH until one comes back short, at most SEND_IT_ROUNDS.
    for _ in range(SEND_IT_ROUNDS):
        counts = yield from tally.attempt(work(SEND_IT_BATCH), "send-it")
        if counts is None:
            return
        tally.sent += counts[1]
        if counts[0] < SEND_IT_BATCH:
            return


def supervise_pass(ctx: Context, plan: PassPlan) -> Pass:
    """One pass: per table and chunk of 100 queues monitor then maintain; cron; send-it.

    At schema 46 the pass is :func:`~alkstore_sa.ops.supervision46.supervise_pass46`.
    """
    plan.settings.check_version(ctx.version)
    if ctx.version >= 46:
        from .supervision46 import supervise_pass46

        return (yield from supervise_pass46(ctx, plan))
    tally = _Tally()
    if plan.monitor:
        for table, chunk in (yield from _chunks(ctx, plan, tally)):
            yield from _table_steps(ctx, plan, table, chunk, tally)
    if plan.cron:
        yield from _cron_step(cron(ctx, plan), tally)
    if plan.send_it:
        yield from _send_it_rounds(lambda batch: work_send_it(ctx, batch), tally)
    return tally.report(plan)


# ------------------------------------------------------------------ inline


def _savepointed(op: Op[T]) -> Op[T]:
    # Every statement in a savepoint: if one fails, the caller's transaction is
    # rolled back to just before it and stays usable while the error propagates.
    return restated(op, lambda call: dataclasses.replace(call, savepoint=True))


def run_inline(steps: Pass) -> Op[SupervisionReport]:
    """Run a pass as one operation in the caller's transaction.

    Only a skipped lock (:class:`Busy`) is handed back to the pass; any other
    error propagates to the caller, as every other service method does.
    """
    try:
        unit = next(steps)
        while True:
            try:
                result = yield from _savepointed(unit)
            except Busy as exc:
                unit = steps.throw(exc)
                continue
            unit = steps.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


NOW_WINDOW = dt.timedelta(hours=1)
"""How far ``supervise(now=...)`` may move the clock, either way."""


def supervise_once(
    ctx: Context, queues: str | Sequence[str] | None, force: bool, options: Mapping[str, Any]
) -> Op[SupervisionReport]:
    """The operation behind ``QueueService.supervise`` (``now`` is one of ``options``)."""
    options = dict(options)
    now = options.pop("now", None)
    settings = Settings.from_options({**options, "queues": queues})
    opt.check_bool("force", force)
    if now is not None:
        now = opt.in_utc("now", now)
        if abs(now - dt.datetime.now(dt.UTC)) > NOW_WINDOW:
            # A clock for tests of expiry and deletion, not a way to expire or delete
            # everything: supervise(now=9999-12-31) would delete every queued job.
            raise InvalidOptionsError(
                "now", f"must be within {NOW_WINDOW} of the current time, not {now.isoformat()}"
            )
    plan = PassPlan(
        settings,
        monitor=settings.supervise,
        cron=settings.schedule,
        send_it=settings.schedule,
        now=now,
        force=force,
        wait_for_locks=False,
        flows=settings.supervise and settings.flows,
    )
    return (yield from run_inline(supervise_pass(ctx, plan)))
