"""The duties of the supervise pass at schema 26 (as pg-boss 11.1's maintenance,
failJobs and cron timekeeper do them), and their list :data:`DUTIES26`.

Per job table and chunk of 100 queues, the monitor (counters, warnings, expiry)
then the maintenance (deletion); then cron; then send-it. The frame that runs
them is :func:`alkstore_sa.ops.frame.run_duties`.
"""

from __future__ import annotations

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
from ..names import SEND_IT_QUEUE
from ..records import QueueWarning
from ..sql.common import locks
from ..sql.v26 import fail as fail_sql
from ..sql.v26 import supervision as sql
from . import attempts, frame
from ._core import Call, Conflict, Context, Op, contained
from .frame import Duty, PassPlan, PassTurn, Tally
from .queues import create_queue, get_queue
from .sending import send, send_many
from .working import Settlement, complete_many, fail_many, fetch

# The logger these duties have always logged on.
logger = logging.getLogger("alkstore_sa.ops.supervision")
R = TypeVar("R")
X = TypeVar("X")

SEND_IT_BATCH = 50  # send-it jobs per fetch, as pg-boss
SEND_IT_ROUNDS = 20  # full batches worked per pass before yielding to the other steps
SLOT_SECONDS = 60  # a schedule fires at most once per slot


# ------------------------------------------------------------------ units


def claim_queues(
    ctx: Context, column: str, names: Sequence[str], seconds: float, plan: PassPlan
) -> Op[list[str]]:
    params = {"names": list(names), "interval": frame.interval(plan, seconds), "now": plan.now}
    result = yield Call(sql.claim_queues(column), params)
    return sorted(result.scalars().all())


def cache_stats(ctx: Context, names: Sequence[str], plan: PassPlan) -> Op[list[QueueWarning]]:
    """Refresh the counters; return the queues over their threshold."""
    yield from frame.lock(ctx, locks.QUEUE_STATS, plan)
    result = yield Call(sql.cache_stats(), {"names": list(names), "now": plan.now})
    warnings = []
    for row in result:
        threshold = row.warning_queued or plan.settings.warning_queue_size
        if row.queued_count > threshold:
            warnings.append(QueueWarning(row.name, row.queued_count, threshold))
    return warnings


def expire(ctx: Context, table: str, names: Sequence[str], plan: PassPlan) -> Op[dict[str, int]]:
    """Fail one batch of jobs past their lease, through the fail path."""
    yield from frame.lock(ctx, locks.table_key(table, "failJobsByTimeout"), plan)
    params = {
        "names": list(names),
        "limit": plan.settings.expire_batch_size,
        "timeout_output": opt.encode_json("output", fail_sql.TIMEOUT_OUTPUT),
        "now": plan.now,
    }
    rows = yield from attempts.recording(
        ctx, lambda s: fail_sql.expire_jobs(history=s.history), params
    )
    return dict(Counter(row.name for row in rows))


EXPIRY_REASONS: Mapping[str, str] = {
    "timeout": "the handler ran past its timeout (its lease, expire_seconds, ran out)",
    "heartbeat": (
        "the worker running them stopped answering (no heartbeat for its heartbeat_seconds)"
    ),
}
"""What each kind of expiry says in its log line: ``timeout`` (the lease ran out,
at 26 the only kind) and ``heartbeat`` (46); the worker's own rescue words a
lapsed heartbeat the same way."""


def log_expired(counts: Mapping[str, int], reason: str) -> None:
    """One WARNING per queue with jobs expired for ``reason`` (a key of
    :data:`EXPIRY_REASONS`): ``extra={"action": "jobs_expired", "reason": ...,
    "queue": ..., "count": ...}``."""
    for queue, n in sorted(counts.items()):
        if n:
            logger.warning(
                "%d job(s) of %r expired (failed, or retried where retries remain): %s",
                n,
                queue,
                EXPIRY_REASONS[reason],
                extra={"action": "jobs_expired", "reason": reason, "queue": queue, "count": n},
            )


def delete_old(
    ctx: Context, table: str, names: Sequence[str], plan: PassPlan
) -> Op[dict[str, int]]:
    """Delete one batch of finished jobs past deletion and queued jobs past keep_until."""
    yield from frame.lock(ctx, locks.table_key(table, "deletion"), plan)
    params = {"names": list(names), "limit": plan.settings.delete_batch_size, "now": plan.now}
    result = yield Call(sql.delete_expired(), params)
    return {row.name: int(row.deleted) for row in result}


def database_epoch(ctx: Context) -> Op[float]:
    result = yield Call(sql.database_epoch())
    return float(result.scalar_one())


