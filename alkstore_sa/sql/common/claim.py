"""The pieces of the claim that schema 26 and schema 46 share.

Both claims (:mod:`alkstore_sa.sql.v26.fetch`, :mod:`alkstore_sa.sql.v46.fetch`) take
the same steps: a guard on the cached policy, advisory locks on the keys of
singleton and stately queues taken before the claim, candidates row-locked with
``SKIP LOCKED``, at most one job per key, and an ``UPDATE ... RETURNING`` that
activates them. Each piece here takes the tables and columns it works on, so
each version passes its own (``sql.common.base`` at 26, ``sql.v46.tables`` at 46) and
keeps what differs (the predicate, the order, the clock) in its own module.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Integer,
    Select,
    Table,
    Text,
    and_,
    bindparam,
    case,
    func,
    literal_column,
    not_,
    or_,
    select,
    true,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY

from ...models.enums import JobState
from .base import advisory_key, qname, state, state_text


def key_of(column: ColumnElement[Any]) -> ColumnElement[Any]:
    """A singleton key as the unique indexes compare it: ``COALESCE(key, '')``,
    so "no key" and ``""`` are one key."""
    return func.coalesce(column, "")


def policy_literal(text: str) -> ColumnElement[Any]:
    """A policy name as a SQL literal, not a bind: the statement text is final at
    compile time and the planner can match partial indexes on ``policy``."""
    return literal_column(f"'{text}'", Text)


def in_keys(j: Any) -> ColumnElement[bool]:
    """The row's key is one of ``:keys`` (those :func:`lock_keys` returned)."""
    return key_of(j.c.singleton_key) == func.any(bindparam("keys", type_=ARRAY(Text)))


def queued(
    j: Any, queue: Table, *also: ColumnElement[bool], due: ColumnElement[Any] | None
) -> list[ColumnElement[Any]]:
    """``name = :qname AND state < 'active' AND <also> AND <policy holds> [AND <due>]``.

    The policy guard is an uncorrelated EXISTS on ``queue``: a one-time filter,
    so checking the policy the caller cached costs one primary-key probe per
    statement, and a stale one claims nothing (the caller re-reads it).
    ``due`` is the version's comparison of ``start_after`` with its clock, or
    None when the caller ignores ``start_after``.
    """
    policy_holds = (
        select(queue.c.name)
        .where(
            queue.c.name == qname(),
            queue.c.policy == bindparam("cached_policy", type_=Text),
        )
        .exists()
    )
    conditions: list[ColumnElement[Any]] = [
        j.c.name == qname(),
        j.c.state < state_text(JobState.ACTIVE),
        *also,
        policy_holds,
    ]
    if due is not None:
        conditions.append(due)
    return conditions


def key_not_active(job: Table, j: Any, *, policy: str | None = None) -> ColumnElement[bool]:
    """No job of ``j``'s queue and key is ``active`` (of ``policy``, if given)."""
    busy = job.alias("busy")
    of_policy = [] if policy is None else [busy.c.policy == policy_literal(policy)]
    return not_(
        select(busy.c.id)
        .where(
            busy.c.name == j.c.name,
            busy.c.state == state_text(JobState.ACTIVE),
            *of_policy,
            key_of(busy.c.singleton_key) == key_of(j.c.singleton_key),
        )
        .exists()
    )


def not_of_policies(j: Any, policies: Sequence[str]) -> ColumnElement[bool]:
    """The row has no policy or one not in ``policies``: rows of those policies
    are left alone, so a claim of another policy can never hit their unique
    indexes."""
    return or_(j.c.policy.is_(None), j.c.policy.not_in([policy_literal(p) for p in policies]))


def lock_keys(j: Any, conditions: Sequence[ColumnElement[Any]], order: list[Any]) -> Select[Any]:
    """Try the advisory locks of the keys of the first ``:limit`` rows of ``j``
    matching ``conditions`` in ``order``; return the keys (COALESCEd) this
    transaction now holds. Never waits; ``:lock_schema`` keeps schemas apart.
    """
    next_rows = (
        select(key_of(j.c.singleton_key).label("key"))
        .where(*conditions)
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
        .subquery("next")
    )
    # DISTINCT keeps the planner from pushing the (volatile) lock call below
    # it, so each key is tried once.
    keys = select(next_rows.c.key).distinct().subquery("keys")
    taken = func.pg_try_advisory_xact_lock(
        advisory_key(
            bindparam("lock_schema", type_=Text) + "alkstore.fetch." + qname() + "." + keys.c.key
        )
    )
    return select(keys.c.key).where(taken)


def locked_rows(
    columns: Sequence[Any],
    conditions: Sequence[ColumnElement[Any]],
    order: list[Any],
    *,
    lock: bool = True,
) -> Select[Any]:
    """``columns`` of the first ``:limit`` rows matching ``conditions`` in
    ``order``, row-locked ``FOR UPDATE SKIP LOCKED`` (without ``lock``: not locked)."""
    rows = (
        select(*columns)
        .where(*conditions)
        .order_by(*order)
        .limit(bindparam("limit", type_=Integer))
    )
    return rows.with_for_update(skip_locked=True) if lock else rows


