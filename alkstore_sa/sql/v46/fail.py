"""Fail, retry and dead letters at schema 46 (pg-boss 12.38.0's failJobs and expiry).

The shape is the one of :mod:`alkstore_sa.sql.v26.fail` (schema 26): delete the
matched rows and insert them again in one statement, as ``retry`` while retries
remain (``ON CONFLICT DO NOTHING``, so a stately queue whose retry slot is taken
falls through) and as ``failed`` otherwise, with a copy of each failed job sent to
its dead letter queue. What 46 changes, as pg-boss 12.38.0 does it:

- Both re-inserts carry **every** column but ``upsert_by_key``: group, heartbeat
  interval, flow (``blocked``, ``blocking``, ``pending_dependencies``), the
  ``source_*`` provenance and ``trace_context``. A dead-lettered job that fails
  again keeps where it came from, so it can still be redriven. ``upsert_by_key``
  is left NULL on purpose: a job that failed is no longer the one an ``upsert``
  by its key may update (it leaves the unique index ``job_i13``).
  ``heartbeat_on`` is cleared: the attempt it measured is over.
- Backoff is multiplicative (pg-boss since 12.6, ``GREATEST(retry_delay, 1)``
  since 12.26): see :func:`backoff_seconds`.
- The dead-letter copy keeps the job's priority, key, group and trace context,
  takes expiry and heartbeat interval from the dead letter queue, starts with no
  output (the failed job's output is its ``source_output``) and records the first
  job of its chain in ``source_root_id``.
- The clock is the schema's ``job_now()`` (a test clock can move it for Node and
  for us alike).

The builders, all returning ``(id, name, state, dead_letter, dead_lettered)`` per
job failed or set to retry, as the schema-26 ones do:

- :func:`fail_jobs`: a handler's failure, fenced on ``started_on`` or not;
- :func:`expire_jobs`: jobs past their lease (``started_on + expire_seconds``),
  pg-boss's ``failJobsByTimeout``;
- :func:`expire_heartbeats`: jobs whose heartbeat stopped
  (``heartbeat_on + heartbeat_seconds``), pg-boss's ``failJobsByHeartbeat``;
- :func:`fail_poison`: rows that can never run, failed for good.

The operations over them are in :mod:`alkstore_sa.ops.working`
(``fail_many``, and ``expire_jobs46``/``expire_heartbeats46`` for supervision,
whose caller holds the per-table advisory lock pg-boss takes for the same
sweep: ``<table>failJobsByTimeout`` and ``<table>failJobsByHeartbeat``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Delete,
    Executable,
    Insert,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    cast,
    column,
    delete,
    func,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from ...limits import ATTEMPTS_KEPT
from ...models.attempts import ATTEMPT
from ...models.enums import JobState
from ..common import failing as _failing
from ..common.base import any_name, job_keys, now_param, seconds, state_text
from . import job_now
from .tables import JOB, QUEUE

TIMEOUT_OUTPUT = {"value": {"message": "job timed out"}}
"""Output of a job failed because its lease ran out (byte-compatible with pg-boss)."""

HEARTBEAT_OUTPUT = {"value": {"message": "job heartbeat timeout"}}
"""Output of a job failed because its heartbeat stopped (byte-compatible with pg-boss)."""

CARRIED_COLUMNS = [c.name for c in JOB.columns if c.name != "upsert_by_key"]
"""The columns a failed or retried job is inserted again with: all but ``upsert_by_key``."""


def backoff_seconds(
    retry_count: ColumnElement[Any],
    retry_delay: ColumnElement[Any],
    retry_delay_max: ColumnElement[Any],
) -> ColumnElement[Any]:
    """pg-boss 12.38's retry delay with backoff, in (fractional) seconds.

    ``LEAST(retry_delay_max, GREATEST(retry_delay, 1) * (h + h * random()))`` where
    ``h = 2 ^ LEAST(16, retry_count + 1) / 2``: the delay doubles with each attempt,
    with up to 100 % jitter, from at least one second even when ``retry_delay`` is 0,
    and the exponent stops at 16 so the value cannot overflow. ``LEAST`` ignores a
    NULL ``retry_delay_max``: no cap. ``random()`` is the database's, so a session
    that seeded it (``setseed``) gets pg-boss's value exactly.
    """
    half = func.power(2, func.least(16, retry_count + 1)) / 2
    return func.least(
        retry_delay_max, func.greatest(retry_delay, 1) * (half + half * func.random())
    )


def _outcomes(deleted: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values a row of ``deleted`` (every job column + ``new_output``) is inserted
    again with, as ``retry`` and as ``failed``."""
    d = deleted.c
    # heartbeat_on is cleared: the attempt it measured is over.
    return _failing.outcomes(
        deleted,
        job_now(),
        backoff_seconds(d.retry_count, d.retry_delay, d.retry_delay_max),
        heartbeat_on=None,
    )


def _dead_letter(results: CTE) -> Select[Any]:
    """Copy each failed job of ``results`` (job rows) into its dead letter queue;
    return ``(id, name, state, dead_letter, dead_lettered)`` of every row."""
    r = results.c
    now = job_now()
    # One copy per failed job, in the dead letter queue, as a new job on that
    # queue's settings. Its own output starts empty (it has not run); the failed
    # job's output is its source_output. policy and dead_letter stay NULL, so the
    # queue's unique indexes never refuse the copy.
    q = QUEUE.alias("dlq")
    dead_letter_copy: dict[str, Any] = {
        "name": q.c.name,
        "priority": r.priority,
        "data": r.data,
        "retry_limit": q.c.retry_limit,
        "retry_backoff": q.c.retry_backoff,
        "retry_delay": q.c.retry_delay,
        "start_after": now,
        "created_on": now,
        "keep_until": now + seconds(q.c.retention_seconds),
        "deletion_seconds": q.c.deletion_seconds,
        "expire_seconds": q.c.expire_seconds,
        "singleton_key": r.singleton_key,
        "group_id": r.group_id,
        "group_tier": r.group_tier,
        "heartbeat_seconds": q.c.heartbeat_seconds,
        "source_name": r.name,
        "source_id": r.id,
        "source_created_on": r.created_on,
        "source_retry_count": r.retry_count,
        "source_output": r.output,
        # The first job of a dead-letter/redrive chain, whichever link fails now.
        "source_root_id": func.coalesce(r.source_root_id, r.id),
        "trace_context": r.trace_context,
    }
    return _failing.dead_letter(JOB, results, q, dead_letter_copy)


_KEPT = [
    "id",
    "name",
    "state",
    "dead_letter",
    "priority",
    "data",
    "output",
    "singleton_key",
    "group_id",
    "group_tier",
    "created_on",
    "retry_count",
    "source_root_id",
    "trace_context",
]
"""The columns of a failed or retried row that its dead-letter copy and the answer read."""


def _fail_from(deleted: CTE, cause: str | None = None, *, by_worker: bool = False) -> Select[Any]:
    """Insert the rows of ``deleted`` (every job column + ``new_output``) again; with a
    ``cause``, record each as a failed attempt too
    (:func:`~alkstore_sa.sql.common.failing.with_history`).

    Returns ``(id, name, state, dead_letter, dead_lettered)`` of every job failed
    or set to retry.
    """
    as_retry, as_failed = _outcomes(deleted)
    retried, failed = _failing.reinsert(JOB, deleted, CARRIED_COLUMNS, as_retry, as_failed)
    stmt = _dead_letter(_failing.results(retried, failed, _KEPT))
    return _failing.with_history(stmt, deleted, job_now(), cause, by_worker=by_worker)


@dataclass(frozen=True, slots=True)
class SplitFail:
    """A fail as separate statements, each changing one table once, run in one
    transaction (a backend profile with ``noMultiMutationCte``, where a statement
    may not change a table twice, as pg-boss 12.38 splits its own there).

    In order, each binding what the one before answered:

    1. :attr:`pick`: the jobs to fail, row-locked; binds what the one-statement
       fail binds and answers one row, ``rows`` (the picked rows and their new
       output, as JSON text, handed back untouched), ``ids`` and ``names``;
    2. :attr:`remove`: deletes them (``:ids``, ``:names``);
    3. :attr:`retry`: inserts ``:rows`` again as ``retry`` (or ``failed`` when no
       retry is left), skipping a row a unique index refuses; answers their ids;
    4. :attr:`fail`: inserts the rows of ``:rows`` not in ``:retried`` as ``failed``;
       answers their ids;
    5. :attr:`dead_letter`: copies the failed ones of the jobs ``:ids`` of
       ``:names`` into their dead letter queues and answers what the one-statement
       fail answers, ``(id, name, state, dead_letter, dead_lettered)``;
    6. with the attempt history, :attr:`record` records each of ``:rows`` as a failed
       attempt and :attr:`trim` keeps each job's newest ones (``:ids``, ``:names``).
    """

    pick: Executable
    remove: Delete
    retry: Insert
    fail: Insert
    dead_letter: Executable
    record: Executable | None = None
    trim: Executable | None = None


