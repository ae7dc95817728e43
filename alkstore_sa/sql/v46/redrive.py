"""Redrive at schema 46: dead-letter jobs back to the queue they failed in, as
pg-boss 12.38's ``redrive`` moves them.

A dead-letter copy (:mod:`alkstore_sa.sql.v46.fail`) records where it came from:
``source_name``, ``source_id``, ``source_created_on``, ``source_retry_count``,
``source_output`` and ``source_root_id``, the first job of its chain. Redrive
creates each waiting copy again as a new job (a new id, ``created``, no output)
of its ``source_name`` queue, or of the queue the caller names, and deletes the
copy, all in one statement:

- the new job keeps what identifies the work: ``data``, ``priority``,
  ``singleton_key``, ``group_id``, ``group_tier``, ``trace_context``, and
  ``source_root_id`` = the copy's root, else the failed job itself, so a chain
  of failures and redrives stays traceable to its first job;
- it takes every setting from its queue as the queue is now (retries, expiry,
  retention, policy, heartbeat, dead letter): the copy never kept the original
  send's own options, and ``dead_letter`` sends a second failure back to the
  dead letter queue;
- a copy its queue refuses (a policy or key conflict, or no key for a
  key_strict_fifo queue, whose CHECK requires one) is not lost and not left
  waiting (a waiting copy would come first in every later redrive and stall the
  drain): it is failed in place, its output saying why
  (``reason: "redrive_conflict"``, pg-boss's output shape) and its previous
  output kept as ``source_output``;
- only copies not yet running (``created``, ``retry``) move; a copy with no
  ``source_name`` and no destination named, or whose queue no longer exists,
  stays;
- a key_strict_fifo copy whose key another copy holds (active, retry, failed)
  waits behind it, as a fetch would.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    Insert,
    Integer,
    Select,
    Text,
    Update,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    literal,
    null,
    or_,
    select,
    true,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, insert

from ...models.enums import JobState
from ..common.base import qname, seconds, state, state_text
from ..common.compat import distinct_on
from . import job_now
from .tables import JOB, QUEUE

if TYPE_CHECKING:
    from sqlalchemy.sql.dml import ReturningDelete

KEY_STRICT_FIFO = "key_strict_fifo"

CONFLICT_REASON = "redrive_conflict"
"""``output.reason`` of a dead-letter job its queue refused (pg-boss's value)."""


def _destination(source_name: Any) -> Any:
    """The queue a copy goes to: ``:to`` when given, else where it came from."""
    return func.coalesce(bindparam("to", type_=Text), source_name)


def _candidate(j: Any) -> list[Any]:
    """The copies of ``:qname`` that may move; each filter that is not NULL narrows
    them: ``:ids``, ``:from_source`` (not ``:source_name``, which an UPDATE would take
    for a value of that column), ``:contains`` (JSON text the data must contain,
    ``@>``) and ``:created_before`` (copies created before it)."""
    k = JOB.alias("k")
    held = exists(
        select(k.c.id).where(
            k.c.name == j.c.name,
            k.c.singleton_key == j.c.singleton_key,
            k.c.policy == KEY_STRICT_FIFO,
            k.c.state.in_(
                [
                    state_text(JobState.ACTIVE),
                    state_text(JobState.RETRY),
                    state_text(JobState.FAILED),
                ]
            ),
        )
    )
    wanted = bindparam("ids", type_=ARRAY(Uuid()))
    source = bindparam("from_source", type_=Text)
    contains = bindparam("contains", type_=Text)
    before = bindparam("created_before", type_=TIMESTAMP(timezone=True))
    return [
        j.c.name == qname(),
        j.c.state < state_text(JobState.ACTIVE),
        ~and_(j.c.policy == KEY_STRICT_FIFO, held),
        or_(wanted.is_(None), j.c.id == func.any(wanted)),
        or_(source.is_(None), j.c.source_name == source),
        or_(contains.is_(None), j.c.data.op("@>")(cast(contains, JSONB))),
        or_(before.is_(None), j.c.created_on < before),
    ]


def _conflict_output(j: Any, q: Any) -> Any:
    """Why a copy was not redriven, as pg-boss words it (it is stored data that
    Node's dashboards and our users read alike)."""
    what = case(
        (
            and_(j.c.singleton_key.is_(None), q.c.policy == KEY_STRICT_FIFO),
            literal(" requires a singletonKey"),
        ),
        (j.c.singleton_key.is_(None), literal(" already has a job this one conflicts with")),
        else_=literal(" already has a job with singletonKey ") + j.c.singleton_key,
    )
    message = (
        literal("Not redriven: queue ")
        + q.c.name
        + what
        + literal(" under its ")
        + func.coalesce(q.c.policy, "standard")
        + literal(" policy")
    )
    return func.jsonb_build_object(
        "message",
        message,
        "reason",
        CONFLICT_REASON,
        "destination",
        q.c.name,
        "policy",
        q.c.policy,
        "singletonKey",
        j.c.singleton_key,
    )


def _candidates(*, skip_locked: bool) -> Select[Any]:
    """Up to ``:limit`` waiting copies of ``:qname`` that may move, oldest first,
    row-locked: ``(id, created_on, new_id)``, each with the id its new job gets."""
    j = JOB.alias("j")
    dq = QUEUE.alias("dq")
    return (
        select(
            j.c.id,
            j.c.created_on,
            func.gen_random_uuid().label("new_id"),
        )
        .join(dq, dq.c.name == _destination(j.c.source_name))
        .where(*_candidate(j))
        .order_by(j.c.created_on, j.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(of=j, skip_locked=skip_locked)
    )


def _insert(candidates: Any) -> Insert:
    """Create each of ``candidates`` (``id``, ``new_id``) again as a new job of its
    destination; a row a unique index refuses is skipped. Returns ``(id, name)``."""
    c = candidates.c
    m = JOB.alias("m")
    q = QUEUE.alias("q")
    now = job_now()
    values: dict[str, Any] = {
        "id": c.new_id,
        "name": q.c.name,
        "data": m.c.data,
        "priority": m.c.priority,
        "retry_limit": q.c.retry_limit,
        "retry_backoff": q.c.retry_backoff,
        "retry_delay": q.c.retry_delay,
        "retry_delay_max": q.c.retry_delay_max,
        "expire_seconds": q.c.expire_seconds,
        "start_after": now,
        "created_on": now,
        "keep_until": now + seconds(q.c.retention_seconds),
        "deletion_seconds": q.c.deletion_seconds,
        "policy": q.c.policy,
        "singleton_key": m.c.singleton_key,
        "group_id": m.c.group_id,
        "group_tier": m.c.group_tier,
        "heartbeat_seconds": q.c.heartbeat_seconds,
        "dead_letter": q.c.dead_letter,
        # The chain's first job: the copy's root, else the job that failed.
        "source_root_id": func.coalesce(m.c.source_root_id, m.c.source_id),
        "trace_context": m.c.trace_context,
    }
    rows = (
        select(*values.values())
        .select_from(candidates)
        .join(m, and_(m.c.name == qname(), m.c.id == c.id))
        .join(q, q.c.name == _destination(m.c.source_name))
        # A key_strict_fifo job must have a key (the table's CHECK would fail the
        # whole statement, not this row): a keyless copy is not inserted, and so
        # is failed in place as a conflict.
        .where(or_(q.c.policy.is_distinct_from(KEY_STRICT_FIFO), m.c.singleton_key.is_not(None)))
        .order_by(m.c.created_on, m.c.id)
    )
    return (
        insert(JOB)
        .from_select(list(values), rows)
        .on_conflict_do_nothing()
        .returning(JOB.c.id, JOB.c.name)
    )


def _remove(moved: Any) -> ReturningDelete[Any]:
    """Delete the copies of ``:qname`` whose ids ``moved`` selects."""
    return JOB.delete().where(JOB.c.name == qname(), JOB.c.id.in_(moved)).returning(JOB.c.id)


@functools.cache
def redrive_jobs(*, skip_locked: bool = True) -> Select[Any]:
    """Move up to ``:limit`` waiting copies of dead letter queue ``:qname``, oldest
    first, to ``:to`` (NULL: each copy's ``source_name``); the filters of
    :func:`_candidate` narrow them.

    One row per copy considered, oldest first: ``(new_id, destination,
    inserted)``; ``inserted`` is false for a copy failed in place (conflict).

    Each candidate gets its new id before the insert (``gen_random_uuid()`` in a
    materialized CTE, evaluated once per row), so the ids the insert returns say
    exactly which copies were created again: a data-modifying CTE cannot see the
    other CTEs' writes. ``ON CONFLICT DO NOTHING`` skips only the row a unique
    index refuses, never the batch. ``SKIP LOCKED``: two redrives of one queue
    share its copies instead of waiting for each other (not under
    ``noSkipLocked``: ``skip_locked``).
    """
    candidates = _candidates(skip_locked=skip_locked).cte("candidates").prefix_with("MATERIALIZED")
    c = candidates.c
    ins = _insert(candidates).cte("ins")
    settled = (
        select(
            c.id,
            c.created_on,
            c.new_id,
            ins.c.name.label("destination"),
            ins.c.id.is_not(None).label("inserted"),
        )
        .select_from(candidates.outerjoin(ins, ins.c.id == c.new_id))
        .cte("settled")
    )
    s = settled.c
    removed = _remove(select(s.id).where(s.inserted)).cte("removed")
    conflicted = _fail_conflicts(select(s.id).where(~s.inserted)).cte("conflicted")
    return select(
        case((s.inserted, s.new_id), else_=null()).label("new_id"),
        s.destination,
        s.inserted,
        select(func.count()).select_from(removed).scalar_subquery().label("removed"),
        select(func.count()).select_from(conflicted).scalar_subquery().label("conflicted"),
    ).order_by(s.created_on, s.id)


@dataclass(frozen=True, slots=True)
class SplitRedrive:
    """:func:`redrive_jobs` as separate statements in one transaction, each changing
    the job table once (``noMultiMutationCte``, as pg-boss 12.38 splits its own):

    1. :attr:`pick`: the candidates, row-locked, ``(id, created_on, new_id)``;
    2. :attr:`insert`: creates them again (``:ids``, ``:new_ids``), answering the
       ``(id, name)`` of each new job;
    3. :attr:`remove`: deletes the copies moved (``:moved``);
    4. :attr:`fail_conflicts`: fails in place the copies not moved (``:skipped``).
    """

    pick: Select[Any]
    insert: Insert
    remove: ReturningDelete[Any]
    fail_conflicts: Update


def _given(name: str) -> Any:
    return select(func.unnest(bindparam(name, type_=ARRAY(Uuid()))))


@functools.cache
def redrive_split(*, skip_locked: bool = True) -> SplitRedrive:
    """:func:`redrive_jobs` as separate statements (see :class:`SplitRedrive`)."""
    given = (
        func.unnest(
            bindparam("cand_ids", type_=ARRAY(Uuid())),
            bindparam("new_ids", type_=ARRAY(Uuid())),
        )
        .table_valued(column("id", Uuid()), column("new_id", Uuid()), name="given")
        .render_derived()
    )
    return SplitRedrive(
        _candidates(skip_locked=skip_locked),
        _insert(given),
        _remove(_given("moved")),
        _fail_conflicts(_given("skipped")),
    )


def _fail_conflicts(skipped: Any) -> Update:
    """Fail in place each candidate whose id ``skipped`` selects (the insert
    skipped it), saying why.

    Two key_strict_fifo copies of one key cannot both be failed (its unique
    index allows one such job per key): only the oldest is; the others stay
    waiting, and the candidate filter skips them while it holds the key.
    """
    j: Any = JOB.alias("jc")  # UPDATE ... AS jc (the typing of update() omits aliases)
    q = QUEUE.alias("cq")
    m = JOB.alias("mk")
    oldest_per_key = distinct_on(
        select(m.c.id)
        .where(m.c.name == qname(), m.c.id.in_(skipped), m.c.policy == KEY_STRICT_FIFO)
        .order_by(m.c.singleton_key, m.c.created_on, m.c.id),
        m.c.singleton_key,
    )
    return (
        update(j)
        .where(
            j.c.name == qname(),
            j.c.id.in_(skipped),
            q.c.name == _destination(j.c.source_name),
            or_(
                j.c.policy.is_distinct_from(KEY_STRICT_FIFO),
                j.c.singleton_key.is_(None),
                j.c.id.in_(oldest_per_key),
            ),
        )
        .values(
            state=state(JobState.FAILED),
            completed_on=job_now(),
            source_output=func.coalesce(j.c.source_output, j.c.output),
            output=cast(_conflict_output(j, q), JSONB),
        )
        .returning(j.c.id)
    )


@functools.cache
def announce() -> Select[Any]:
    """``pg_notify(:channel, queue)`` once per queue of ``:queues``: wake our
    listening workers for the jobs a redrive created (pg-boss's redrive sends no
    notification; Node workers find them at their next poll)."""
    queues = (
        func.unnest(bindparam("queues", type_=ARRAY(Text)))
        .table_valued("queue", name="dest")
        .render_derived()
    )
    return select(func.pg_notify(bindparam("channel", type_=Text), queues.c.queue)).where(true())
