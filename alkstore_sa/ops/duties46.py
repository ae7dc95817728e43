"""The duties of the supervise pass at schema 46: every duty of pg-boss 12.38's
supervisor, and their list :data:`DUTIES46` (the frame that runs them is
:func:`alkstore_sa.ops.frame.run_duties`). Their units are run as at 26 (each in
a short transaction of its own, or inline in the caller's transaction).

The rule: whenever we win a turn that Node pg-boss 12.38 also claims, we do in
that turn everything Node does in it with its default settings; a turn whose
duties we cannot all do is never claimed, so Node keeps it.

Turn by turn (the throttle in brackets), what Node 12.38 does and what we do:

monitor, per table and 100 queues (``queue.monitor_claim_on``)
    Node: unless ``version.monitor_backoff_on`` is ahead, the counters under the
    ``queue-stats`` try-lock (claims handed back when it is lost) and
    ``queue_backlog`` warnings; then expiry by lease, then by heartbeat, in
    batches of 1,000 until one comes back short. We: the same; expiry through
    the schema-46 fail statements; a warning is logged and reported, and written
    to ``warning`` with ``persist_warnings`` (Node's ``persistWarnings``).
stats history (part of the monitor turn)
    Node: only with ``persistQueueStats``, off by default: the aggregate also
    counts the throughput window (deltas, wait/run histograms,
    ``ready_oldest_seconds``), one ``queue_stats`` row per queue it wrote (under
    ``queue-stats-insert``), the true-up of the last hour; today's and
    tomorrow's day partitions first. We: the same with ``persist_queue_stats``,
    **and** without it whenever another instance persists history (a live
    registered instance with ``persist_queue_stats``, or a recent row of one):
    a turn we win never drops a row Node would have written
    (:mod:`alkstore_sa.ops.stats_history`).
maintenance, per table and 100 queues (``queue.maintain_on``)
    Node: per queue the retention walk, then ``setRetainedCount`` (only the
    deleted taken off when a walk is cut short), the dependency cleanup by child
    then by parent; unfinished queues handed back. We: the same rows and counts,
    under the same locks (``<table>deletion`` / ``<table>cleanupDependencies``), in
    a few statements per chunk instead of a walk per queue: the queues that hold
    fewer keys than a batch together are walked together, a bigger one alone in
    batches of 10,000 keys (:func:`maintain_chunk46`); a statement over several
    queues that fails is done again queue by queue, so a bad queue fails alone.
after the queues (no claim)
    Node: monitor backoff from the pass's pin time; vacuum diagnosis; warning
    retention (with ``persistWarnings``); ``queue_stats`` retention (with
    ``persistQueueStats``); instance upkeep. We: the backoff, the warning
    retention with ``persist_warnings``, the ``queue_stats`` retention with
    ``persist_queue_stats`` (days dropped, or batched deletes on a plain table),
    the instance upkeep. **Left out:** the
    vacuum diagnosis (``xmin_horizon``, ``autovacuum_disabled``), which claims
    nothing and only warns; every Node instance still runs its own.
reindex (``version.reindex_on``, the pass's last step)
    Node and we: rebuild bloated job indexes, drop ``*_ccnew`` leftovers, warn
    ``index_bloat`` (:mod:`~alkstore_sa.ops.turns`; not inside the caller's
    transaction).
cron (``version.cron_on``)
    Node: the occurrences of every schedule in the last 60 s, a ``missed:
    'once'`` catch-up, filed into send-it under the escaped key and the 60 s
    slot; kinds relabelled; ``invalid_schedule`` warnings. We: the same, for
    cron expressions and recurrence rules (:mod:`~alkstore_sa.ops.occurrences`).
send-it (a queue; no claim)
    Node: send each job's request, then ``schedule.last_job_id``. We: the same.
flows (``version.flow_on``) and BAM (``version.bam_on``), on timers of their own
    Node and we: release flow children; run the ``bam`` index builds
    (:mod:`~alkstore_sa.ops.turns`; BAM not inside the caller's transaction).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import logging
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from ..backends import queue_claims_skip_locked
from ..records import QueueWarning
from ..sql.common import locks
from ..sql.v46 import cron as cron_sql
from ..sql.v46 import supervision as sql
from . import attempts, frame, stats_history, turns
from ._core import Call, Context, Op
from .duties26 import cron_step, log_expired, send_it_rounds, timekeeping, work_send_it
from .frame import Busy, Duty, PassPlan, Tally
from .occurrences import evaluate46, file46
from .occurrences import is_rrule as is_rrule  # re-exported
from .occurrences import occurrence_key as occurrence_key
from .occurrences import slot_of as slot_of
from .stats_history import NO_HISTORY, History
from .working import expire_heartbeats46, expire_jobs46

# The logger these duties have always logged on.
logger = logging.getLogger("alkstore_sa.ops.supervision46")

_BACKLOG = (
    'Warning: large queue backlog: queue "{name}" has {queued} jobs in the created or '
    "retry state, over its warning threshold of {threshold}. Your queue should be reviewed"
)
_BACKOFF = (
    "Warning: queue monitoring spent long enough scanning the job table to risk holding "
    "back autovacuum, so the next stats refresh is deferred: {elapsed:.1f}s of aggregate "
    "against an autovacuum_naptime of {naptime:g}s. Shrink the job table (retention, "
    "deleteAfterSeconds) or partition its busiest queues."
)

# ------------------------------------------------------------------ units


def _warn(ctx: Context, plan: PassPlan, kind: str, message: str, data: Any) -> Op[None]:
    # Node persists a warning only with persistWarnings (off by default).
    if plan.settings.persist_warnings:
        params = {"type": kind, "message": message, "data": json.dumps(data, default=str)}
        yield Call(sql.insert_warning(), {**params, "now": plan.now})


def claim_monitor(ctx: Context, names: Sequence[str], plan: PassPlan) -> Op[tuple[list[str], bool]]:
    """The monitor turn of ``names``: the queues won, and whether to count them."""
    params = {
        "names": list(names),
        "interval": frame.interval(plan, plan.settings.monitor_interval),
        "now": plan.now,
    }
    skip = queue_claims_skip_locked(ctx.backend)
    rows = (yield Call(sql.claim_monitor(skip_locked=skip), params)).all()
    return sorted(r.name for r in rows), all(r.refresh_stats for r in rows)


def cache_stats(
    ctx: Context, names: Sequence[str], plan: PassPlan, history: History = NO_HISTORY
) -> Op[tuple[list[QueueWarning], float, list[str], list[str]]]:
    """Count ``names`` (with throughput when ``history`` is written);
    ``(warnings, pin seconds, written, true_up)``: none written when another
    instance held the ``queue-stats`` lock (its claims are handed back)."""
    params: dict[str, Any] = {"names": list(names), "lock_schema": ctx.lock_name, "now": plan.now}
    if history.write:
        params["reset_seconds"] = stats_history.reset_seconds(plan)
    statement = sql.cache_stats(throughput=history.write, advisory=ctx.sql.advisory_locks)
    rows = (yield Call(statement, params)).all()
    warnings = []
    for row in rows:
        threshold = row.warning_queued or plan.settings.warning_queue_size
        if row.queued_count > threshold:
            warnings.append(QueueWarning(row.name, row.queued_count, threshold))
            message = _BACKLOG.format(name=row.name, queued=row.queued_count, threshold=threshold)
            data = {
                "name": row.name,
                "queuedCount": row.queued_count,
                "warningQueueSize": row.warning_queued,
                "pinSeconds": row.pin_seconds,
            }
            if history.write:
                data["trueUp"] = bool(row.true_up)
            yield from _warn(ctx, plan, "queue_backlog", message, data)
    pinned = max((float(r.pin_seconds or 0) for r in rows), default=0.0)
    return warnings, pinned, [r.name for r in rows], [r.name for r in rows if r.true_up]


def expire(
    ctx: Context, table: str, names: Sequence[str], plan: PassPlan, *, heartbeat: bool
) -> Op[dict[str, int]]:
    """One batch of expiry by lease (or by heartbeat), under Node's lock for it."""
    step = "failJobsByHeartbeat" if heartbeat else "failJobsByTimeout"
    yield from frame.lock(ctx, locks.table_key(table, step), plan)
    sweep = expire_heartbeats46 if heartbeat else expire_jobs46
    return (yield from sweep(ctx, names, plan.settings.expire_batch_size, plan.now))