def _split(picked: Select[Any], cause: str | None = None, *, by_worker: bool = False) -> SplitFail:
    """The separate statements of a fail whose first one is ``picked`` (every job
    column and ``new_output`` of the rows to fail, row-locked); with a ``cause``, the
    two that record the attempts too."""
    p = picked.subquery("p")
    pick = select(
        cast(
            func.coalesce(func.jsonb_agg(func.to_jsonb(p.table_valued())), text("'[]'")), Text
        ).label("rows"),
        func.array_agg(p.c.id).label("ids"),
        func.array_agg(p.c.name).label("names"),
    )
    pairs = job_keys()  # the picked rows, by queue and id together
    remove = delete(JOB).where(JOB.c.name == pairs.c.name, JOB.c.id == pairs.c.id)
    # The state as text: a column list names its types as written, and the schema of
    # the enum type would not be the one the statement runs on. Both inserts set it.
    typed = [column(c.name, Text() if c.name == "state" else c.type) for c in JOB.c]
    typed.append(column("new_output", JSONB))
    d = (
        func.jsonb_to_recordset(cast(bindparam("rows", type_=Text), JSONB))
        .table_valued(*typed)
        .render_derived(name="d", with_types=True)
    )
    as_retry, as_failed = _outcomes(d)
    retry = (
        insert(JOB)
        .from_select(CARRIED_COLUMNS, select(*[as_retry.get(c, d.c[c]) for c in CARRIED_COLUMNS]))
        .on_conflict_do_nothing()
        .returning(JOB.c.id)
    )
    # A retry a unique index refused (a stately queue's retry slot taken) fails for
    # good, as in the one statement.
    fail = (
        insert(JOB)
        .from_select(
            CARRIED_COLUMNS,
            select(*[as_failed.get(c, d.c[c]) for c in CARRIED_COLUMNS]).where(
                d.c.id != func.all(bindparam("retried", type_=ARRAY(JOB.c.id.type)))
            ),
        )
        .returning(JOB.c.id)
    )
    results = select(*[JOB.c[c] for c in _KEPT]).where(
        JOB.c.name == pairs.c.name, JOB.c.id == pairs.c.id
    )
    split = SplitFail(pick, remove, retry, fail, _dead_letter(results.cte("results")))
    if cause is None:
        return split
    record = _failing.attempts_recorded(d, job_now(), cause, by_worker=by_worker)
    # One table changed once per statement: the insert, then the trim of the jobs just
    # failed (their earlier attempts and the one just recorded are all visible then).
    keys = job_keys()
    old = _failing.attempts_beyond(
        ATTEMPTS_KEPT, ATTEMPT.c.name == keys.c.name, ATTEMPT.c.job_id == keys.c.id
    )
    trim = delete(ATTEMPT).where(ATTEMPT.c.id.in_(old))
    return dataclasses.replace(split, record=record, trim=trim)


@functools.cache
def fail_jobs(*, history: bool = False) -> Select[Any]:
    """Fail jobs ``:ids`` of queue ``:qname`` with per-job ``:outputs`` and ``:fences``;
    ``history``: record each attempt, by ``:worker`` and ``:worker_id``.

    Without a fence the job must not be finished (``state < 'completed'``), as
    pg-boss's fail by id. With one it must be ``active`` in the attempt that started
    at that time: a worker whose lease lapsed and whose job another worker claimed
    again cannot fail the newer attempt (pg-boss 12.38 fences on ``retry_count``
    for the same reason; ``started_on`` tells attempts apart as well, and is what
    every settle of ours fences on).
    """
    return _fail_from(_failing.fenced_delete(JOB), "failed" if history else None, by_worker=True)


def _clock() -> ColumnElement[Any]:
    """``COALESCE(:now, job_now())``: the supervisor's fake clock in tests, else the schema's."""
    return now_param(job_now())


Lapsed = Callable[[Any], ColumnElement[bool]]


def _lapsed_pick(lapsed: Lapsed, *, skip_locked: bool) -> Select[Any]:
    """The first statement of a split expiry: up to ``:limit`` active jobs of
    ``:names`` for which ``lapsed`` holds, row-locked (skipping rows another
    transaction holds, unless ``skip_locked`` is off: ``noSkipLocked``)."""
    output = cast(bindparam("output", type_=Text), JSONB).label("new_output")
    return (
        select(*JOB.c, output)
        .where(
            JOB.c.name == any_name(),
            JOB.c.state == state_text(JobState.ACTIVE),
            lapsed(JOB.c),
        )
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(of=JOB, skip_locked=skip_locked)
    )