HEAD_ROOM = 2
"""The head of a :func:`head_first_rows` claim holds ``HEAD_ROOM * :limit + HEAD_EXTRA``
rows: room for the rows that other claims running at the same time lock or take first."""
HEAD_EXTRA = 100
"""See :data:`HEAD_ROOM`."""


def head_first_rows(
    j: Any,
    columns: Sequence[Any],
    conditions: Sequence[ColumnElement[Any]],
    order: list[Any],
    *,
    head_conditions: Sequence[ColumnElement[Any]],
) -> CTE:
    """What :func:`locked_rows` selects (the first ``:limit`` rows of ``j`` matching
    ``conditions`` in ``order``, ``FOR UPDATE SKIP LOCKED``), without sorting every
    matching row when the answer is at the head, as the CTE ``next``.

    Below ``LIMIT``, PostgreSQL's row locking keeps the sort from being bounded:
    without an index in ``order`` (schema 26), :func:`locked_rows` sorts all
    matching rows in full, on disk once they outgrow ``work_mem``. So first
    ``head`` (no locks): the first rows in ``order`` matching ``head_conditions``
    (a superset of ``conditions``), a top-N sort that keeps only them in memory;
    then ``fast``: :func:`locked_rows` over those rows alone. Every row outside
    ``head`` comes after all of it in ``order``, so when ``fast`` has ``:limit``
    rows, or ``head`` was not full (it then holds every candidate), ``fast`` is the
    answer :func:`locked_rows` would give. Otherwise (rows of the head locked or
    taken by other claims meanwhile, or failing ``conditions``) ``slow``, which
    is :func:`locked_rows` itself, runs instead; it is never scanned when not
    needed (a one-time filter), and rows ``fast`` locked are this transaction's
    own, so ``slow`` takes them again. (Should a head row another claim held be
    released between the two, ``slow`` may take it instead of one of ``fast``'s,
    which then stays row-locked, not claimed, until the transaction ends.)
    """
    limit = bindparam("limit", type_=Integer)
    room = limit * literal_column(str(HEAD_ROOM), Integer) + literal_column(
        str(HEAD_EXTRA), Integer
    )
    head = select(j.c.id).where(*head_conditions).order_by(*order).limit(room).cte("head")
    fast = (locked_rows(columns, [*conditions, j.c.id.in_(select(head.c.id))], order)).cte("fast")
    fast_count = select(func.count()).select_from(fast).scalar_subquery()
    head_count = select(func.count()).select_from(head).scalar_subquery()
    needs_slow = and_(fast_count < limit, head_count >= room)
    slow = locked_rows(columns, [*conditions, needs_slow], order).cte("slow")
    return union_all(
        select(*fast.c).where(not_(needs_slow)),
        select(*slow.c),
    ).cte("next")


def one_per_key(candidates: CTE, order: list[Any]) -> CTE:
    """The first of ``candidates`` (in ``order``) of each key: one job per key
    per call; the other locked rows stay queued."""
    c = candidates.c
    ranked = select(
        c.id,
        func.row_number().over(partition_by=key_of(c.singleton_key), order_by=order).label("rn"),
    ).cte("ranked")
    return select(ranked.c.id).where(ranked.c.rn == 1).cte("chosen")


def activate(
    j: Table, chosen: CTE, now: ColumnElement[Any], *, recheck: bool = False, **stamps: Any
) -> CTE:
    """``UPDATE`` the jobs ``chosen`` to ``active`` at ``now`` (plus ``stamps``),
    returning every column, as the CTE ``claimed``. With ``recheck``, only those still
    queued (``state < 'active'``): for candidates read without row locks."""
    still_queued = [j.c.state < state(JobState.ACTIVE)] if recheck else []
    return (
        j.update()
        .where(j.c.name == qname(), j.c.id == chosen.c.id, *still_queued)
        .values(
            state=state(JobState.ACTIVE),
            started_on=now,
            **stamps,
            # retry_count rises on every fetch after the first (pg-boss counts
            # retries on the way back in, not on failure, and its settle fence
            # at 46 relies on it).
            retry_count=case(
                (j.c.started_on.is_not(None), j.c.retry_count + 1), else_=j.c.retry_count
            ),
        )
        .returning(*j.c)
        .cte("claimed")
    )


def commit_without_flush(stmt: Select[Any]) -> Select[Any]:
    """``stmt`` that also sets ``synchronous_commit`` off for its own transaction
    (``set_config(..., true)``, evaluated once, before the rows).

    Only for a claim run alone in autocommit by a worker (never inside a caller's
    transaction, which the setting would outlive): its COMMIT then returns without
    waiting for the WAL flush, the wait that bounds a serial fetch loop. Should the
    database server crash within the next fraction of a second, the claim may be
    undone: its jobs are queued again and run again, as after an expired lease; a
    later durable commit (a completion, say) flushes the claim with it. See
    the "Guarantees" page.
    """
    setting = literal_column("'synchronous_commit'", Text)
    value = literal_column("'off'", Text)
    relaxed = select(func.set_config(setting, value, true())).scalar_subquery()
    return stmt.where(relaxed.is_not(None))