def claim_maintain(
    ctx: Context, names: Sequence[str], plan: PassPlan
) -> Op[tuple[list[str], dt.datetime | None]]:
    """The maintenance turn of ``names``: the queues won and the stamp they share."""
    params = {
        "names": list(names),
        "interval": frame.interval(plan, plan.settings.maintenance_interval),
        "now": plan.now,
    }
    skip = queue_claims_skip_locked(ctx.backend)
    rows = (yield Call(sql.claim_maintain(skip_locked=skip), params)).all()
    return sorted(r.name for r in rows), (rows[0].claimed_on if rows else None)


def release_maintain(
    ctx: Context, names: Sequence[str], claimed_on: dt.datetime | None
) -> Op[None]:
    """Hand back the maintenance turn of queues the pass did not finish."""
    skip = queue_claims_skip_locked(ctx.backend)
    params = {"names": list(names), "claimed_on": claimed_on}
    yield Call(sql.release_maintain(skip_locked=skip), params)


def maintenance_sizes(
    ctx: Context, names: Sequence[str], plan: PassPlan
) -> Op[tuple[dt.datetime, list[Any]]]:
    """The pass's clock and the keys each queue of ``names`` holds, counted up to a
    batch (:func:`alkstore_sa.sql.v46.supervision.maintenance_sizes`)."""
    params = {"names": list(names), "batch": plan.settings.delete_batch_size, "now": plan.now}
    rows = list((yield Call(sql.maintenance_sizes(), params)).all())
    return rows[0].now, rows


def delete_queues(
    ctx: Context, table: str, names: Sequence[str], before: dt.datetime, plan: PassPlan
) -> Op[list[Any]]:
    """The whole retention walk of ``names`` (fewer keys than a batch together) and
    their retained counts, in one transaction under ``<table>deletion``: per queue
    ``(name, deleted, deleted_retained, retained)``."""
    yield from frame.lock(ctx, locks.table_key(table, "deletion"), plan)
    params = {"names": list(names), "retained_before": before, "now": plan.now}
    rows = list((yield Call(sql.delete_queues(), params)).all())
    counts = {
        "names": [r.name for r in rows],
        "retained": [r.retained for r in rows],
        "retained_before": before,
        "now": plan.now,
    }
    yield Call(sql.set_retained_counts(), counts)
    return rows


def cleanup_queues(
    ctx: Context, table: str, names: Sequence[str], side: str, plan: PassPlan
) -> Op[int]:
    """The dependency cleanup of ``names`` on ``side`` (fewer keys than a batch
    together) in one statement under ``<table>cleanupDependencies``."""
    yield from frame.lock(ctx, locks.table_key(table, "cleanupDependencies"), plan)
    deleted: int = (yield Call(sql.cleanup_queues(side), {"names": list(names)})).scalar_one()
    return deleted


def delete_batch(
    ctx: Context, table: str, name: str, after: Any, before: dt.datetime, plan: PassPlan
) -> Op[Any]:
    """One retention batch of queue ``name`` under ``<table>deletion``."""
    yield from frame.lock(ctx, locks.table_key(table, "deletion"), plan)
    params = {
        "qname": name,
        "after": after,
        "batch": plan.settings.delete_batch_size,
        "retained_before": before,
        "now": plan.now,
    }
    return (yield Call(sql.delete_batch(cursor=after is not None), params)).one()


def set_retained(
    ctx: Context, name: str, retained: int, before: dt.datetime, plan: PassPlan
) -> Op[None]:
    params = {"qname": name, "retained": retained, "retained_before": before, "now": plan.now}
    yield Call(sql.set_retained_count(), params)


def reduce_retained(ctx: Context, name: str, deleted: int, deleted_retained: int) -> Op[None]:
    params = {"qname": name, "deleted": deleted, "deleted_retained": deleted_retained}
    yield Call(sql.reduce_retained_count(), params)


def cleanup_batch(
    ctx: Context, table: str, name: str, side: str, after: Any, plan: PassPlan
) -> Op[Any]:
    """One dependency-cleanup batch under ``<table>cleanupDependencies``."""
    yield from frame.lock(ctx, locks.table_key(table, "cleanupDependencies"), plan)
    params = {"qname": name, "after": after, "batch": plan.settings.delete_batch_size}
    return (yield Call(sql.cleanup_dependencies(side, cursor=after is not None), params)).one()


