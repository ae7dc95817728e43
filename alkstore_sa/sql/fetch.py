"""The claim statement: one CTE with ``FOR UPDATE SKIP LOCKED`` (reference §5)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Integer, Select, Text, and_, bindparam, case, func, not_, or_, select

from ..models.enums import JobState
from ._common import JOB, QUEUE, state, state_text

RACY_POLICIES = ("singleton", "stately")
"""Policies whose unique index covers the ``active`` state: activating a job can conflict."""


@functools.cache
def fetch_jobs(*, priority: bool, ignore_start_after: bool, singleton_aware: bool) -> Select[Any]:
    """Claim up to ``:limit`` queued jobs of queue ``:qname`` and return them, activated.

    Ordering is ``priority DESC`` (unless ``priority`` is false), then FIFO by
    ``created_on``, ``id``. ``start_after < now()`` is strict, as in pg-boss.

    ``singleton_aware`` is for singleton and stately queues: it skips keys that
    already have an active job and activates at most one job per key per call
    (the first of each key in fetch order). Otherwise rows of those two policies
    are left alone, so the statement can never hit their unique indexes; running
    it needs no savepoint.

    ``:cached_policy`` is the policy the caller believes the queue has (it is cached on
    the client side): if the queue row says otherwise, or is gone, nothing is
    claimed, and the caller refreshes its belief and asks again.
    """
    j = JOB
    # An uncorrelated EXISTS is evaluated once per statement (a one-time filter),
    # so guarding the cached policy costs one primary-key probe.
    policy_holds = (
        select(QUEUE.c.name)
        .where(
            QUEUE.c.name == bindparam("qname", type_=Text),
            QUEUE.c.policy == bindparam("cached_policy", type_=Text),
        )
        .exists()
    )
    conditions = [
        j.c.name == bindparam("qname", type_=Text),
        j.c.state < state_text(JobState.ACTIVE),
        policy_holds,
    ]
    if not ignore_start_after:
        conditions.append(j.c.start_after < func.now())
    if singleton_aware:
        busy = JOB.alias("busy")
        conditions.append(
            not_(
                select(busy.c.id)
                .where(
                    busy.c.name == j.c.name,
                    busy.c.state == state_text(JobState.ACTIVE),
                    func.coalesce(busy.c.singleton_key, "") == func.coalesce(j.c.singleton_key, ""),
                )
                .exists()
            )
        )
    else:
        conditions.append(or_(j.c.policy.is_(None), j.c.policy.not_in(RACY_POLICIES)))

    order: list[Any] = [j.c.created_on, j.c.id]
    if priority:
        order.insert(0, j.c.priority.desc())
    candidates = (
        select(j.c.id, j.c.singleton_key, j.c.priority, j.c.created_on)
        .where(and_(*conditions))
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("next")
    )
    chosen = candidates
    if singleton_aware:
        # One job per key per call, the first in fetch order; the other locked
        # rows stay queued. Keys compare through COALESCE like the unique
        # indexes do, so "no key" and "" are the same key.
        c = candidates.c
        window_order: list[Any] = [c.created_on, c.id]
        if priority:
            window_order.insert(0, c.priority.desc())
        ranked = select(
            c.id,
            func.row_number()
            .over(partition_by=func.coalesce(c.singleton_key, ""), order_by=window_order)
            .label("rn"),
        ).cte("ranked")
        chosen = select(ranked.c.id).where(ranked.c.rn == 1).cte("chosen")

    claimed = (
        j.update()
        .where(j.c.name == bindparam("qname", type_=Text), j.c.id == chosen.c.id)
        .values(
            state=state(JobState.ACTIVE),
            started_on=func.now(),
            # retry_count rises on every fetch after the first (pg-boss counts
            # retries on the way back in, not on failure).
            retry_count=case(
                (j.c.started_on.is_not(None), j.c.retry_count + 1), else_=j.c.retry_count
            ),
        )
        .returning(*j.c)
        .cte("claimed")
    )
    order_out: list[Any] = [claimed.c.created_on, claimed.c.id]
    if priority:
        order_out.insert(0, claimed.c.priority.desc())
    return select(*claimed.c).order_by(*order_out)
