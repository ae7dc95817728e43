"""Heartbeats (schema 46): refresh ``heartbeat_on`` of running jobs, pg-boss's ``touch``.

A job with ``heartbeat_seconds`` must have its ``heartbeat_on`` moved at least
that often while it is ``active``, or supervision (ours, or Node pg-boss's
monitor) fails it with ``{"value": {"message": "job heartbeat timeout"}}``. Our
workers do it themselves (the "Keep long jobs alive with heartbeats" page); :func:`touch` is
for code that runs a fetched job by itself.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..records import Settled
from ..sql.common import locks
from . import frame
from ._core import Call, Context, Op
from .working import _found_or_missing, _settle_params, expire_heartbeats46, settlements


def touch(ctx: Context, name: str, jobs: object) -> Op[Settled]:
    """Stamp ``heartbeat_on`` on active jobs of ``name``: fenced for a fetched
    :class:`~alkstore_sa.Job` (only the attempt it was fetched in), unfenced for
    an id (any active job with it), as pg-boss's ``touch``.

    Every input is checked, and the schema version too, before any statement.
    """
    items = settlements(name, jobs)
    ctx.require("touch")
    if not items:
        return Settled(0, [])
    params = _settle_params(name, items)
    del params["outputs"]
    result = yield Call(ctx.sql.touch_jobs(), params)
    affected = list(result.scalars().all())
    yield from _found_or_missing(ctx, name, affected)
    return Settled(len(items), affected)


RESCUE_BATCH = 1000
"""Jobs one rescue statement fails at most per job table (pg-boss's expiry batch)."""


def rescue(ctx: Context, names: Sequence[str], limit: int = RESCUE_BATCH) -> Op[dict[str, int]]:
    """Schema 46: fail the active jobs of queues ``names`` whose heartbeat stopped, as
    the supervisor's heartbeat expiry does (pg-boss's ``failJobsByHeartbeat``: retry,
    failed, dead letter), one batch per job table, each under Node's advisory lock for
    that sweep, only tried: a table another session sweeps now is left to it.

    A worker runs it for its own queues every half ``liveness_seconds``, so that a
    crashed worker's jobs come back within about a minute whatever the supervision
    intervals (the "Guarantees" page). Nothing at 26 (no heartbeats). Returns how many
    jobs each queue had failed or set to retry. Run it in a transaction.
    """
    if not names or not ctx.has("touch"):
        return {}
    tables: dict[str, list[str]] = {}
    for queue, table in (yield from frame.queue_tables(ctx, names)):
        tables.setdefault(table, []).append(queue)
    counts: dict[str, int] = {}
    for table, queues in sorted(tables.items()):
        if ctx.sql.advisory_locks:
            key = locks.table_key(table, "failJobsByHeartbeat")
            params = {"lock_schema": ctx.lock_name, "lock_key": key}
            if not (yield Call(locks.try_xact_lock(), params)).scalar_one():
                continue
        for queue, n in (yield from expire_heartbeats46(ctx, queues, limit)).items():
            counts[queue] = counts.get(queue, 0) + n
    return counts
