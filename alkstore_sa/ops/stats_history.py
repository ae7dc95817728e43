"""Queue-stats history at schema 46, as units of the supervise pass
(the monitor and retention duties of :mod:`alkstore_sa.ops.duties46`).

The rule (the "Supervision and cron" page, "Queue-stats history"): a pass writes
history when ``persist_queue_stats`` is set, **or** when another instance
persists it, as :func:`~alkstore_sa.sql.v46.stats.persisted_elsewhere` reads
from the schema. A monitor turn we win then never drops the row a Node instance
with ``persistQueueStats`` would have written in it. Rows written only because
of the rule carry a version-8 id, so they are never taken as evidence
themselves, and such a pass leaves retention to the instances that persist (each
with its own ``queueStatRetentionDays``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..sql.v46 import stats as sql
from . import frame
from ._core import Call, Context, Op
from .frame import PassPlan

INSERT_LOCK = "queue-stats-insert"


@dataclass(frozen=True, slots=True)
class History:
    """What a pass does about queue-stats history.

    :ivar write: count throughput and write a row per queue counted.
    :ivar own: by our own ``persist_queue_stats`` (rows unmarked, retention
        applied), not only because another instance persists it.
    """

    write: bool = False
    own: bool = False


NO_HISTORY = History()
"""A pass that writes no history."""


def pass_seconds(plan: PassPlan) -> float:
    """How far apart this instance's counting passes are (the longer timer)."""
    return max(plan.settings.monitor_interval, plan.settings.supervise_interval)


def reset_seconds(plan: PassPlan) -> int:
    """The longest window counted: 2 hours, or two passes if longer."""
    return max(sql.RESET_SECONDS, int(2 * pass_seconds(plan)))


def history_mode(ctx: Context, plan: PassPlan) -> Op[History]:
    """Decide for this pass (see the module): own, on behalf of another, or none."""
    if plan.settings.persist_queue_stats:
        return History(write=True, own=True)
    params = {"window_seconds": 3 * pass_seconds(plan), "now": plan.now}
    found = (yield Call(sql.persisted_elsewhere(), params)).scalar_one()
    return History(write=bool(found), own=False)


def _partition_state(ctx: Context, plan: PassPlan) -> Op[tuple[bool, dt.date]]:
    row = (yield Call(sql.partition_state(), {"schema_name": ctx.schema, "now": plan.now})).one()
    return bool(row.partitioned), row.today


def ensure_partitions(ctx: Context, plan: PassPlan) -> Op[None]:
    """Today's and tomorrow's UTC partitions, when queue_stats is partitioned by day
    (no default partition exists: a row outside every day is refused)."""
    partitioned, today = yield from _partition_state(ctx, plan)
    if partitioned:
        for day in (today, today + dt.timedelta(days=1)):
            yield Call(sql.create_partition(ctx.schema, day))


def write_history(
    ctx: Context, names: Sequence[str], plan: PassPlan, history: History
) -> Op[list[str]]:
    """A ``queue_stats`` row for each queue of ``names`` (those the aggregate
    wrote), under Node's ``queue-stats-insert`` lock; the queues written."""
    yield from frame.lock(ctx, INSERT_LOCK, plan)
    params = {"names": list(names), "marked": not history.own, "now": plan.now}
    result = yield Call(sql.insert_history(), params)
    return sorted(r.name for r in result)


def true_up(ctx: Context, names: Sequence[str], plan: PassPlan) -> Op[float]:
    """Raise the recent history rows of ``names`` to a recount; the pin seconds
    (0 when another instance held the ``queue-stats`` lock)."""
    params = {"names": list(names), "lock_schema": ctx.lock_name, "now": plan.now}
    statement = sql.true_up(advisory=ctx.sql.advisory_locks)
    row = (yield Call(statement, params)).first()
    return float(row.pin_seconds or 0) if row is not None else 0.0


def drop_old_partitions(ctx: Context, plan: PassPlan) -> Op[tuple[bool, list[str]]]:
    """Drop the day partitions older than the retention; ``(partitioned, dropped)``."""
    partitioned, today = yield from _partition_state(ctx, plan)
    if not partitioned:
        return False, []
    cutoff = today - dt.timedelta(days=plan.settings.queue_stats_retention_days)
    rows = (yield Call(sql.day_partitions(), {"schema_name": ctx.schema})).all()
    dropped = sorted(r.name for r in rows if r.day < cutoff)
    for name in dropped:
        yield Call(sql.drop_partition(ctx.schema, name))
    return True, dropped


def delete_old_batch(ctx: Context, after: tuple[Any, Any] | None, plan: PassPlan) -> Op[Any]:
    """One batch of retention on a plain queue_stats; its row (cursor, deleted)."""
    params: dict[str, Any] = {
        "days": plan.settings.queue_stats_retention_days,
        "batch": plan.settings.delete_batch_size,
        "now": plan.now,
    }
    if after is not None:
        params["after_on"], params["after_id"] = after
    return (yield Call(sql.delete_old_history(cursor=after is not None), params)).one()


__all__ = [
    "NO_HISTORY",
    "History",
    "delete_old_batch",
    "drop_old_partitions",
    "ensure_partitions",
    "history_mode",
    "pass_seconds",
    "reset_seconds",
    "true_up",
    "write_history",
]
