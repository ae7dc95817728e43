"""Statements that settle and move jobs by id at schema 46 (pg-boss 12.38's
completeJobs, cancelJobs, resumeJobs, retryJobs, deleteJobsById).

As at 26 (:mod:`alkstore_sa.sql.v26.settle`), with what pg-boss 12.38 changed:

* time is read through ``job_now()``;
* complete writes only ``completed_on``, ``state`` and ``output`` (flow children
  are released by Node's background resolver, not on the hot path);
* resume and retry move ``start_after`` up to now when it has passed
  (``GREATEST``), so wait-time statistics count from when the job could run
  again; resume also clears ``upsert_by_key``, so a resumed job never collides in
  ``job_i13`` with a newer job upserted by the same key;
* resume and delete report ``retained``: how many of the jobs they moved out of
  the completed and cancelled set the queue's ``retained_count`` had counted
  (finished by its ``retained_on``), which :func:`reduce_retained` takes off.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    CTE,
    Integer,
    Select,
    Update,
    and_,
    bindparam,
    case,
    delete,
    func,
    null,
    or_,
    select,
)

from ...models.enums import JobState
from ..common import settling as _settling
from ..common.base import fenced_input, ids, qname, state, state_text
from . import job_now
from .tables import JOB, QUEUE


@functools.cache
def complete_jobs() -> Update:
    """``active`` -> ``completed`` with each job's output; returns the ids changed.

    Inputs as :func:`alkstore_sa.sql.common.base.settle_input`: a fenced item applies
    only to the attempt that started at its fence (``started_on``).
    """
    return _settling.complete(JOB, job_now())


@functools.cache
def cancel_jobs() -> Update:
    """Not finished -> ``cancelled``; returns the ids changed."""
    return _settling.cancel(JOB, job_now())


def _retained_on() -> Any:
    return select(QUEUE.c.retained_on).where(QUEUE.c.name == qname()).scalar_subquery()


def _was_retained(state_col: Any, completed_on: Any) -> Any:
    """Was a job (as it was before the statement) counted in ``retained_count``?

    The queue counts the completed and cancelled jobs that finished by its
    ``retained_on``; a NULL ``retained_on`` (never counted) counts none.
    """
    return and_(
        state_col.in_([state_text(JobState.COMPLETED), state_text(JobState.CANCELLED)]),
        completed_on <= _retained_on(),
    )


def _with_retained(changed: CTE) -> Select[Any]:
    """One row per job ``changed`` names, ``(id, retained)``; or none."""
    return select(
        changed.c.id,
        case((_was_retained(changed.c.old_state, changed.c.old_completed_on), 1), else_=0).label(
            "retained"
        ),
    )


@functools.cache
def resume_jobs() -> Select[Any]:
    """``cancelled`` -> ``created``, ``start_after`` up to now if it has passed,
    ``upsert_by_key`` cleared; one row ``(id, retained)`` per job resumed."""
    before = (
        select(JOB.c.id, JOB.c.completed_on)
        .where(
            JOB.c.name == qname(),
            JOB.c.id == ids(),
            JOB.c.state == state_text(JobState.CANCELLED),
        )
        .cte("resumable")
    )
    changed = (
        JOB.update()
        .where(
            JOB.c.name == qname(),
            JOB.c.id == before.c.id,
            # Re-checked on the locked row: another session may have moved it.
            JOB.c.state == state_text(JobState.CANCELLED),
        )
        .values(
            completed_on=None,
            state=state(JobState.CREATED),
            upsert_by_key=None,
            start_after=func.greatest(JOB.c.start_after, job_now()),
        )
        .returning(
            JOB.c.id,
            state_text(JobState.CANCELLED).label("old_state"),
            before.c.completed_on.label("old_completed_on"),
        )
        .cte("changed")
    )
    return _with_retained(changed)


@functools.cache
def retry_jobs() -> Update:
    """``failed`` -> ``retry`` with one more attempt allowed, ``completed_on``
    cleared (so retention cannot delete it while it waits) and ``start_after`` up
    to now if it has passed; returns the ids changed."""
    # start_after moves up to now, so wait-time statistics count from the retry.
    return _settling.retry(JOB, start_after=func.greatest(JOB.c.start_after, job_now()))


@functools.cache
def delete_jobs() -> Select[Any]:
    """Delete jobs by id, whatever their state; one row ``(id, retained)`` per job."""
    changed = (
        delete(JOB)
        .where(JOB.c.name == qname(), JOB.c.id == ids())
        .returning(
            JOB.c.id,
            JOB.c.state.label("old_state"),
            JOB.c.completed_on.label("old_completed_on"),
        )
        .cte("changed")
    )
    return _with_retained(changed)


@functools.cache
def delete_by_state(which: str) -> Select[Any]:
    """Delete a queue's ``queued`` (created/retry), ``stored`` (finished) or ``all``
    jobs; one row ``(deleted, retained)``."""
    changed = (
        delete(JOB)
        .where(*_settling.of_state(JOB, which))
        .returning(JOB.c.state.label("old_state"), JOB.c.completed_on.label("old_completed_on"))
        .cte("changed")
    )
    counts: list[Any] = [
        func.count().label("deleted"),
        func.count()
        .filter(_was_retained(changed.c.old_state, changed.c.old_completed_on))
        .label("retained"),
    ]
    return select(*counts).select_from(changed)


@functools.cache
def reduce_retained() -> Update:
    """Take ``:retained`` off queue ``:qname``'s ``retained_count`` (while it has
    one) and ``:total`` off its ``total_count``, never below zero.

    Jobs a resume or delete moved out of the completed and cancelled set, so the
    counts do not wait for the next maintenance pass (as pg-boss does after
    ``deleteJob`` and ``resume``).
    """
    retained = bindparam("retained", type_=Integer)
    total = bindparam("total", type_=Integer)
    return (
        QUEUE.update()
        .where(QUEUE.c.name == qname())
        .values(
            retained_count=case(
                (QUEUE.c.retained_count.is_(None), None),
                else_=func.greatest(QUEUE.c.retained_count - retained, 0),
            ),
            total_count=func.greatest(QUEUE.c.total_count - total, 0),
        )
    )


@functools.cache
def extend_lease() -> Update:
    """Push an active job's expiry out to ``now + :extend_by`` seconds, and stamp
    its heartbeat (``heartbeat_on``), fenced on ``started_on``.

    At 46 Node's monitor also fails an active job whose ``heartbeat_on`` is older
    than its ``heartbeat_seconds``: a worker extending its lease is alive, so
    this is its heartbeat too (pg-boss's touch).
    """
    return _settling.extend_lease(JOB, job_now(), heartbeat_on=job_now())


@functools.cache
def locate_jobs() -> Select[Any]:
    """``(id, name, state, started_on)`` of jobs ``:ids`` in any queue (see
    :func:`alkstore_sa.sql.common.settling.locate`)."""
    return _settling.locate(JOB)


@functools.cache
def touch_jobs() -> Update:
    """Stamp ``heartbeat_on = job_now()`` on the active jobs ``:ids`` of ``:qname``
    (pg-boss 12.38's ``touch``); returns the ids touched.

    ``:fences`` (one per id, NULL for none) as for the settles: a fenced item
    touches the job only while it is ``active`` in the attempt that started at its
    fence, so a worker whose claim lapsed cannot keep a newer attempt's heartbeat
    fresh (pg-boss fences its touch on ``retry_count`` for the same reason). The
    lease (``expire_seconds``) is not moved: that is :func:`extend_lease`.
    """
    src = fenced_input()
    return (
        JOB.update()
        .where(
            JOB.c.name == qname(),
            JOB.c.id == src.c.id,
            JOB.c.state == state_text(JobState.ACTIVE),
            or_(src.c.fence.is_(None), JOB.c.started_on == src.c.fence),
        )
        .values(heartbeat_on=job_now())
        .returning(JOB.c.id)
    )


def give_back() -> Update:
    """Unstarted jobs claimed ahead back to the queue, fenced, their claim's
    ``heartbeat_on`` cleared (see :func:`alkstore_sa.sql.common.settling.give_back`)."""
    return _settling.give_back(JOB, heartbeat_on=null())