def monitor_backoff(ctx: Context, elapsed: float, plan: PassPlan) -> Op[str | None]:
    """Defer the next aggregates if this pass pinned the horizon too long; the
    warning's text when it engaged."""
    row = (yield Call(sql.set_monitor_backoff(), {"elapsed": elapsed, "now": plan.now})).first()
    if row is None:
        return None
    message = _BACKOFF.format(elapsed=elapsed, naptime=row.naptime_seconds)
    data = {
        "elapsedSeconds": elapsed,
        "naptimeSeconds": row.naptime_seconds,
        "backoffSeconds": row.backoff_seconds,
        "backoffUntil": row.backoff_until,
    }
    yield from _warn(ctx, plan, "monitor_backoff", message, data)
    return message


def warning_retention(ctx: Context, plan: PassPlan) -> Op[None]:
    """Warnings older than ``warning_retention_days`` (pg-boss's ``warningRetentionDays``,
    365 by default), only with persisted warnings."""
    if plan.settings.persist_warnings:
        days = plan.settings.warning_retention_days
        yield Call(sql.delete_old_warnings(), {"days": days, "now": plan.now})


def upkeep(ctx: Context, plan: PassPlan) -> Op[None]:
    """The instance registry's upkeep: rows quiet for 7 days deleted, the newest
    1,000 dead rows kept."""
    yield Call(sql.delete_old_instances(), {"now": plan.now})
    yield Call(sql.trim_dead_instances(), {"now": plan.now})


def set_last_jobs(ctx: Context, fired: Mapping[tuple[str, str], tuple[str, Any]]) -> Op[None]:
    """``schedule.last_job_id`` for the latest slot each ``(name, key)`` sent."""
    if not fired:
        return
    names, keys, ids = [], [], []
    for (name, key), (_, job_id) in fired.items():
        names.append(name)
        keys.append(key)
        ids.append(job_id)
    yield Call(cron_sql.set_last_job_ids(), {"names": names, "keys": keys, "ids": ids})


# ------------------------------------------------------------------ the pass


def _walk(
    tally: Tally, step: str, batch: Any, cursor: Any = None
) -> Generator[Op[Any], Any, tuple[bool, list[Any]]]:
    # Carry each batch's cursor (row.walk_cursor, or cursor(row)) into the next
    # until one comes back without one (done) or fails (not done); every
    # batch's row is kept.
    done, rows, _ = yield from _walk_until(tally, step, batch, cursor)
    return done, rows


def _walk_until(
    tally: Tally, step: str, batch: Any, cursor: Any = None
) -> Generator[Op[Any], Any, tuple[bool, list[Any], BaseException | None]]:
    # _walk, also answering the failure that cut the walk short.
    after: Any = None
    rows: list[Any] = []
    while True:
        row, failure = yield from tally.settle(batch(after), step)
        if row is None:
            return False, rows, failure
        rows.append(row)
        after = row.walk_cursor if cursor is None else cursor(row)
        if after is None:
            return True, rows, None


def _lock_timeout(failure: BaseException | None) -> bool:
    # lock_timeout ran out (the table's advisory lock, or a row lock): contention, not
    # something wrong with one queue.
    return getattr(getattr(failure, "orig", None), "sqlstate", None) == "55P03"


def _retention_walk(
    ctx: Context, plan: PassPlan, table: str, name: str, before: dt.datetime, tally: Tally
) -> Generator[Op[Any], Any, tuple[bool, BaseException | None]]:
    # One queue's retention walk in batches of keys, then its retained count (or, cut
    # short, only what it deleted taken off): whether it finished, and why not.
    done, rows, failure = yield from _walk_until(
        tally, "delete", lambda after: delete_batch(ctx, table, name, after, before, plan)
    )
    deleted = sum(r.deleted for r in rows)
    if deleted:
        tally.deleted[name] += deleted
    if done:
        retained = sum(r.retained for r in rows)
        yield from tally.attempt(set_retained(ctx, name, retained, before, plan), "retained")
    elif deleted:
        held = sum(r.deleted_retained for r in rows)
        yield from tally.attempt(reduce_retained(ctx, name, deleted, held), "retained")
    return done, failure


