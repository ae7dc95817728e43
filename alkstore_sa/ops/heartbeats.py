"""Heartbeats (schema 46): refresh ``heartbeat_on`` of running jobs, pg-boss's ``touch``.

A job with ``heartbeat_seconds`` must have its ``heartbeat_on`` moved at least
that often while it is ``active``, or supervision (ours, or Node pg-boss's
monitor) fails it with ``{"value": {"message": "job heartbeat timeout"}}``. Our
workers do it themselves (the "Keep long jobs alive with heartbeats" page); :func:`touch` is
for code that runs a fetched job by itself.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from .. import options as opt
from ..records import Settled
from ..sql.common import locks
from ..sql.statements import Failing, Statements
from ..sql.v26 import claims as claims26
from ..sql.v46 import fail as fail46_sql
from . import frame
from ._core import Call, Context, Op
from .attempts import recording
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


RESCUE26_KEY = "alkstore_claimrescue"
"""The advisory lock key (after the schema's) of the schema-26 rescue sweep: one sweeper
at a time, the others skip their turn."""


def _rescue26(sql: Statements) -> Failing:
    return sql.rescue_jobs()


def renew_claims(ctx: Context, owner: uuid.UUID, lapse: int) -> Op[bool]:
    """Schema 26: the worker ``owner`` is alive for ``lapse`` seconds more (one row per
    worker, whatever it runs, see :mod:`alkstore_sa.sql.v26.claims`). Whether the schema
    has the claim tables (nothing is written otherwise)."""
    if not ctx.claims or ctx.has("touch"):
        return False
    yield Call(claims26.renew(), {"claim_owner": owner, "claim_lapse": lapse})
    return True


def rescue26(ctx: Context, names: Sequence[str], limit: int = RESCUE_BATCH) -> Op[dict[str, int]]:
    """Schema 26: fail for retry (retry, failed, dead letter: the normal fail, recorded
    in the attempt history with cause ``heartbeat``) the jobs of queues ``names`` still
    active in an attempt one of our workers claimed, whose worker stopped renewing its
    liveness row; then remove the claim rows of attempts that ended. Under a tried
    advisory lock: a sweep another session runs now is left to it.

    A Node worker's claims record nothing, so its jobs are never touched (the
    "Guarantees" page). Nothing without the claim tables, nor at 46 (heartbeats, see
    :func:`rescue`). Returns how many jobs each queue had failed or set to retry. Run
    it in a transaction.
    """
    if not names or not ctx.claims or ctx.has("touch"):
        return {}
    opt.check_int("limit", limit, minimum=1)
    if ctx.sql.advisory_locks:
        params = {"lock_schema": ctx.lock_name, "lock_key": RESCUE26_KEY}
        if not (yield Call(locks.try_xact_lock(), params)).scalar_one():
            return {}
    counts: dict[str, int] = {}
    rows = yield from recording(
        ctx,
        _rescue26,
        {
            "names": list(names),
            "limit": limit,
            "timeout_output": opt.encode_json("output", fail46_sql.HEARTBEAT_OUTPUT),
        },
    )
    for row in rows:
        counts[row.name] = counts.get(row.name, 0) + 1
    yield Call(claims26.forget())
    yield Call(claims26.forget_claimers())
    return counts
