"""The attempt history as operations: a job's failed attempts, and the supervision
duty that removes the attempts of jobs that no longer exist (the "Attempt history"
page). The fails themselves record each attempt (:mod:`alkstore_sa.sql.common.failing`).
"""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

from .. import options as opt
from ..names import queue_ref
from ..records import JobAttempt
from ..sql.common import attempts as sql
from ._core import Call, Context, Op
from .frame import PassPlan, Tally
from .queues import require_queue

log = logging.getLogger("alkstore_sa.ops.attempts")

SWEEP_BATCH = 5_000
"""Attempts one batch of the sweep looks at for jobs that no longer exist: the sweep walks
the table in id order, a batch at a time (each in a transaction of its own), and starts
again at the end. A pass takes one batch, and the next while a batch deleted any, up to
the end: a backlog of orphans goes in one pass, so a steady stream of them never grows
one."""


def get_job_attempts(ctx: Context, name: str, id: object) -> Op[list[JobAttempt]]:
    """The failed attempts recorded for job ``id`` of queue ``name``, oldest first
    (empty without the attempt history table, or for a job with none: a job failed
    only by Node pg-boss has none)."""
    queue_ref(name)
    job_id = opt.job_id(id)
    attempts: list[JobAttempt] = []
    if ctx.history:
        result = yield Call(sql.job_attempts(), {"qname": name, "id": job_id})
        attempts = [JobAttempt.from_row(r) for r in result.mappings().all()]
    if not attempts:
        yield from require_queue(ctx, name)  # "no such queue" is an error; "none" is not
    return attempts


def sweep(ctx: Context, after: int, limit: int) -> Op[tuple[int | None, int]]:
    """One batch of :func:`~alkstore_sa.sql.common.attempts.sweep_orphans`: the last id
    looked at (``None``: the end was reached) and how many attempts were deleted."""
    row = (yield Call(sql.sweep_orphans(), {"after": after, "limit": limit})).one()
    return (None if row.last is None else int(row.last)), int(row.deleted)


def sweep_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Generator[Op[Any], Any, None]:
    """The attempt history's duty: batches of :data:`SWEEP_BATCH` attempts, from where
    the last pass on this engine stopped, while they find orphans (up to the end of
    the table); nothing on a schema without the table."""
    if not ctx.history:
        return
    deleted, found = 0, True
    while found:
        after = ctx.sweeps.get(ctx.schema, 0)
        done = yield from tally.attempt(sweep(ctx, after, SWEEP_BATCH), "attempts")
        if done is None:
            break
        last, batch = done
        ctx.sweeps[ctx.schema] = 0 if last is None else last
        deleted += batch
        found = bool(batch) and last is not None
    if deleted:
        log.info(
            "deleted %d attempt(s) of jobs that no longer exist",
            deleted,
            extra={"action": "attempts_swept", "schema": ctx.schema, "count": deleted},
        )