def _cleanup_walk(
    ctx: Context, plan: PassPlan, table: str, name: str, side: str, tally: Tally
) -> Generator[Op[Any], Any, tuple[bool, BaseException | None]]:
    done, _, failure = yield from _walk_until(
        tally, "dependencies", lambda a: cleanup_batch(ctx, table, name, side, a, plan)
    )
    return done, failure


def _groups(rows: Sequence[Any], field: str, batch: int) -> tuple[list[list[str]], list[str]]:
    """The queues of ``rows`` (in their order) whose ``field`` keys fit in one batch,
    grouped so that each group holds fewer than ``batch`` keys together; and the queues
    with a batch or more, each walked alone."""
    groups: list[list[str]] = []
    alone: list[str] = []
    group: list[str] = []
    held = 0
    for row in rows:
        keys = int(getattr(row, field))
        if keys >= batch:
            alone.append(row.name)
            continue
        if group and held + keys >= batch:
            groups.append(group)
            group, held = [], 0
        group.append(row.name)
        held += keys
    if group:
        groups.append(group)
    return groups, alone


Single = Callable[[str], Generator[Op[Any], Any, tuple[bool, BaseException | None]]]


def _one_by_one(names: Sequence[str], single: Single) -> Generator[Op[Any], Any, set[str]]:
    """Each of ``names`` on its own (``single``): the queues not finished. A lock
    timeout stops it (a lock held long is not one queue's fault; the rest are handed
    back rather than each waiting as long again)."""
    unfinished: set[str] = set()
    for at, name in enumerate(names):
        done, failure = yield from single(name)
        if not done:
            unfinished.add(name)
        if _lock_timeout(failure):
            unfinished.update(names[at + 1 :])
            break
    return unfinished


def _together(
    tally: Tally,
    step: str,
    group: list[str],
    unit: Generator[Any, Any, Any],
    single: Single,
) -> Generator[Op[Any], Any, tuple[Any, set[str]]]:
    """``unit`` over ``group`` in one transaction; if it fails, each queue alone
    (``single``), so that a queue whose rows make a statement fail fails alone and the
    others are done. ``(the unit's result or None, the queues not finished)``."""
    result, failure = yield from tally.settle(unit, step, record=False)
    if failure is None:
        return result, set()
    if isinstance(failure, Busy):
        return None, set(group)  # another session holds the lock: all handed back
    return None, (yield from _one_by_one(group, single))


def maintain_chunk46(
    ctx: Context, plan: PassPlan, tally: Tally, table: str, chunk: list[str]
) -> Generator[Op[Any], Any, None]:
    """The maintenance turn of one chunk: the retention and the dependency cleanup of
    its queues, many queues per statement.

    One statement reads the keys each queue holds (up to a batch); the queues that fit
    in one batch together are then walked together (:func:`delete_queues`,
    :func:`cleanup_queues`), a queue with more alone in batches of keys, as pg-boss
    walks every queue. A statement over several queues that fails is done again queue
    by queue, so a queue whose rows make it fail fails alone. The queues not finished
    are handed back; the others are reported maintained."""
    won = yield from tally.attempt(claim_maintain(ctx, chunk, plan), "maintain")
    tidied, claimed_on = won or ([], None)
    if not tidied:
        return
    sized = yield from tally.attempt(maintenance_sizes(ctx, tidied, plan), "maintain")
    unfinished: set[str] = set(tidied) if sized is None else set()
    if sized is not None:
        now, rows = sized
        before = now - dt.timedelta(seconds=sql.DELTA_LAG_SECONDS)
        batch = plan.settings.delete_batch_size

        def retention(name: str) -> Generator[Op[Any], Any, tuple[bool, BaseException | None]]:
            return (yield from _retention_walk(ctx, plan, table, name, before, tally))

        groups, alone = _groups(rows, "jobs", batch)
        for group in groups:
            unit = delete_queues(ctx, table, group, before, plan)
            done, left = yield from _together(tally, "delete", group, unit, retention)
            for row in done or []:
                if row.deleted:
                    tally.deleted[row.name] += row.deleted
            unfinished |= left
        unfinished |= yield from _one_by_one(alone, retention)
        for side, field in (("child", "children"), ("parent", "parents")):

            def cleanup(
                name: str, side: str = side
            ) -> Generator[Op[Any], Any, tuple[bool, BaseException | None]]:
                return (yield from _cleanup_walk(ctx, plan, table, name, side, tally))

            groups, alone = _groups(rows, field, batch)
            for group in groups:
                tidy = cleanup_queues(ctx, table, group, side, plan)
                _, left = yield from _together(tally, "dependencies", group, tidy, cleanup)
                unfinished |= left
            unfinished |= yield from _one_by_one(alone, cleanup)
    tally.maintained += [name for name in tidied if name not in unfinished]
    if unfinished:
        back = [name for name in tidied if name in unfinished]
        yield from tally.attempt(release_maintain(ctx, back, claimed_on), "maintain")