def ensure_send_it(ctx: Context) -> Op[None]:
    """Create ``__pgboss__send-it`` if missing (as Node does on start)."""
    if (yield from get_queue(ctx, SEND_IT_QUEUE)) is None:
        yield from create_queue(ctx, SEND_IT_QUEUE, exist_ok=True, options={})


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
    interval = frame.interval(plan, plan.settings.cron_monitor_interval)
    won = yield Call(sql.claim_cron(), {"interval": interval, "now": plan.now})
    if won.first() is None:
        return CronOutcome(False)
    yield from ensure_send_it(ctx)
    schedules = (yield Call(sql.all_schedules())).all()
    if plan.reports is not None:
        plan.reports.read(schedules)
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
            if plan.reports is None or plan.reports.first(row, reason):  # once per change
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
        jobs = yield from fetch(ctx, SEND_IT_QUEUE, batch, priority=True, ignore_start_after=False)
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


# ------------------------------------------------------------------ the duties


def monitor_chunk(
    ctx: Context, plan: PassPlan, tally: Tally, table: str, chunk: list[str]
) -> Generator[Op[Any], Any, None]:
    """The monitor turn of one chunk: the counters, then expiry until a batch
    comes back short."""
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
        expired = yield from frame.drain(
            lambda: expire(ctx, table, watched, plan), "expire", tally, s.expire_batch_size
        )
        log_expired(expired, "timeout")
        tally.expired += expired


def maintain_chunk(
    ctx: Context, plan: PassPlan, tally: Tally, table: str, chunk: list[str]
) -> Generator[Op[Any], Any, None]:
    """The maintenance turn of one chunk: deletion until a batch comes back short."""
    s = plan.settings
    tidied: list[str] = (
        yield from tally.attempt(
            claim_queues(ctx, "maintain_on", chunk, s.maintenance_interval, plan), "maintain"
        )
    ) or []
    if tidied:
        tally.maintained += tidied
        tally.deleted += yield from frame.drain(
            lambda: delete_old(ctx, table, tidied, plan), "delete", tally, s.delete_batch_size
        )


def cron_step(unit: Op[CronOutcome], tally: Tally) -> Generator[Op[Any], Any, None]:
    """Hand the cron ``unit`` on; what it fired and found wrong, into ``tally``."""
    outcome = yield from tally.attempt(unit, "cron")
    if outcome is not None:
        tally.cron_checked = outcome.won
        tally.fired += outcome.fired
        tally.errors += outcome.problems


def send_it_rounds(
    work: Callable[[int], Op[tuple[int, int]]], tally: Tally
) -> Generator[Op[Any], Any, None]:
    """Rounds of :data:`SEND_IT_BATCH` send-it jobs (``work``) until one comes back
    short, at most :data:`SEND_IT_ROUNDS`."""
    for _ in range(SEND_IT_ROUNDS):
        counts = yield from tally.attempt(work(SEND_IT_BATCH), "send-it")
        if counts is None:
            return
        tally.sent += counts[1]
        if counts[0] < SEND_IT_BATCH:
            return


def cron_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """The cron duty: :func:`cron`, in one unit."""
    yield from cron_step(cron(ctx, plan), tally)


def send_it_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """The send-it duty: rounds of :func:`work_send_it`."""
    yield from send_it_rounds(lambda batch: work_send_it(ctx, batch), tally)


def timekeeping(cron: PassTurn, send_it: PassTurn) -> tuple[Duty, Duty]:
    """The cron and send-it duties, each version with its own turns."""
    return (
        Duty(
            "cron",
            "cron",
            cron,
            interval="cron_monitor_interval",
            reports=("cron_checked", "fired", "errors"),
        ),
        Duty("send-it", "send_it", send_it, reports=("sent",)),
    )


DUTIES26: tuple[Duty, ...] = (
    Duty(
        "monitor",
        "monitor",
        monitor_chunk,
        per_chunk=True,
        interval="monitor_interval",
        locks=(locks.QUEUE_STATS, locks.table_key("<table>", "failJobsByTimeout")),
        reports=("monitored", "warnings", "expired"),
    ),
    Duty(
        "maintain",
        "monitor",
        maintain_chunk,
        per_chunk=True,
        interval="maintenance_interval",
        locks=(locks.table_key("<table>", "deletion"),),
        reports=("maintained", "deleted"),
    ),
    Duty("attempt history", "monitor", attempts.sweep_turn),
    *timekeeping(cron_turn, send_it_turn),
)
"""The duties of a pass at schema 26, in the order it takes them."""
