"""Operations of workers: fetch, complete, fail, and moving jobs by id."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Executable

from .. import options as opt
from .. import versions
from ..errors import InvalidNameError, InvalidOptionsError, shown
from ..groups import GroupLimits, group_limits
from ..models.enums import JobState, QueuePolicy
from ..names import queue_ref
from ..records import FailResult as FailResult  # re-exported: the workers read it
from ..records import Job, Settled, UnreadableJob, decode_json, read_job, read_jobs
from ..records import Settlement as Settlement
from ..sql.common.base import fence_list_text, id_list_text
from ..sql.statements import Failing, Statements
from ..sql.v46 import fail as fail46_sql
from ..sql.v46 import fetch as fetch46_sql
from ._core import Call, Conflict, Context, Op
from .attempts import recording
from .outcomes import outcomes
from .poison import fail_poison, fail_unclaimable_keys, key_too_large
from .queues import queue_policy, require_queue
from .sending import send_many

_log = logging.getLogger(__name__)


def _policy(ctx: Context, name: str, *, refresh: bool = False) -> Op[str]:
    return (yield from queue_policy(ctx, name, refresh=refresh))


class NeedsTransaction(Exception):
    """An autocommit claim (``fetch(..., autocommit=True)``) found its queue's policy
    to be one whose claim takes key locks: run the fetch again in a transaction."""


def _takes_key_locks(ctx: Context, policy: str) -> bool:
    """Whether a claim of a ``policy`` queue locks its keys first (advisory locks
    held to the end of its transaction, so it needs one)."""
    return ctx.sql.takes_key_locks(policy)


def claims_in_autocommit(ctx: Context, name: str, *, group_locks: bool = False) -> bool:
    """Whether a claim of queue ``name`` can run in autocommit (one statement, no
    transaction around it): its policy is cached and its claim takes no key locks,
    nor group locks (``group_locks``: a global ``group_concurrency``).

    A key_strict_fifo claim can, too: in autocommit its unique violation ends only
    that statement, as the savepoint does in a transaction.
    """
    policy = ctx.policies.get(ctx.schema, name)
    locks_groups = group_locks and ctx.sql.takes_group_locks()
    return policy is not None and not locks_groups and not _takes_key_locks(ctx, policy)


class _Groups:
    """A claim's group concurrency: the limits, and the running jobs per group when
    they are the caller's own (``local``) rather than the database's."""

    def __init__(self, limits: GroupLimits, counts: Mapping[str, int] | None) -> None:
        self.limits = limits
        self.counts = None if counts is None else dict(counts)

    @property
    def mode(self) -> str:
        return fetch46_sql.LOCAL if self.counts is not None else fetch46_sql.GLOBAL

    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "group_default": self.limits.default,
            "group_tiers": self.limits.tiers_json,
        }
        if self.counts is not None:
            params["group_counts"] = json.dumps(self.counts, separators=(",", ":"))
        return params

    def took(self, jobs: Sequence[Job]) -> None:
        """Count ``jobs`` (claimed by an earlier round of the same fetch) as running."""
        if self.counts is not None:
            for job in jobs:
                if job.group_id is not None:
                    self.counts[job.group_id] = self.counts.get(job.group_id, 0) + 1


def _check_groups(
    ctx: Context, group_concurrency: object, group_counts: Mapping[str, int] | None
) -> _Groups | None:
    if group_concurrency is None:
        return None
    limits = group_limits(group_concurrency)
    if not ctx.has("group_concurrency"):
        raise InvalidOptionsError(
            "group_concurrency",
            f"needs pg-boss schema {versions.since('group_concurrency')} "
            f"(a fetch option of pg-boss 12); this schema is at {ctx.version}",
        )
    return _Groups(limits, group_counts)


def fetch(
    ctx: Context,
    name: str,
    batch_size: int,
    *,
    priority: bool,
    ignore_start_after: bool,
    autocommit: bool = False,
    group_concurrency: object = None,
    group_counts: Mapping[str, int] | None = None,
    liveness: int | None = None,
    claimer: tuple[uuid.UUID, int] | None = None,
) -> Op[list[Job]]:
    """Claim up to ``batch_size`` jobs of ``name``.

    ``liveness`` (schema 46, a worker's ``liveness_seconds``): the heartbeat the
    claim gives a job that has none.

    ``claimer`` (schema 26, a worker's id and the seconds after its last renewal that
    it counts as gone): the claim records the jobs it activates as that worker's
    (:mod:`alkstore_sa.sql.v26.claims`), when the schema has the claim tables.

    ``group_concurrency`` (schema 46, see :mod:`alkstore_sa.groups`) limits the
    active jobs of each group: those in the database, or with ``group_counts`` the
    caller's own running jobs per group (a worker's ``local_group_concurrency``).
    The database-wide limit takes group locks and so needs a transaction (as key
    locks do, below).

    ``autocommit``: the caller runs each statement in autocommit; a policy whose
    claim needs a transaction (key locks) raises :class:`NeedsTransaction` before
    any write. The claim then commits without waiting for the WAL flush (see
    :func:`alkstore_sa.sql.common.claim.commit_without_flush`). Unreadable rows the
    claim activated are failed by the next statement, not in the claim's
    transaction: a crash in between leaves them active until their lease
    expires, and the next claim fails them again.
    """
    queue_ref(name)
    opt.check_int("batch_size", batch_size, minimum=1, maximum=100_000)
    opt.check_bool("priority", priority)
    opt.check_bool("ignore_start_after", ignore_start_after)
    groups = _check_groups(ctx, group_concurrency, group_counts)
    if autocommit and groups is not None and groups.counts is None:
        raise NeedsTransaction(name)
    cached = ctx.policies.get(ctx.schema, name) is not None
    policy = yield from _policy(ctx, name)
    if autocommit and _takes_key_locks(ctx, policy):
        raise NeedsTransaction(name)

    def claim(policy: str) -> Op[list[Job]]:
        return _claim(
            ctx,
            name,
            policy,
            batch_size,
            priority=priority,
            ignore_start_after=ignore_start_after,
            relaxed=autocommit,
            groups=groups,
            liveness=liveness,
            claimer=claimer,
        )

    jobs = yield from claim(policy)
    if not jobs and cached:
        # An empty answer from a cached policy: make sure the queue still exists
        # and still has that policy before believing it.
        fresh = yield from _policy(ctx, name, refresh=True)
        if fresh != policy:
            if autocommit and _takes_key_locks(ctx, fresh):
                raise NeedsTransaction(name)
            jobs = yield from claim(fresh)
    return jobs


def _claim(
    ctx: Context,
    name: str,
    policy: str,
    batch_size: int,
    *,
    priority: bool,
    ignore_start_after: bool,
    relaxed: bool = False,
    groups: _Groups | None = None,
    liveness: int | None = None,
    claimer: tuple[uuid.UUID, int] | None = None,
) -> Op[list[Job]]:
    aware = ctx.sql.takes_key_locks(policy)
    # Schema 26 has no heartbeats: a worker's claim records itself instead.
    records = claimer is not None and ctx.claims and not ctx.has("touch")
    stmt = ctx.sql.claim(
        policy=policy,
        priority=priority,
        ignore_start_after=ignore_start_after,
        relaxed=relaxed,
        groups=None if groups is None else groups.mode,
        claims=records,
    )
    params: dict[str, Any] = {"qname": name, "limit": batch_size, "cached_policy": policy}
    if liveness is not None and ctx.has("touch"):  # heartbeats: schema 46
        params["liveness"] = liveness
    if records and claimer is not None:
        params["claim_owner"], params["claim_lapse"] = claimer
    jobs: list[Job] = []
    # Poison rows (see ops/poison.py) are failed and left out; while there were
    # some, claim again for the free places, so jobs queued behind them are not
    # kept waiting for the next poll. Each round fails at least one job, and the
    # rounds are bounded so a queue full of poison cannot hold one fetch long.
    for _ in range(_POISON_ROUNDS):
        want = batch_size - len(jobs)
        round_params = {**params, "limit": want}
        if groups is not None:
            round_params.update(groups.params())
        claimed, poisoned = yield from _claim_once(
            ctx,
            name,
            aware=aware,
            stmt=stmt,
            params=round_params,
            priority=priority,
            ignore_start_after=ignore_start_after,
            policy=policy,
            groups=groups,
        )
        jobs.extend(claimed)
        if groups is not None:
            groups.took(claimed)
        if not poisoned or len(jobs) >= batch_size:
            break
    return jobs


_POISON_ROUNDS = 4

_COLLIDING = (QueuePolicy.SINGLETON, QueuePolicy.STATELY, QueuePolicy.KEY_STRICT_FIFO)
"""Policies whose activation enters a unique index on the key, and so may collide
with a claim that took no key lock (Node's, or ours under ``noAdvisoryLocks``)."""


def _claim_once(
    ctx: Context,
    name: str,
    *,
    aware: bool,
    stmt: Executable,
    params: dict[str, Any],
    priority: bool,
    ignore_start_after: bool,
    policy: str,
    groups: _Groups | None = None,
) -> Op[tuple[list[Job], int]]:
    """One claim: the jobs it activated and how many poison jobs it failed."""
    poisoned = 0
    if aware:
        # Lock the keys first, in their own statement (see sql/v26/fetch.py).
        lock = ctx.sql.lock_keys(
            policy=policy, priority=priority, ignore_start_after=ignore_start_after
        )
        locked = yield Call(lock, {**params, "lock_schema": ctx.lock_name})
        keys = list(locked.scalars().all())
        # A key too large for the unique index would make the claim statement
        # fail as a whole on activation: its jobs are failed instead, and the
        # claim takes the other keys. We hold the key's lock, so no fetcher of
        # ours races us for those jobs.
        oversized = [k for k in keys if key_too_large(k)]
        if oversized:
            poisoned = yield from fail_unclaimable_keys(
                ctx,
                name,
                oversized,
                params,
                priority=priority,
                ignore_start_after=ignore_start_after,
                policy=policy,
            )
            keys = [k for k in keys if not key_too_large(k)]
        params["keys"] = keys
        if not keys:
            return [], poisoned
    if groups is not None and groups.counts is None and ctx.sql.takes_group_locks():
        params["groups"] = yield from _lock_groups(
            ctx, params, ignore_start_after=ignore_start_after, policy=policy
        )
    # key_strict_fifo takes no key locks (pg-boss's claim skips held keys) and can
    # still collide with a Node fetcher on job_i8: in a savepoint too.
    # So can a singleton or stately claim that took no key locks (noAdvisoryLocks).
    risky = aware or policy in _COLLIDING
    try:
        # A plain claim runs on the driver's connection itself (ops/_direct.py):
        # it is the statement a worker runs most, after the insert.
        result = yield Call(stmt, params, savepoint=risky, direct=not risky)
    except Conflict:
        # A client that takes no key locks (Node pg-boss) activated a job of the
        # same key first, or deadlocked with us: pg-boss answers with no jobs,
        # and so do we.
        return [], poisoned
    jobs = read_jobs(list(result.keys()), result.all())
    unreadable = [j for j in jobs if isinstance(j, UnreadableJob)]
    if not unreadable:
        return jobs, poisoned
    # Activated but unreadable: fail them in the same transaction, so the
    # caller never sees them and nobody runs them with stand-in values.
    poisoned += yield from fail_poison(
        ctx, name, [(j.id, "read", j.unreadable) for j in unreadable]
    )
    return [j for j in jobs if not isinstance(j, UnreadableJob)], poisoned


_GROUP_LOCK_ROUNDS = 3


def _lock_groups(
    ctx: Context, params: Mapping[str, Any], *, ignore_start_after: bool, policy: str
) -> Op[list[str]]:
    """The groups a claim may take jobs of: the groups with room left of the next
    claimable jobs whose locks this transaction took (see sql/v46/fetch.py). A
    group another fetcher holds is left to it, and the next candidates' groups
    are tried in its place, for a few rounds."""
    stmt = ctx.sql.lock_groups(policy=policy, ignore_start_after=ignore_start_after)
    held: list[str] = []
    tried: list[str] = []
    for _ in range(_GROUP_LOCK_ROUNDS):
        result = yield Call(stmt, {**params, "lock_schema": ctx.lock_name, "tried": tried})
        rows = result.all()
        held.extend(row.group_id for row in rows if row.taken)
        tried.extend(row.group_id for row in rows)
        if all(row.taken for row in rows):
            break
    return held


def _fence(value: object) -> datetime | None:
    # In UTC, as every other time bound to a statement (options.in_utc): PostgreSQL
    # refuses an offset of 16 hours or more, or one that is not a whole minute.
    if value is None:
        return None
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidOptionsError(
            "started_on", f"must be an aware datetime or None, not {shown(value)}"
        )
    return opt.in_utc("started_on", value)


def _of_job(name: str, job: Job, output: Any) -> Settlement:
    """A fenced settlement of the attempt ``job`` was fetched in."""
    if job.name != name:
        raise InvalidOptionsError(
            "jobs", f"job {job.id} belongs to queue {shown(job.name)}, not {shown(name)}"
        )
    if job.started_on is None:
        # Never fetched, so there is no attempt to fence on; settling it anyway
        # would silently be unfenced.
        raise InvalidOptionsError(
            "jobs",
            f"job {job.id} has no started_on (it was not fetched); "
            "pass its id to settle it unfenced",
        )
    return Settlement(job.id, output, job.started_on)


JobRef = Job | uuid.UUID | str
"""A job to settle: the fetched :class:`Job` (fenced) or its id (unfenced)."""

SettleItem = JobRef | tuple[JobRef, Any] | Settlement
"""One item of ``complete_many``/``fail_many``: a job, ``(job, output)`` or a Settlement."""


def _one(name: str, ref: object, output: Any) -> Settlement:
    if isinstance(ref, Job):
        return _of_job(name, ref, output)
    return Settlement(opt.job_id(ref), output)


def settlements(name: str, jobs: object, output: Any = None) -> list[Settlement]:
    """``complete``/``fail``'s argument: a fetched :class:`Job` or an id, or a list of them.

    A Job is fenced on its ``started_on``; an id is not. Every item gets ``output``.
    """
    queue_ref(name)
    if isinstance(jobs, Job | uuid.UUID | str):
        jobs = [jobs]
    if not isinstance(jobs, list | tuple | set | frozenset):
        raise InvalidOptionsError(
            "jobs", f"expected a Job, a UUID or a list of them, not {shown(jobs)}"
        )
    return [_one(name, ref, output) for ref in jobs]


def settlement_items(name: str, items: object) -> list[Settlement]:
    """``complete_many``/``fail_many``'s items, each one of: a fetched :class:`Job`,
    an id, a ``(job or id, output)`` pair, or a :class:`Settlement`."""
    queue_ref(name)
    if not isinstance(items, list | tuple):
        raise InvalidOptionsError("items", f"expected a list, not {shown(items)}")
    out: list[Settlement] = []
    for item in items:
        if isinstance(item, Settlement):
            # Normalised here, before any SQL: the id as a UUID (outcomes match it
            # by value), the fence in UTC.
            out.append(Settlement(opt.job_id(item.id), item.output, _fence(item.started_on)))
        elif isinstance(item, tuple):
            if len(item) != 2:
                raise InvalidOptionsError(
                    "items", f"a pair must be (job or id, output), not {shown(item)}"
                )
            out.append(_one(name, item[0], item[1]))
        else:
            out.append(_one(name, item, None))
    return out


def _settle_params(name: str, items: Sequence[Settlement]) -> dict[str, Any]:
    # Everything is checked here, before the statement: a value PostgreSQL
    # refused would abort the caller's transaction.
    return {
        "qname": name,
        "ids": id_list_text([opt.job_id(i.id) for i in items]),
        "outputs": [opt.encode_json("output", opt.output_value(i.output)) for i in items],
        "fences": fence_list_text([_fence(i.started_on) for i in items]),
    }


def _found_or_missing(ctx: Context, name: str, affected: Sequence[object]) -> Op[None]:
    """Nothing changed: tell "no such job" (fine) from "no such queue" (an error).

    Only the empty case pays for the extra lookup; a statement that changed a
    job has proved the queue exists.
    """
    if not affected:
        yield from require_queue(ctx, name)


def complete_many(
    ctx: Context, name: str, items: Sequence[SettleItem], *, per_job: bool = False
) -> Op[Settled]:
    """Complete jobs: fenced items only while ``active`` in their attempt, unfenced
    ones while ``active`` (pg-boss's complete by id). ``per_job``: also say, per
    item, whether it was completed and why not (:mod:`.outcomes`)."""
    settled = settlement_items(name, items)
    opt.check_bool("per_job", per_job)
    if not settled:
        return Settled(0, [], outcomes=[] if per_job else None)
    stmt = ctx.sql.complete_jobs()
    # On the driver's connection (ops/_direct.py): the statement a worker runs most
    # after its claim.
    result = yield Call(stmt, _settle_params(name, settled), direct=True)
    affected = list(result.scalars().all())
    yield from _found_or_missing(ctx, name, affected)
    if not per_job:
        return Settled(len(settled), affected)
    done = dict.fromkeys(affected, JobState.COMPLETED)
    each = yield from outcomes(ctx, name, settled, done)
    return Settled(len(settled), affected, outcomes=each)


def fail_many(
    ctx: Context,
    name: str,
    items: Sequence[SettleItem],
    *,
    per_job: bool = False,
    worker: str | None = None,
    worker_id: uuid.UUID | None = None,
    autocommit: bool = False,
) -> Op[FailResult]:
    """Fail jobs: fenced items only while ``active`` in their attempt, unfenced
    ones while not finished (pg-boss's fail by id). ``per_job`` as for
    :func:`complete_many`. ``worker`` and ``worker_id`` name the worker that failed
    them in the attempt history (when the schema keeps one; the history never stands
    in the fail's way, see :func:`~.attempts.recording`). ``autocommit``: the caller
    runs each statement on its own (a worker)."""
    settled = settlement_items(name, items)
    opt.check_bool("per_job", per_job)
    if not settled:
        return FailResult(0, [], {}, 0, outcomes=[] if per_job else None)
    params = _settle_params(name, settled)
    if ctx.history:
        params.update(worker=worker, worker_id=worker_id)
    rows = yield from recording(ctx, _fail_jobs, params, autocommit=autocommit)
    yield from _found_or_missing(ctx, name, rows)
    states = {r.id: JobState(r.state) for r in rows}
    each = (yield from outcomes(ctx, name, settled, states)) if per_job else None
    return FailResult(
        len(settled),
        [r.id for r in rows],
        states,
        int(rows[0].dead_lettered) if rows else 0,
        outcomes=each,
    )


def _fail_jobs(sql: Statements) -> Failing:
    return sql.fail_jobs()


def _expiry(sql: Statements) -> Failing:
    return sql.expire_jobs(heartbeat=False)


def _heartbeat_expiry(sql: Statements) -> Failing:
    return sql.expire_jobs(heartbeat=True)


def _expire46(
    ctx: Context,
    build: Callable[[Statements], Failing],
    output: Any,
    names: Sequence[str],
    limit: int,
    now: Any,
) -> Op[dict[str, int]]:
    opt.check_int("limit", limit, minimum=1)
    params = {
        # Names read from the queue table, not input: whatever another client
        # named a queue, it is a bind parameter here (the "Guarantees" page).
        "names": list(names),
        "limit": limit,
        "output": opt.encode_json("output", output),
        "now": now,
    }
    counts: dict[str, int] = {}
    for row in (yield from recording(ctx, build, params)):
        counts[row.name] = counts.get(row.name, 0) + 1
    return counts


def expire_jobs46(
    ctx: Context, names: Sequence[str], limit: int, now: datetime | None = None
) -> Op[dict[str, int]]:
    """Schema 46: fail one batch (at most ``limit``) of the active jobs of ``names``
    whose lease ran out, as pg-boss 12.38's ``failJobsByTimeout`` does.

    Returns how many jobs each queue had failed or set to retry; a batch short of
    ``limit`` means no more are due. ``now`` replaces the schema's clock (tests).
    The caller holds the advisory lock ``<table>failJobsByTimeout`` (sql/common/locks.py)
    that pg-boss takes for the same sweep.
    """
    return (yield from _expire46(ctx, _expiry, fail46_sql.TIMEOUT_OUTPUT, names, limit, now))


def expire_heartbeats46(
    ctx: Context, names: Sequence[str], limit: int, now: datetime | None = None
) -> Op[dict[str, int]]:
    """Schema 46: fail one batch of the active jobs of ``names`` whose heartbeat
    stopped (``heartbeat_on + heartbeat_seconds`` passed), as pg-boss 12.38's
    ``failJobsByHeartbeat`` does; as :func:`expire_jobs46` otherwise, under the
    lock ``<table>failJobsByHeartbeat``.
    """
    return (
        yield from _expire46(ctx, _heartbeat_expiry, fail46_sql.HEARTBEAT_OUTPUT, names, limit, now)
    )


def _by_ids(ctx: Context, stmt: Executable, name: str, ids: object) -> Op[Settled]:
    queue_ref(name)
    id_list = opt.job_ids(ids)
    result = yield Call(stmt, {"qname": name, "ids": id_list})
    affected = list(result.scalars().all())
    yield from _found_or_missing(ctx, name, affected)
    return Settled(len(id_list), affected)


def cancel(ctx: Context, name: str, ids: object) -> Op[Settled]:
    stmt = ctx.sql.cancel_jobs()
    return (yield from _by_ids(ctx, stmt, name, ids))


def _requeue(ctx: Context, stmt: Executable, name: str, ids: object) -> Op[Settled]:
    """Move jobs back into a queued state, which a policy or throttle index may refuse.

    A refused job stays where it was, like a refused ``send``: the statement runs
    in a savepoint, and if any job of the batch conflicts, each job is tried on
    its own so that the others still move.
    """
    queue_ref(name)
    id_list = opt.job_ids(ids)
    rows: list[Any] = []
    try:
        result = yield Call(stmt, {"qname": name, "ids": id_list}, savepoint=True)
        rows = list(result.all())
    except Conflict:
        for job in id_list:
            try:
                result = yield Call(stmt, {"qname": name, "ids": [job]}, savepoint=True)
            except Conflict:
                continue
            rows.extend(result.all())
    affected = [row.id for row in rows]
    yield from _found_or_missing(ctx, name, affected)
    # A resumed job leaves retained_count and stays in total_count (live).
    yield from _reduce_retained(ctx, name, _retained(rows), 0)
    return Settled(len(id_list), affected)


def _retained(rows: Sequence[Any]) -> int:
    return sum(int(getattr(row, "retained", 0) or 0) for row in rows)


def _reduce_retained(ctx: Context, name: str, retained: int, total: int) -> Op[None]:
    """Where the schema keeps them (46 on): take jobs a resume or delete moved out
    of the completed and cancelled set off the queue's ``retained_count`` and
    ``total_count`` at once, as pg-boss does. Only when there are some, so settling
    live jobs never locks the queue row; the caller's transaction then holds it
    until it ends, and the monitor skips the queue for that pass (its claim skips
    locked rows)."""
    if (retained or total) and ctx.has("retained and total counts"):
        yield Call(ctx.sql.reduce_retained(), {"qname": name, "retained": retained, "total": total})


def resume(ctx: Context, name: str, ids: object) -> Op[Settled]:
    stmt = ctx.sql.resume_jobs()
    return (yield from _requeue(ctx, stmt, name, ids))


def retry(ctx: Context, name: str, ids: object) -> Op[Settled]:
    stmt = ctx.sql.retry_jobs()
    return (yield from _requeue(ctx, stmt, name, ids))


def delete_jobs(ctx: Context, name: str, ids: object) -> Op[Settled]:
    queue_ref(name)
    id_list = opt.job_ids(ids)
    result = yield Call(ctx.sql.delete_jobs(), {"qname": name, "ids": id_list})
    rows = result.all()
    yield from _found_or_missing(ctx, name, rows)
    # pg-boss's deleteJob takes the retained jobs it deleted off both counts.
    retained = _retained(rows)
    yield from _reduce_retained(ctx, name, retained, retained)
    return Settled(len(id_list), [row.id for row in rows])


def delete_by_state(ctx: Context, name: str, which: str) -> Op[int]:
    yield from require_queue(ctx, name)
    result = yield Call(ctx.sql.delete_by_state(which), {"qname": name})
    if not ctx.has("retained and total counts"):
        return int(getattr(result, "rowcount", 0))
    row = result.one()
    # As pg-boss's bulk deletes: every deleted job leaves total_count.
    yield from _reduce_retained(ctx, name, int(row.retained), int(row.deleted))
    return int(row.deleted)


def get_jobs(ctx: Context, name: str, ids: object) -> Op[list[Job]]:
    queue_ref(name)
    # Through readable_columns: a row Python cannot represent comes back as an
    # UnreadableJob instead of failing the whole call.
    result = yield Call(ctx.sql.get_jobs(), {"qname": name, "ids": opt.job_ids(ids)})
    jobs = [read_job(r) for r in result.mappings().all()]
    yield from _found_or_missing(ctx, name, jobs)
    return jobs


def extend_leases(
    ctx: Context, name: str, items: Sequence[Job | Settlement], extend_by: int
) -> Op[list[uuid.UUID]]:
    """Always fenced: an item without ``started_on`` matches no job."""
    settled = settlement_items(name, items)
    opt.check_int("extend_by", extend_by, minimum=1, maximum=opt.INT32_MAX // 2)
    if not settled:
        return []
    params = _settle_params(name, settled)
    del params["outputs"]
    stmt = ctx.sql.extend_lease()
    result = yield Call(stmt, {**params, "extend_by": extend_by})
    affected = list(result.scalars().all())
    yield from _found_or_missing(ctx, name, affected)
    return affected


def give_back(ctx: Context, name: str, items: Sequence[Job | Settlement]) -> Op[list[uuid.UUID]]:
    """Jobs claimed ahead by a worker and never started, back to ``name``'s queue as
    if unclaimed (no attempt counted); fenced like a settlement. Returns the ids
    given back: a job expired, cancelled or deleted meanwhile is not."""
    settled = settlement_items(name, items)
    if not settled:
        return []
    params = _settle_params(name, settled)
    del params["outputs"]
    result = yield Call(ctx.sql.give_back(), params)
    return list(result.scalars().all())


def claims_ahead(ctx: Context, name: str, group_limits: object = None) -> bool:
    """Whether a worker may claim jobs of queue ``name`` ahead of its free slots: its
    cached policy is ``standard`` (a job given back can then meet no unique index
    of a key) and it has no ``group_limits`` (a claimed job holds a group place)."""
    return group_limits is None and ctx.policies.get(ctx.schema, name) == QueuePolicy.STANDARD


def redrive(
    ctx: Context,
    dead_letter: str,
    to: str | None,
    ids: object | None,
    limit: int,
    filters: Mapping[str, Any] | None = None,
) -> Op[list[uuid.UUID]]:
    """Move jobs out of ``dead_letter`` as new jobs.

    At 46 (:mod:`.redrive46`), as pg-boss 12.38: waiting copies go to ``to`` or,
    when ``to`` is ``None``, each to the queue it failed in (``source_name``),
    keeping their identity columns and root; a copy its queue refuses is failed
    in place with a ``redrive_conflict`` output.

    At 26 ``to`` is required (copies there record no source), and waiting or
    failed jobs move: jobs that ``to`` refuses (its policy or a taken id) stay in
    ``dead_letter``, and so do jobs whose data cannot be read or sent again
    (another client wrote it past the limits of the "Limits" page): those
    are logged, once per redrive.
    """
    from ..sql.v26 import redrive as redrive_sql
    from .redrive46 import check_filters, redrive46

    queue_ref(dead_letter, "dead_letter")
    given = {k: v for k, v in (filters or {}).items() if v is not None}
    if given:
        ctx.require("redrive filters", f"redrive by {sorted(given)[0]}")
    checked = check_filters(given)
    if to is None:
        if not ctx.has("dead letters record their source queue"):
            # A name argument left out: the name error, as for any unusable queue name.
            raise InvalidNameError(
                "to",
                f"is required at schema {ctx.version}: dead letters record their source "
                f"queue from schema {versions.since('dead letters record their source queue')} "
                "(pg-boss 12) on",
            )
    else:
        queue_ref(to, "to")
    if to == dead_letter:
        raise InvalidOptionsError("to", "must differ from the dead letter queue")
    opt.check_int("limit", limit, minimum=1)
    params: dict[str, Any] = {"qname": dead_letter, "limit": limit}
    if ids is not None:
        params["ids"] = opt.job_ids(ids)
    if to is not None:
        yield from require_queue(ctx, to)
    yield from require_queue(ctx, dead_letter)
    if ctx.has("dead letters record their source queue"):
        return (yield from redrive46(ctx, dead_letter, to, params.get("ids"), limit, checked))
    assert to is not None  # refused above where dead letters do not know it
    result = yield Call(redrive_sql.pick(by_id=ids is not None), params)
    picked = result.all()
    if not picked:
        return []
    # send_many gives a batch ascending ids, so the new jobs (which share one
    # created_on) are fetched in the order they were dead-lettered.
    sendable: list[tuple[uuid.UUID, Any]] = []
    for row in picked:
        data, reason = decode_json(row.data)
        why = None if reason is None else f"data {reason}"
        if why is None:
            try:
                opt.encode_json("data", data)
            except InvalidOptionsError as exc:
                why = str(exc)
        if why is None:
            sendable.append((row.id, data))
        else:
            _log.warning(
                "job %s stays in %s: %s",
                row.id,
                dead_letter,
                why,
                extra={"action": "redrive_skipped", "queue": dead_letter, "job_id": str(row.id)},
            )
    if not sendable:
        return []
    new_ids = yield from send_many(ctx, to, [{"data": data} for _, data in sendable])
    moved = [old for (old, _), new in zip(sendable, new_ids, strict=True) if new is not None]
    if moved:
        yield Call(redrive_sql.remove(), {"qname": dead_letter, "ids": moved})
    return [i for i in new_ids if i is not None]