def _history46(
    ctx: Context,
    plan: PassPlan,
    tally: Tally,
    history: History,
    written: list[str],
    late: list[str],
) -> Generator[Op[Any], Any, float]:
    # The history rows of the queues just counted, then the true-up of those
    # whose recent windows fell short; the true-up's pin seconds.
    if not (history.write and written):
        return 0.0
    recorded = yield from tally.attempt(
        stats_history.write_history(ctx, written, plan, history), "history"
    )
    tally.recorded += recorded or []
    if not late:
        return 0.0
    return (yield from tally.attempt(stats_history.true_up(ctx, late, plan), "true-up")) or 0.0


def monitor_chunk46(
    ctx: Context, plan: PassPlan, tally: Tally, table: str, chunk: list[str]
) -> Generator[Op[Any], Any, None]:
    """The monitor turn of one chunk: the counters (with the history the pass
    writes, see :func:`history_start`), then expiry by lease and by heartbeat."""
    s = plan.settings
    history: History = tally.notes.get("history", NO_HISTORY)
    pin = tally.pinned
    claimed = yield from tally.attempt(claim_monitor(ctx, chunk, plan), "monitor")
    watched, refresh = claimed or ([], False)
    if watched:
        tally.monitored += watched
        if refresh:
            stats = yield from tally.attempt(cache_stats(ctx, watched, plan, history), "stats")
            if stats is not None:
                warnings, pinned, written, late = stats
                tally.warnings += warnings
                pin.append(pinned)
                if not written:
                    tally.busy.append(f"stats: {locks.QUEUE_STATS}")
                pin.append((yield from _history46(ctx, plan, tally, history, written, late)))
        for heartbeat in (False, True):
            step = "heartbeat" if heartbeat else "expire"
            expired = yield from frame.drain(
                functools.partial(expire, ctx, table, watched, plan, heartbeat=heartbeat),
                step,
                tally,
                s.expire_batch_size,
            )
            log_expired(expired, "heartbeat" if heartbeat else "timeout")
            tally.expired += expired


def work_send_it46(ctx: Context, batch: int) -> Op[tuple[int, int]]:
    """Send-it at 46: as at 26 (:func:`~alkstore_sa.ops.supervision.work_send_it`:
    the requests sent and the send-it jobs settled in one transaction), then
    ``schedule.last_job_id`` for the latest slot of each schedule sent."""
    fired: dict[tuple[str, str], tuple[str, Any]] = {}

    def record(target: str, job: Any, job_id: Any) -> None:
        key, slot = job.data.get("key"), job.data.get("slot")
        # A payload from an older timekeeper names no key: nothing to record.
        if job_id is not None and isinstance(key, str):
            mark = (target, key)
            filed = str(slot) if slot is not None else "~"  # no slot: the newest
            if mark not in fired or fired[mark][0] <= filed:
                fired[mark] = (filed, job_id)

    counts = yield from work_send_it(ctx, batch, record)
    yield from set_last_jobs(ctx, fired)
    return counts


