"""The claim statement: one CTE with ``FOR UPDATE SKIP LOCKED`` (pg-boss's fetchNextJob).

Singleton and stately queues need one more statement first, :func:`lock_keys`.
Activating a job of those policies inserts into a unique index (i2, i3); if
that index already holds an entry of a transaction still in progress, the
insert waits for it. A fetcher whose snapshot predates another fetcher's commit
(or that row-locked, through the FOR UPDATE re-check, a job a worker is now
completing) could then wait in a cycle: a deadlock that PostgreSQL breaks after
``deadlock_timeout`` by failing one side, possibly the worker's ``complete``.

So keys are claimed under transaction-scoped advisory locks, taken without
waiting, *before* the claim statement starts: its snapshot then sees every
activation committed by whoever held a key before, and no other fetcher can be
activating a key it holds. Its unique-index inserts never wait on our own
clients; a conflict with a client that takes no key locks (Node pg-boss) still
ends in a savepoint and an empty answer, as in pg-boss.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    not_,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY

from ..models.enums import JobState
from ._common import JOB, QUEUE, advisory_key, state, state_text
from .reading import readable_columns

RACY_POLICIES = ("singleton", "stately")
"""Policies whose unique index covers the ``active`` state: activating a job can conflict."""


def _key(column: ColumnElement[Any]) -> ColumnElement[Any]:
    # Keys compare through COALESCE like the unique indexes do, so "no key" and
    # "" are the same key.
    return func.coalesce(column, "")


def _queued(*, ignore_start_after: bool, singleton_aware: bool) -> list[ColumnElement[Any]]:
    """Conditions on ``job`` rows a fetch may take."""
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
    conditions: list[ColumnElement[Any]] = [
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
                    _key(busy.c.singleton_key) == _key(j.c.singleton_key),
                )
                .exists()
            )
        )
    else:
        # Literals, not an expanding IN parameter: the statement text is final at
        # compile time (no per-execution rendering) and the planner sees constants.
        racy = [literal_column(f"'{policy}'", Text) for policy in RACY_POLICIES]
        conditions.append(or_(j.c.policy.is_(None), j.c.policy.not_in(racy)))
    return conditions


def _order(columns: Any, priority: bool) -> list[Any]:
    order: list[Any] = [columns.created_on, columns.id]
    if priority:
        order.insert(0, columns.priority.desc())
    return order


@functools.cache
def lock_keys(*, priority: bool, ignore_start_after: bool) -> Select[Any]:
    """Try the advisory locks of the keys of the next ``:limit`` queued jobs of
    ``:qname``; return the keys (COALESCEd) whose lock this transaction now holds.

    Never waits: a key another transaction holds is left out. The locks last
    until the transaction ends. ``:lock_schema`` keeps schemas apart.
    """
    j = JOB
    next_rows = (
        select(_key(j.c.singleton_key).label("key"))
        .where(and_(*_queued(ignore_start_after=ignore_start_after, singleton_aware=True)))
        .order_by(*_order(j.c, priority))
        .limit(bindparam("limit", type_=Integer))
        .subquery("next")
    )
    # DISTINCT keeps the planner from pushing the (volatile) lock call below
    # it, so each key is tried once.
    keys = select(next_rows.c.key).distinct().subquery("keys")
    taken = func.pg_try_advisory_xact_lock(
        advisory_key(
            bindparam("lock_schema", type_=Text)
            + "alkstore.fetch."
            + bindparam("qname", type_=Text)
            + "."
            + keys.c.key
        )
    )
    return select(keys.c.key).where(taken)


@functools.cache
def fetch_jobs(*, priority: bool, ignore_start_after: bool, singleton_aware: bool) -> Select[Any]:
    """Claim up to ``:limit`` queued jobs of queue ``:qname`` and return them, activated.

    Ordering is ``priority DESC`` (unless ``priority`` is false), then FIFO by
    ``created_on``, ``id``. ``start_after < now()`` is strict, as in pg-boss.

    ``singleton_aware`` is for singleton and stately queues: it only takes jobs
    of the keys in ``:keys`` (locked by :func:`lock_keys` in an earlier
    statement), skips keys that already have an active job, and activates at
    most one job per key (the first in fetch order). Otherwise rows of those two
    policies are left alone, so the statement can never hit their unique
    indexes; running it needs no savepoint.

    ``:cached_policy`` is the policy the caller believes the queue has (it is
    cached on the client side): if the queue row says otherwise, or is gone,
    nothing is claimed, and the caller refreshes its belief and asks again.
    """
    j = JOB
    conditions = _queued(ignore_start_after=ignore_start_after, singleton_aware=singleton_aware)
    if singleton_aware:
        conditions.append(_key(j.c.singleton_key) == func.any(bindparam("keys", type_=ARRAY(Text))))
    candidates = (
        select(j.c.id, j.c.singleton_key, j.c.priority, j.c.created_on)
        .where(and_(*conditions))
        .order_by(*_order(j.c, priority))
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("next")
    )
    chosen = candidates
    if singleton_aware:
        # One job per key per call; the other locked rows stay queued.
        c = candidates.c
        ranked = select(
            c.id,
            func.row_number()
            .over(partition_by=_key(c.singleton_key), order_by=_order(c, priority))
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
    # Returned through readable_columns: a row another client wrote with values
    # Python cannot hold must not make reading the whole batch fail (the caller
    # fails that job instead, see ops/working.py).
    return select(*readable_columns(claimed.c)).order_by(*_order(claimed.c, priority))


@functools.cache
def keyed_jobs(*, priority: bool, ignore_start_after: bool) -> Select[Any]:
    """``(id, singleton_key)`` of up to ``:limit`` jobs of queue ``:qname`` that a
    singleton-aware claim could take, with their keys in ``:keys``, row-locked
    (``SKIP LOCKED``) for the caller to fail.

    For keys too large for the unique index that activation enters: such a job
    can never be activated, so it is failed instead (see ops/working.py).
    """
    j = JOB
    conditions = _queued(ignore_start_after=ignore_start_after, singleton_aware=True)
    conditions.append(_key(j.c.singleton_key) == func.any(bindparam("keys", type_=ARRAY(Text))))
    return (
        select(j.c.id, j.c.singleton_key)
        .where(and_(*conditions))
        .order_by(*_order(j.c, priority))
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )
