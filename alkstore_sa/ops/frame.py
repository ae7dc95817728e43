"""The frame of the supervise pass: what every version's duties share, and the
one function that runs a version's duties.

A *duty* (:class:`Duty`) is one thing supervision does: the monitor, expiry,
retention, counters, cron, send-it, stats history, flows, index builds,
reindex, warnings. Each is one unit with the setting of its interval, the
advisory locks it takes, the operation that does one turn of it, and the
fields of the report it fills. A schema version lists its duties in the order
a pass takes them (:mod:`alkstore_sa.ops.duties26`,
:mod:`alkstore_sa.ops.duties46`); :func:`run_duties` runs such a list:

- a duty done *per chunk* (the monitor, the maintenance) runs for each job
  table and chunk of :data:`CHUNK` queues, together with the per-chunk duties
  listed next to it, chunk by chunk, in the order listed;
- any other duty runs once;
- a duty runs only when the pass's plan has its switch on (``gate``, a field of
  :class:`PassPlan`).

Every unit a duty hands on is an ordinary operation (it yields :class:`Call`
objects) meant to run in one transaction of its own (an :class:`Autocommit`
unit, outside any); its failure is thrown back into the pass, recorded in the
:class:`Tally`, and the pass goes on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import math
from collections import Counter
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from .. import options as opt
from .. import versions
from ..errors import AlkstoreError, InvalidOptionsError, shown
from ..names import queue_ref
from ..records import QueueWarning, SupervisionReport
from ..sql.common import locks
from ..sql.v26 import supervision as sql
from ._core import Call, Context, Op

if TYPE_CHECKING:
    from .schedules import ScheduleReports

# The logger the pass has always logged its failed steps on.
logger = logging.getLogger("alkstore_sa.ops.supervision")
T = TypeVar("T")

CHUNK = 100  # queue names per statement, as pg-boss

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


SETTINGS_SINCE = {
    k: versions.since(k) for k in ("persist_queue_stats", "queue_stats_retention_days")
}
"""The first pg-boss schema version of each supervision setting newer than 26 (as the
feature table, :data:`alkstore_sa.versions.FEATURES`, has it)."""


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
    :ivar reports: what earlier passes reported of unusable schedules (a supervisor's,
        kept across its passes), so that each is reported once per change; ``None``
        reports every one.
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
    reports: ScheduleReports | None = None


@dataclass(frozen=True, slots=True)
class Autocommit:
    """A unit of the pass to run outside any transaction block (DDL such as
    ``CREATE INDEX CONCURRENTLY``): the supervisors answer it on a connection of
    their own in autocommit, without the lock timeouts of the other units."""

    op: Op[Any]


class Busy(AlkstoreError):
    """An advisory lock was held by another session and the step was skipped."""


# ------------------------------------------------------------------ shared by the duties


def lock(ctx: Context, key: str, plan: PassPlan) -> Op[None]:
    """Take the advisory lock ``key``: wait for it, or only try it and raise
    :class:`Busy` when another session holds it (``plan.wait_for_locks``). Nothing
    under a backend profile with ``noAdvisoryLocks``: the step may then run in two
    passes at once, as it does in pg-boss there (each step's statement stays
    correct without the lock; the lock only spares duplicate work)."""
    if not ctx.sql.advisory_locks:
        return
    params = {"lock_schema": ctx.lock_name, "lock_key": key}
    if plan.wait_for_locks:
        yield Call(locks.xact_lock(), params)
        return
    result = yield Call(locks.try_xact_lock(), params)
    if not result.scalar_one():
        raise Busy(key)


def interval(plan: PassPlan, seconds: float) -> float:
    """A throttle of ``seconds``; none at all when the pass is forced."""
    return float("-inf") if plan.force else float(seconds)


def queue_tables(ctx: Context, names: Sequence[str] | None) -> Op[list[tuple[str, str]]]:
    """``(queue, job table)`` of the queues ``names`` (``None``: of every queue)."""
    params = None if names is None else {"names": list(names)}
    result = yield Call(sql.queue_tables(by_name=names is not None), params)
    return [(r.name, r.table_name) for r in result]


Pass = Generator[Op[Any], Any, SupervisionReport]
"""A supervise pass: hands units to its runner, returns the report."""


class Tally:
    """What one pass did so far, duty by duty; :meth:`report` is its caller's record.

    Besides the report's fields: ``pinned``, the seconds the pass's statements
    held back the vacuum horizon (schema 46's monitor backoff reads it), and
    ``notes``, what one duty leaves for a later duty of the same pass (schema
    46: whether the pass writes queue-stats history).
    """

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
        self.pinned: list[float] = []
        self.notes: dict[str, Any] = {}

    def attempt(self, unit: Op[T], step: str) -> Generator[Op[Any], Any, T | None]:
        """Hand ``unit`` to the driver; a failure thrown back is recorded, not raised."""
        result, _ = yield from self.settle(unit, step)
        return result

    def settle(
        self, unit: Op[T], step: str, *, record: bool = True
    ) -> Generator[Op[Any], Any, tuple[T | None, BaseException | None]]:
        """:meth:`attempt`, also answering the failure (``None`` when the unit ran). A
        skipped lock is always recorded; an error only with ``record`` (without it, the
        caller recovers from it and logs it at debug level)."""
        try:
            result: T = yield unit
            return result, None
        except Busy as exc:
            self.busy.append(f"{step}: {exc}")
            return None, exc
        except Exception as exc:
            if record:
                self.errors.append(f"{step}: {exc}")
                logger.error(
                    "supervision step %s failed: %s",
                    step,
                    exc,
                    extra={"action": "supervise_error"},
                )
            else:
                logger.debug("supervision step %s failed, recovering: %s", step, exc)
            return None, exc

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


def drain(
    unit: Callable[[], Op[dict[str, int]]], step: str, tally: Tally, batch: int
) -> Generator[Op[Any], Any, Counter[str]]:
    """Repeat the bounded statement ``unit`` until a batch comes back short (or
    fails): the counts of every batch."""
    total: Counter[str] = Counter()
    while True:
        done = yield from tally.attempt(unit(), step)
        if done is None:
            return total
        total.update(done)
        if sum(done.values()) < batch:
            return total


def chunks(
    ctx: Context, plan: PassPlan, tally: Tally
) -> Generator[Op[Any], Any, list[tuple[str, list[str]]]]:
    """The queues to supervise grouped by job table, in chunks of :data:`CHUNK`
    (the monitor and maintenance of one chunk are one statement each)."""
    rows = yield from tally.attempt(queue_tables(ctx, plan.settings.queues), "queues")
    tables: dict[str, list[str]] = {}
    for name, table in rows or []:
        tables.setdefault(table, []).append(name)
    return [
        (table, names[start : start + CHUNK])
        for table, names in tables.items()
        for start in range(0, len(names), CHUNK)
    ]


# ------------------------------------------------------------------ duties and the frame

PassTurn = Callable[[Context, PassPlan, Tally], Generator[Any, Any, None]]
"""One turn of a duty done once a pass."""

ChunkTurn = Callable[[Context, PassPlan, Tally, str, list[str]], Generator[Any, Any, None]]
"""One turn of a duty done per chunk: ``(..., job table, chunk of queue names)``."""


@dataclass(frozen=True, slots=True)
class Duty:
    """One duty of the supervise pass.

    :ivar name: what it is called (in the version's list; unique there).
    :ivar gate: the :class:`PassPlan` switch without which it does not run.
    :ivar turn: the operation that does one turn of it; a :data:`PassTurn`, or
        with ``per_chunk`` a :data:`ChunkTurn`.
    :ivar per_chunk: done per job table and chunk of :data:`CHUNK` queues.
    :ivar interval: the :class:`Settings` field of its throttle (the claim it
        wins before doing anything); ``None``: done on every pass.
    :ivar locks: the advisory lock keys it takes (``<table>`` stands for the job
        table's name).
    :ivar reports: the fields of the report (and :class:`Tally`) it fills.
    """

    name: str
    gate: str
    turn: Callable[..., Generator[Any, Any, None]]
    per_chunk: bool = False
    interval: str | None = None
    locks: tuple[str, ...] = ()
    reports: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A misspelt gate, interval or report field fails at import, not in a pass.
        if self.gate not in _GATES:
            raise ValueError(f"duty {self.name}: gate {self.gate!r} is not a PassPlan switch")
        if self.interval is not None and self.interval not in _INTERVALS:
            raise ValueError(f"duty {self.name}: {self.interval!r} is not an interval setting")
        unknown = set(self.reports) - _REPORTED
        if unknown:
            raise ValueError(f"duty {self.name}: reports no such field {sorted(unknown)}")


_GATES = frozenset({"monitor", "cron", "send_it", "flows", "bam"})  # the PassPlan switches
_REPORTED = frozenset(f.name for f in dataclasses.fields(SupervisionReport))


def run_duties(ctx: Context, plan: PassPlan, duties: Sequence[Duty]) -> Pass:
    """One pass over ``duties`` in their order (see the module): each switched on
    by ``plan``; neighbouring per-chunk duties chunk by chunk, the queues read
    once for them. The report of what the pass did."""
    tally = Tally()
    at = 0
    while at < len(duties):
        duty = duties[at]
        if not duty.per_chunk:
            if getattr(plan, duty.gate):
                yield from duty.turn(ctx, plan, tally)
            at += 1
            continue
        group = [duty]
        while at + len(group) < len(duties):
            following = duties[at + len(group)]
            if not (following.per_chunk and following.gate == duty.gate):
                break
            group.append(following)
        at += len(group)
        if getattr(plan, duty.gate):
            for table, chunk in (yield from chunks(ctx, plan, tally)):
                for each in group:
                    yield from each.turn(ctx, plan, tally, table, chunk)
    return tally.report(plan)