def history_start(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """Whether this pass writes stats history (stats_history's rule), noted for the
    monitor and the retention; if so, the partitions its rows go to, before any
    is written."""
    tally.notes["history"] = NO_HISTORY
    history = yield from tally.attempt(stats_history.history_mode(ctx, plan), "history")
    if history is None or not history.write:
        return
    yield from tally.attempt(stats_history.ensure_partitions(ctx, plan), "history")
    tally.notes["history"] = history


def backoff_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """The monitor backoff, from the seconds this pass's counting pinned the
    vacuum horizon; none under a backend profile with ``noMonitorVacuum`` (an engine
    without PostgreSQL's vacuum)."""
    if ctx.backend.has("noMonitorVacuum"):
        return
    if sum(tally.pinned) > 0:
        message = yield from tally.attempt(monitor_backoff(ctx, sum(tally.pinned), plan), "backoff")
        if message:
            logger.warning(message, extra={"action": "monitor_backoff"})


def warning_retention_turn(
    ctx: Context, plan: PassPlan, tally: Tally
) -> Generator[Op[Any], Any, None]:
    """Warning retention (:func:`warning_retention`), in one unit."""
    yield from tally.attempt(warning_retention(ctx, plan), "upkeep")


def stats_retention_turn(
    ctx: Context, plan: PassPlan, tally: Tally
) -> Generator[Op[Any], Any, None]:
    """Queue-stats retention, only when we persist history by our own setting:
    whole days dropped, or batched deletes on a plain table."""
    history: History = tally.notes.get("history", NO_HISTORY)
    if history.own:
        dropped = yield from tally.attempt(stats_history.drop_old_partitions(ctx, plan), "history")
        if dropped is not None and not dropped[0]:
            yield from _walk(
                tally,
                "history",
                lambda after: stats_history.delete_old_batch(ctx, after, plan),
                cursor=lambda row: (
                    None if row.walk_cursor_on is None else (row.walk_cursor_on, row.walk_cursor_id)
                ),
            )


def upkeep_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """The instance registry's upkeep (:func:`upkeep`), in one unit."""
    yield from tally.attempt(upkeep(ctx, plan), "upkeep")


def cron_turn46(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """Two units: the evaluation holds no lock; the claim and the writes follow."""
    evaluation = yield from tally.attempt(evaluate46(ctx, plan), "cron")
    if evaluation is not None:
        yield from cron_step(file46(ctx, plan, evaluation), tally)


def send_it_turn46(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """The send-it duty at 46: rounds of :func:`work_send_it46`."""
    yield from send_it_rounds(lambda batch: work_send_it46(ctx, batch), tally)


DUTIES46: tuple[Duty, ...] = (
    Duty("stats history", "monitor", history_start),
    Duty(
        "monitor",
        "monitor",
        monitor_chunk46,
        per_chunk=True,
        interval="monitor_interval",
        locks=(
            locks.QUEUE_STATS,
            stats_history.INSERT_LOCK,
            locks.table_key("<table>", "failJobsByTimeout"),
            locks.table_key("<table>", "failJobsByHeartbeat"),
        ),
        reports=("monitored", "warnings", "expired", "recorded", "busy"),
    ),
    Duty(
        "maintain",
        "monitor",
        maintain_chunk46,
        per_chunk=True,
        interval="maintenance_interval",
        locks=(
            locks.table_key("<table>", "deletion"),
            locks.table_key("<table>", "cleanupDependencies"),
        ),
        reports=("maintained", "deleted"),
    ),
    Duty("monitor backoff", "monitor", backoff_turn),
    Duty("warning retention", "monitor", warning_retention_turn),
    Duty("stats retention", "monitor", stats_retention_turn),
    Duty("upkeep", "monitor", upkeep_turn),
    Duty("attempt history", "monitor", attempts.sweep_turn),
    Duty(
        "reindex",
        "monitor",
        turns.reindex_turn,
        interval="reindex_interval",
        reports=("reindexed", "errors"),
    ),
    *timekeeping(cron_turn46, send_it_turn46),
    Duty(
        "flows",
        "flows",
        turns.flow_turn,
        interval="flow_interval",
        reports=("flows_resolved", "released"),
    ),
    Duty(
        "bam",
        "bam",
        turns.bam_turn,
        interval="bam_interval",
        locks=(turns.BAM_CLAIM_LOCK,),
        reports=("bam", "errors"),
    ),
)
"""The duties of a pass at schema 46, in the order it takes them (see the module)."""
