"""Heartbeats (schema 46): refresh ``heartbeat_on`` of running jobs, pg-boss's ``touch``.

A job with ``heartbeat_seconds`` must have its ``heartbeat_on`` moved at least
that often while it is ``active``, or supervision (ours, or Node pg-boss's
monitor) fails it with ``{"value": {"message": "job heartbeat timeout"}}``. Our
workers do it themselves (the "Keep long jobs alive with heartbeats" page); :func:`touch` is
for code that runs a fetched job by itself.
"""

from __future__ import annotations

from ..records import Settled
from ._core import Call, Context, Op
from .working import _found_or_missing, _settle_params, settlements


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
