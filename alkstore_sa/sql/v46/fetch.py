"""The claim at schema 46 (pg-boss 12.38's fetchNextJob), and the job reads.

What changes from the schema-26 claim (:mod:`alkstore_sa.sql.fetch`), each as
pg-boss 12.38 does it:

* the rows a fetch may take are exactly ``name = :qname AND state < 'active' AND
  NOT blocked AND start_after <= job_now()``, ordered ``priority DESC,
  created_on`` and nothing else: that is the predicate and order of the
  partial index ``job_i11``, so a backlog is read in index order with no sort.
  ``blocked`` jobs (flow children waiting for their parents) are never taken,
  and a job due exactly now is (``<=``, where 26 had ``<``);
* activation also stamps ``heartbeat_on``, which Node's monitor checks against
  ``heartbeat_seconds``;
* key_strict_fifo: only each key's head (its retry job if it has one, else its
  oldest due job) is a candidate, and keys holding an active, retry or failed
  job are skipped; the activation can still collide with a client that takes no
  key locks, so it runs in a savepoint and a conflict is an empty fetch;
* singleton and stately: keys with an active job of the policy are skipped, at
  most one job per key per batch; keys are first locked as at 26 (see
  :mod:`alkstore_sa.sql.fetch` for why).

Kept from 26: the guard on the cached policy, and rows read through
:func:`alkstore_sa.sql.reading.readable_columns` so one poison row never fails
the batch.
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
from sqlalchemy.dialects.postgresql import ARRAY, distinct_on

from ...models.enums import JobState
from .._common import advisory_key, state, state_text
from ..reading import readable, readable_columns
from ..tables46 import JOB, QUEUE
from . import job_now

SINGLETON_POLICIES = ("singleton", "stately")
"""Policies whose unique index covers ``active``: the claim skips keys already active."""

KEY_STRICT_FIFO = "key_strict_fifo"

RACY_POLICIES = (*SINGLETON_POLICIES, KEY_STRICT_FIFO)
"""Policies whose activation can hit a unique index (i2, i3, i8)."""


def _key(column: ColumnElement[Any]) -> ColumnElement[Any]:
    # As the unique indexes i2/i3 compare keys: "no key" and "" are one key.
    return func.coalesce(column, "")


def _literal(text: str) -> ColumnElement[Any]:
    # Literals, not binds, so the planner can match partial indexes on policy.
    return literal_column(f"'{text}'", Text)


def _queued(j: Any, *, policy: str, ignore_start_after: bool) -> list[ColumnElement[Any]]:
    """The rows of ``j`` a fetch of a ``policy`` queue may take."""
    # An uncorrelated EXISTS is a one-time filter: the cached policy is checked
    # once per statement, and a stale one claims nothing (the caller re-reads it).
    policy_holds = (
        select(QUEUE.c.name)
        .where(
            QUEUE.c.name == bindparam("qname", type_=Text),
            QUEUE.c.policy == bindparam("cached_policy", type_=Text),
        )
        .exists()
    )
    # Exactly job_i11's predicate (plus the due time, its last key column): any
    # other shape of it and the planner no longer reads the queue in index order.
    conditions: list[ColumnElement[Any]] = [
        j.c.name == bindparam("qname", type_=Text),
        j.c.state < state_text(JobState.ACTIVE),
        not_(j.c.blocked),
        policy_holds,
    ]
    if not ignore_start_after:
        conditions.append(j.c.start_after <= job_now())
    if policy in SINGLETON_POLICIES:
        busy = JOB.alias("busy")
        conditions.append(
            not_(
                select(busy.c.id)
                .where(
                    busy.c.name == j.c.name,
                    busy.c.state == state_text(JobState.ACTIVE),
                    busy.c.policy == _literal(policy),
                    _key(busy.c.singleton_key) == _key(j.c.singleton_key),
                )
                .exists()
            )
        )
    elif policy == KEY_STRICT_FIFO:
        held = JOB.alias("held")
        conditions.append(
            not_(
                select(held.c.id)
                .where(
                    held.c.name == j.c.name,
                    held.c.singleton_key == j.c.singleton_key,
                    held.c.state.in_(
                        [
                            state_text(JobState.ACTIVE),
                            state_text(JobState.RETRY),
                            state_text(JobState.FAILED),
                        ]
                    ),
                    held.c.policy == _literal(KEY_STRICT_FIFO),
                    held.c.id != j.c.id,
                )
                .exists()
            )
        )
    else:
        # Rows of another policy than the queue's (written by hand) are left
        # alone, so this statement can never hit their unique indexes.
        conditions.append(
            or_(j.c.policy.is_(None), j.c.policy.not_in([_literal(p) for p in RACY_POLICIES]))
        )
    return conditions


def _order(columns: Any) -> list[Any]:
    # No id: job_i11 ends at created_on (a uuid tiebreak would need a sort).
    return [columns.priority.desc(), columns.created_on]


def _heads(*, ignore_start_after: bool) -> Any:
    """Each key's head among its queued, unblocked, due jobs: its retry job if it
    has one (``state DESC``), else its oldest (``job_i10`` serves this order)."""
    h = JOB.alias("h")
    conditions = [
        h.c.name == bindparam("qname", type_=Text),
        h.c.state < state_text(JobState.ACTIVE),
        not_(h.c.blocked),
        h.c.policy == _literal(KEY_STRICT_FIFO),
    ]
    if not ignore_start_after:
        conditions.append(h.c.start_after <= job_now())
    return (
        select(h.c.id)
        .ext(distinct_on(h.c.singleton_key))
        .where(*conditions)
        .order_by(h.c.singleton_key, h.c.state.desc(), h.c.created_on, h.c.id)
        .cte("strict_fifo_heads")
        .prefix_with("MATERIALIZED")
    )


@functools.cache
def lock_keys(*, policy: str, ignore_start_after: bool) -> Select[Any]:
    """Try the advisory locks of the keys of the next ``:limit`` claimable jobs of
    ``:qname`` (a singleton or stately queue); return the keys (COALESCEd) this
    transaction now holds. Never waits. Same locks as at 26, so fetchers on either
    side of a live upgrade still exclude each other."""
    j = JOB
    next_rows = (
        select(_key(j.c.singleton_key).label("key"))
        .where(and_(*_queued(j, policy=policy, ignore_start_after=ignore_start_after)))
        .order_by(*_order(j.c))
        .limit(bindparam("limit", type_=Integer))
        .subquery("next")
    )
    # DISTINCT keeps the (volatile) lock call above it: each key is tried once.
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
def fetch_jobs(*, policy: str, ignore_start_after: bool) -> Select[Any]:
    """Claim up to ``:limit`` jobs of queue ``:qname`` (policy ``policy``, also
    bound as ``:cached_policy``) and return them activated, every schema-46 column
    read through ``readable_columns``.

    Singleton and stately queues also bind ``:keys`` (from :func:`lock_keys`) and
    get at most one job per key. A key_strict_fifo claim may raise a unique
    violation (a Node fetcher activated the key first): run it in a savepoint.
    """
    j = JOB
    conditions = _queued(j, policy=policy, ignore_start_after=ignore_start_after)
    if policy in SINGLETON_POLICIES:
        conditions.append(_key(j.c.singleton_key) == func.any(bindparam("keys", type_=ARRAY(Text))))
    if policy == KEY_STRICT_FIFO:
        heads = _heads(ignore_start_after=ignore_start_after)
        conditions.append(j.c.id.in_(select(heads.c.id)))
    candidates = (
        select(j.c.id, j.c.singleton_key, j.c.priority, j.c.created_on)
        .where(and_(*conditions))
        .order_by(*_order(j.c))
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True, of=j)
        .cte("next")
    )
    chosen = candidates
    if policy in SINGLETON_POLICIES:
        # One job per key per call; the other locked rows stay queued.
        c = candidates.c
        ranked = select(
            c.id,
            func.row_number()
            .over(partition_by=_key(c.singleton_key), order_by=_order(c))
            .label("rn"),
        ).cte("ranked")
        chosen = select(ranked.c.id).where(ranked.c.rn == 1).cte("chosen")
    claimed = (
        j.update()
        .where(j.c.name == bindparam("qname", type_=Text), j.c.id == chosen.c.id)
        .values(
            state=state(JobState.ACTIVE),
            started_on=job_now(),
            heartbeat_on=job_now(),
            # Every fetch after the first counts a retry (pg-boss counts them on
            # the way back in, and its settle fence relies on it).
            retry_count=case(
                (j.c.started_on.is_not(None), j.c.retry_count + 1), else_=j.c.retry_count
            ),
        )
        .returning(*j.c)
        .cte("claimed")
    )
    return select(*readable_columns(claimed.c, JOB)).order_by(*_order(claimed.c), claimed.c.id)


@functools.cache
def keyed_jobs(*, policy: str, ignore_start_after: bool) -> Select[Any]:
    """``(id, singleton_key)`` of up to ``:limit`` claimable jobs of ``:qname`` whose
    keys are in ``:keys``, row-locked for the caller to fail (keys too large for
    the unique index that activating them enters; see ops/poison.py)."""
    j = JOB
    conditions = _queued(j, policy=policy, ignore_start_after=ignore_start_after)
    conditions.append(_key(j.c.singleton_key) == func.any(bindparam("keys", type_=ARRAY(Text))))
    return (
        select(j.c.id, j.c.singleton_key)
        .where(and_(*conditions))
        .order_by(*_order(j.c))
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


@functools.cache
def get_jobs() -> Select[Any]:
    """Jobs of queue ``:qname`` by ``:ids``, every schema-46 column, readable."""
    stmt = select(*JOB.c).where(
        JOB.c.name == bindparam("qname", type_=Text),
        JOB.c.id == func.any(bindparam("ids", type_=ARRAY(JOB.c.id.type))),
    )
    return readable(stmt, JOB)


@functools.cache
def list_jobs(state_filter: JobState | None = None) -> Select[Any]:
    """Jobs of queue ``:qname``, newest first, at most ``:limit``; only
    ``state_filter`` if given (a literal, so partial indexes apply)."""
    stmt = select(*readable_columns(JOB.c, JOB)).where(JOB.c.name == bindparam("qname", type_=Text))
    if state_filter is not None:
        stmt = stmt.where(JOB.c.state == state_text(state_filter))
    return stmt.order_by(JOB.c.created_on.desc(), JOB.c.id).limit(bindparam("limit", type_=Integer))