def _timed_out(c: Any) -> ColumnElement[bool]:
    lapsed: ColumnElement[bool] = c.started_on + seconds(c.expire_seconds) < _clock()
    return lapsed


def _heartbeat_lost(c: Any) -> ColumnElement[bool]:
    return and_(
        c.heartbeat_seconds.is_not(None),
        c.heartbeat_on + seconds(c.heartbeat_seconds) < _clock(),
    )


def _expire(lapsed: Lapsed, cause: str | None) -> Select[Any]:
    """Fail up to ``:limit`` active jobs of queues ``:names`` for which ``lapsed`` holds.

    ``SKIP LOCKED`` so a sweep never waits behind a worker settling the same job,
    and the condition is checked again on the row deleted (a job settled after it
    was picked is left alone, as pg-boss repeats its predicate). A job failed here
    is inserted again as ``retry`` or ``failed``, which the next batch no longer
    matches, so the caller repeats while batches come back full. ``:output`` is
    the JSON text stored as output. With a ``cause``, each attempt is recorded.
    """
    j = JOB.alias("j")
    picked = (
        select(j.c.name, j.c.id)
        .where(
            j.c.name == any_name(),
            j.c.state == state_text(JobState.ACTIVE),
            lapsed(j.c),
        )
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    deleted = (
        delete(JOB)
        .where(
            JOB.c.name == picked.c.name,
            JOB.c.id == picked.c.id,
            JOB.c.state == state_text(JobState.ACTIVE),
            lapsed(JOB.c),
        )
        .returning(*JOB.c, cast(bindparam("output", type_=Text), JSONB).label("new_output"))
        .cte("deleted")
    )
    return _fail_from(deleted, cause)


@functools.cache
def expire_jobs(*, history: bool = False) -> Select[Any]:
    """Fail the active jobs of queues ``:names`` whose lease ran out (pg-boss's
    ``failJobsByTimeout``): ``started_on + expire_seconds`` before ``:now`` (NULL =
    ``job_now()``). Bounded by ``:limit``; ``:output`` is :data:`TIMEOUT_OUTPUT` as JSON.
    """
    return _expire(_timed_out, "expired" if history else None)


@functools.cache
def expire_heartbeats(*, history: bool = False) -> Select[Any]:
    """Fail the active jobs of queues ``:names`` whose heartbeat stopped (pg-boss's
    ``failJobsByHeartbeat``): a job with a ``heartbeat_seconds`` whose
    ``heartbeat_on + heartbeat_seconds`` is before ``:now`` (NULL = ``job_now()``).
    A job without a heartbeat interval never expires this way. Bounded by
    ``:limit``; ``:output`` is :data:`HEARTBEAT_OUTPUT` as JSON.
    """
    return _expire(_heartbeat_lost, "heartbeat" if history else None)


@functools.cache
def fail_poison(*, history: bool = False) -> Select[Any]:
    """Fail jobs ``:ids`` of queue ``:qname`` for good, with per-job ``:outputs`` (JSON text).

    For rows that can never run (see :mod:`alkstore_sa.ops.poison`): the fail
    statement above, so the job is dead-lettered like any failed job, but with no
    retry left, because a row that cannot be read or activated would only fail
    again. ``retry_limit`` is lowered to ``retry_count`` for that, which also
    leaves the record saying how many attempts there were.
    """
    return _fail_from(_failing.poison_delete(JOB), "poison" if history else None)


# ------------------------------------------------- split (noMultiMutationCte)


@functools.cache
def fail_jobs_split(*, history: bool = False) -> SplitFail:
    """:func:`fail_jobs` as separate statements (see :class:`SplitFail`)."""
    return _split(_failing.fenced_pick(JOB), "failed" if history else None, by_worker=True)


@functools.cache
def expire_split(*, heartbeat: bool, skip_locked: bool = True, history: bool = False) -> SplitFail:
    """:func:`expire_heartbeats` (``heartbeat``) or :func:`expire_jobs` as separate
    statements (see :class:`SplitFail`)."""
    lapsed = _heartbeat_lost if heartbeat else _timed_out
    cause = ("heartbeat" if heartbeat else "expired") if history else None
    return _split(_lapsed_pick(lapsed, skip_locked=skip_locked), cause)


@functools.cache
def fail_poison_split(*, history: bool = False) -> SplitFail:
    """:func:`fail_poison` as separate statements (see :class:`SplitFail`)."""
    return _split(_failing.poison_pick(JOB), "poison" if history else None)
