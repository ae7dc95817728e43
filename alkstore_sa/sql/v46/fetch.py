"""The claim at schema 46 (pg-boss 12.38's fetchNextJob), and the job reads.

What changes from the schema-26 claim (:mod:`alkstore_sa.sql.v26.fetch`), each as
pg-boss 12.38 does it:

* the rows a fetch may take are exactly ``name = :qname AND state < 'active' AND
  NOT blocked AND start_after <= job_now()``, ordered ``priority DESC,
  created_on`` and nothing else: that is the predicate and order of the
  partial index ``job_i11``, so a backlog is read in index order with no sort.
  ``blocked`` jobs (flow children waiting for their parents) are never taken,
  and a job due exactly now is (``<=``, where 26 had ``<``);
* activation also stamps ``heartbeat_on``, which Node's monitor checks against
  ``heartbeat_seconds``; a worker's claim binds ``:liveness`` (its
  ``liveness_seconds``) and gives a job without a heartbeat that one, so that a
  crashed worker's jobs fail by heartbeat (ours or Node's monitor) within it
  (unbound: NULL, no change);
* key_strict_fifo: only each key's head (its retry job if it has one, else its
  oldest due job) is a candidate, and keys holding an active, retry or failed
  job are skipped; the activation can still collide with a client that takes no
  key locks, so it runs in a savepoint and a conflict is an empty fetch;
* singleton and stately: keys with an active job of the policy are skipped, at
  most one job per key per batch; keys are first locked as at 26 (see
  :mod:`alkstore_sa.sql.v26.fetch` for why).

Kept from 26: the guard on the cached policy, and rows read through
:func:`alkstore_sa.sql.common.reading.readable_columns` so one poison row never fails
the batch.

Group concurrency (``groups``, see :mod:`alkstore_sa.groups`): a job of a group
is a candidate only while its group has fewer active jobs than its tier's limit,
and a batch takes no more of a group than the places left, as pg-boss 12.38's
claim with ``groupConcurrency`` does. ``"global"`` counts the active jobs of the
queue in the database; pg-boss reads them in the claim's snapshot and so may go
past the limit when two claims race. Ours first takes a transaction lock on each
group it may claim from (:func:`lock_groups`, which never waits); the claim, run
next in the same transaction, only takes jobs of the groups it holds, and its
snapshot sees every claim of those groups that held the lock before it. Two of
our fetchers therefore never exceed a limit together. ``"local"`` counts the
jobs the caller (one worker) runs, bound as ``:group_counts``; it takes no locks.
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
    cast,
    func,
    literal_column,
    not_,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from ...limits import MAX_GROUP_ID_BYTES, MAX_SINGLETON_KEY_BYTES
from ...models.enums import JobState
from ..common import claim as _claim
from ..common.base import advisory_key, qname, state_text
from ..common.claim import in_keys, policy_literal
from ..common.compat import distinct_on
from ..common.reading import readable, readable_columns
from . import job_now
from .tables import JOB, QUEUE

SINGLETON_POLICIES = ("singleton", "stately")
"""Policies whose unique index covers ``active``: the claim skips keys already active."""

KEY_STRICT_FIFO = "key_strict_fifo"

RACY_POLICIES = (*SINGLETON_POLICIES, KEY_STRICT_FIFO)
"""Policies whose activation can hit a unique index (i2, i3, i8)."""


def _queued(j: Any, *, policy: str, ignore_start_after: bool) -> list[ColumnElement[Any]]:
    """The rows of ``j`` a fetch of a ``policy`` queue may take."""
    # Exactly job_i11's predicate (plus the due time, its last key column): any
    # other shape of it and the planner no longer reads the queue in index order.
    conditions = _claim.queued(
        j,
        QUEUE,
        not_(j.c.blocked),
        due=None if ignore_start_after else j.c.start_after <= job_now(),
    )
    if policy in SINGLETON_POLICIES:
        # Only an active job of the queue's policy holds its key, as pg-boss
        # 12.38 asks: a hand-written row of another policy does not.
        conditions.append(_claim.key_not_active(JOB, j, policy=policy))
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
                    held.c.policy == policy_literal(KEY_STRICT_FIFO),
                    held.c.id != j.c.id,
                )
                .exists()
            )
        )
    else:
        conditions.append(_claim.not_of_policies(j, RACY_POLICIES))
    return conditions


def _order(columns: Any) -> list[Any]:
    # No id: job_i11 ends at created_on (a uuid tiebreak would need a sort).
    return [columns.priority.desc(), columns.created_on]


def _heads(*, ignore_start_after: bool) -> Any:
    """Each key's head among its queued, unblocked, due jobs: its retry job if it
    has one (``state DESC``), else its oldest (``job_i10`` serves this order)."""
    h = JOB.alias("h")
    conditions = [
        h.c.name == qname(),
        h.c.state < state_text(JobState.ACTIVE),
        not_(h.c.blocked),
        h.c.policy == policy_literal(KEY_STRICT_FIFO),
    ]
    if not ignore_start_after:
        conditions.append(h.c.start_after <= job_now())
    return (
        distinct_on(select(h.c.id), h.c.singleton_key)
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
    conditions = _queued(JOB, policy=policy, ignore_start_after=ignore_start_after)
    return _claim.lock_keys(JOB, conditions, _order(JOB.c))


GLOBAL = "global"
LOCAL = "local"


def _group_limit(tier: ColumnElement[Any]) -> ColumnElement[Any]:
    """The limit of a group whose job has ``tier``: ``:group_tiers`` (a JSON object
    of tier to limit) names it, else ``:group_default``."""
    tiers = cast(bindparam("group_tiers", type_=Text), JSONB)
    named = cast(tiers.op("->>")(tier), Integer)
    return func.coalesce(named, bindparam("group_default", type_=Integer))


def _active_counts(*, locked_only: bool) -> ColumnElement[Any]:
    """The active jobs of each group of ``:qname`` as one JSON object, computed once
    per statement (a ``MATERIALIZED`` CTE read through an uncorrelated subquery, so
    each candidate costs a lookup; ``job_i7`` serves the count). ``locked_only``:
    only the groups ``:groups``."""
    a = JOB.alias("active_job")
    where = [
        a.c.name == qname(),
        a.c.state == state_text(JobState.ACTIVE),
        a.c.group_id.is_not(None),
    ]
    if locked_only:
        where.append(a.c.group_id == func.any(bindparam("groups", type_=ARRAY(Text))))
    per_group = (
        select(a.c.group_id, cast(func.count(), Integer).label("n"))
        .where(*where)
        .group_by(a.c.group_id)
        .subquery("per_group")
    )
    counts = (
        select(
            func.coalesce(
                func.jsonb_object_agg(per_group.c.group_id, per_group.c.n),
                literal_column("'{}'::jsonb", JSONB),
            ).label("counts")
        )
        .cte("group_counts")
        .prefix_with("MATERIALIZED")
    )
    return select(counts.c.counts).scalar_subquery()


def _counts(groups: str) -> ColumnElement[Any]:
    if groups == LOCAL:
        return cast(bindparam("group_counts", type_=Text), JSONB)
    return _active_counts(locked_only=True)


def _active(counts: ColumnElement[Any], group: ColumnElement[Any]) -> ColumnElement[Any]:
    return func.coalesce(cast(counts.op("->>")(group), Integer), 0)


@functools.cache
def lock_groups(*, policy: str, ignore_start_after: bool) -> Select[Any]:
    """Try the transaction locks of the groups of the next ``:limit`` claimable
    jobs of ``:qname`` that have a group with room left (``:group_default``,
    ``:group_tiers``), leaving out the groups ``:tried``; return
    ``(group_id, taken)`` for each group tried. Never waits."""
    j = JOB
    counts = _active_counts(locked_only=False)
    conditions = _queued(j, policy=policy, ignore_start_after=ignore_start_after)
    conditions += [
        j.c.group_id.is_not(None),
        j.c.group_id != func.all(bindparam("tried", type_=ARRAY(Text))),
        _active(counts, j.c.group_id) < _group_limit(j.c.group_tier),
    ]
    next_rows = (
        select(j.c.group_id)
        .where(*conditions)
        .order_by(*_order(j.c))
        .limit(bindparam("limit", type_=Integer))
        .subquery("next")
    )
    # DISTINCT keeps the planner from pushing the (volatile) lock call below it,
    # so each group is tried once.
    tried = select(next_rows.c.group_id).distinct().subquery("tried_groups")
    taken = func.pg_try_advisory_xact_lock(
        advisory_key(
            bindparam("lock_schema", type_=Text)
            + "alkstore.group."
            + qname()
            + "."
            + tried.c.group_id
        )
    )
    return select(tried.c.group_id, taken.label("taken"))


def _within_group_limits(candidates: Any, counts: ColumnElement[Any], *, one_per_key: bool) -> Any:
    """The ids of ``candidates`` a group-limited claim takes: the ungrouped ones,
    and of each group no more than the places its limit leaves (first come first,
    in claim order). ``one_per_key``: only the first candidate of each key."""
    c = candidates.c
    source: Any = candidates
    if one_per_key:
        keyed = select(
            c.id,
            c.group_id,
            c.group_tier,
            c.priority,
            c.created_on,
            func.row_number()
            .over(partition_by=_claim.key_of(c.singleton_key), order_by=_order(c))
            .label("key_rn"),
        ).subquery("keyed")
        source = select(keyed).where(keyed.c.key_rn == 1).subquery("key_firsts")
    s = source.c
    ranked = select(
        s.id,
        s.group_id,
        s.group_tier,
        func.row_number().over(partition_by=s.group_id, order_by=_order(s)).label("group_rn"),
    ).cte("group_ranked")
    r = ranked.c
    room = _active(counts, r.group_id) + r.group_rn <= _group_limit(r.group_tier)
    return select(r.id).where(or_(r.group_id.is_(None), room)).cte("chosen")


@functools.cache
def fetch_jobs(
    *,
    policy: str,
    ignore_start_after: bool,
    relaxed: bool = False,
    groups: str | None = None,
    skip_locked: bool = True,
    advisory: bool = True,
) -> Select[Any]:
    """Claim up to ``:limit`` jobs of queue ``:qname`` (policy ``policy``, also
    bound as ``:cached_policy``) and return them activated, every schema-46 column
    read through ``readable_columns``.

    Singleton and stately queues also bind ``:keys`` (from :func:`lock_keys`) and
    get at most one job per key. A key_strict_fifo claim may raise a unique
    violation (a Node fetcher activated the key first): run it in a savepoint.

    ``relaxed``: for a worker's claim alone in autocommit, see
    :func:`alkstore_sa.sql.common.claim.commit_without_flush`.

    ``groups`` (``"global"`` or ``"local"``, see the module) also binds
    ``:group_default`` and ``:group_tiers``, and ``:groups`` (the groups whose
    locks :func:`lock_groups` took) or ``:group_counts`` (a JSON object of group
    to the caller's running jobs).

    Without ``skip_locked`` (the ``noSkipLocked`` flag of a backend profile) the
    candidates are read without row locks, and the ``UPDATE`` that activates them
    checks again that each is still queued: of two claims that picked the same job,
    the second waits for the first and then skips it, so a fetch may come back short
    or empty under contention, and no job is claimed twice.

    Without ``advisory`` (the ``noAdvisoryLocks`` flag) nothing is locked first, as
    in pg-boss: a singleton or stately claim binds no ``:keys`` and may collide on
    the key's unique index with another claim (run it in a savepoint; a conflict is
    an empty fetch), keys too large for that index are left queued, and a global
    group limit is checked in the claim's snapshot alone, so two claims that race
    may go past it together.
    """
    j = JOB
    conditions = _queued(j, policy=policy, ignore_start_after=ignore_start_after)
    if policy in SINGLETON_POLICIES:
        if advisory:
            conditions.append(in_keys(j))
        else:
            # With no key lock held there is no way to fail them first (ops/poison.py).
            conditions.append(
                or_(
                    j.c.singleton_key.is_(None),
                    func.octet_length(j.c.singleton_key) <= MAX_SINGLETON_KEY_BYTES,
                )
            )
    if policy == KEY_STRICT_FIFO:
        heads = _heads(ignore_start_after=ignore_start_after)
        conditions.append(j.c.id.in_(select(heads.c.id)))
    # A group past MAX_GROUP_ID_BYTES (written by another client; ours are refused)
    # may not fit job_i7, which activation enters: the whole claim would fail at
    # every fetch. Such a job is left queued (the "Limits" page).
    conditions.append(
        or_(j.c.group_id.is_(None), func.octet_length(j.c.group_id) <= MAX_GROUP_ID_BYTES)
    )
    columns = [j.c.id, j.c.singleton_key, j.c.priority, j.c.created_on]
    counts = None if groups is None else _counts(groups)
    if counts is not None:
        room = _active(counts, j.c.group_id) < _group_limit(j.c.group_tier)
        if groups == GLOBAL and advisory:
            locked = j.c.group_id == func.any(bindparam("groups", type_=ARRAY(Text)))
            room = and_(locked, room)
        conditions.append(or_(j.c.group_id.is_(None), room))
        columns += [j.c.group_id, j.c.group_tier]
    rows = _claim.locked_rows(columns, conditions, _order(j.c), lock=skip_locked)
    if skip_locked:
        rows = rows.with_for_update(skip_locked=True, of=j)
    candidates = rows.cte("next")
    chosen = candidates
    if counts is not None:
        chosen = _within_group_limits(candidates, counts, one_per_key=policy in SINGLETON_POLICIES)
    elif policy in SINGLETON_POLICIES:
        chosen = _claim.one_per_key(candidates, _order(candidates.c))
    # Activation also stamps heartbeat_on: Node's monitor measures a job's
    # heartbeat from it. A worker's claim gives a job without a heartbeat its
    # liveness_seconds (the "Guarantees" page); an unbound :liveness is NULL.
    liveness = bindparam("liveness", None, type_=Integer)
    claimed = _claim.activate(
        j,
        chosen,
        job_now(),
        recheck=not skip_locked,
        heartbeat_on=job_now(),
        heartbeat_seconds=func.coalesce(j.c.heartbeat_seconds, liveness),
    )
    stmt = select(*readable_columns(claimed.c, JOB)).order_by(*_order(claimed.c), claimed.c.id)
    return _claim.commit_without_flush(stmt) if relaxed else stmt


@functools.cache
def keyed_jobs(*, policy: str, ignore_start_after: bool) -> Select[Any]:
    """``(id, singleton_key)`` of up to ``:limit`` claimable jobs of ``:qname`` whose
    keys are in ``:keys``, row-locked for the caller to fail (keys too large for
    the unique index that activating them enters; see ops/poison.py)."""
    j = JOB
    conditions = _queued(j, policy=policy, ignore_start_after=ignore_start_after)
    conditions.append(in_keys(j))
    return _claim.locked_rows([j.c.id, j.c.singleton_key], conditions, _order(j.c))


@functools.cache
def get_jobs() -> Select[Any]:
    """Jobs of queue ``:qname`` by ``:ids``, every schema-46 column, readable."""
    stmt = select(*JOB.c).where(
        JOB.c.name == qname(),
        JOB.c.id == func.any(bindparam("ids", type_=ARRAY(JOB.c.id.type))),
    )
    return readable(stmt, JOB)


@functools.cache
def list_jobs(state_filter: JobState | None = None) -> Select[Any]:
    """Jobs of queue ``:qname``, newest first, at most ``:limit``; only
    ``state_filter`` if given (a literal, so partial indexes apply)."""
    stmt = select(*readable_columns(JOB.c, JOB)).where(JOB.c.name == qname())
    if state_filter is not None:
        stmt = stmt.where(JOB.c.state == state_text(state_filter))
    # id DESC: newest first within one transaction too (see sql/v26/inspect.py).
    return stmt.order_by(JOB.c.created_on.desc(), JOB.c.id.desc()).limit(
        bindparam("limit", type_=Integer)
    )
