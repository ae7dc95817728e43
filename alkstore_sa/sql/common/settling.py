"""The settle statements that schema 26 and schema 46 share.

Completing, cancelling and extending a lease by id are the same statements at
both versions (:mod:`alkstore_sa.sql.v26.settle`, :mod:`alkstore_sa.sql.v46.settle`)
but for the job table they write and the clock they read (``now()`` at 26,
the schema's ``job_now()`` at 46), which each builder here takes.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Select,
    Table,
    Update,
    bindparam,
    case,
    func,
    null,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import JSONB

from ...models.enums import JobState
from .base import fenced_input, ids, qname, settle_input, state, state_text


def _active_of(job: Table, src: Any) -> list[ColumnElement[bool]]:
    # The jobs of :qname that src names, still active: only a running attempt
    # is completed or has its lease extended.
    return [job.c.name == qname(), job.c.id == src.c.id, job.c.state == state_text(JobState.ACTIVE)]


def complete(job: Table, now: ColumnElement[Any]) -> Update:
    """``active`` -> ``completed`` at ``now`` with each job's output; returns the ids
    changed.

    Inputs as :func:`alkstore_sa.sql.common.base.settle_input`. Both forms need
    ``active`` (pg-boss's complete by id); a fenced one also needs the attempt
    that started at the fence (``started_on``).
    """
    src = settle_input()
    return (
        job.update()
        .where(*_active_of(job, src), or_(src.c.fence.is_(None), job.c.started_on == src.c.fence))
        .values(
            completed_on=now,
            state=state(JobState.COMPLETED),
            output=func.cast(src.c.output, JSONB),
        )
        .returning(job.c.id)
    )


def cancel(job: Table, now: ColumnElement[Any]) -> Update:
    """Not finished -> ``cancelled`` at ``now``; returns the ids changed."""
    return (
        job.update()
        .where(
            job.c.name == qname(),
            job.c.id == ids(),
            job.c.state < state_text(JobState.COMPLETED),
        )
        .values(completed_on=now, state=state(JobState.CANCELLED))
        .returning(job.c.id)
    )


def extend_lease(job: Table, now: ColumnElement[Any], **stamps: Any) -> Update:
    """Push an active job's expiry out to ``now + :extend_by`` seconds (plus
    ``stamps``), fenced on ``started_on`` so a worker only extends the attempt it
    owns; returns the ids changed.

    The lease of a job is ``started_on + expire_seconds``; raising
    ``expire_seconds`` moves it without any other column, and Node pg-boss's
    monitor honours it as well.
    """
    src = fenced_input()
    elapsed = func.ceil(func.extract("epoch", now - job.c.started_on))
    return (
        job.update()
        .where(*_active_of(job, src), job.c.started_on == src.c.fence)
        .values(
            expire_seconds=func.cast(elapsed, Integer) + bindparam("extend_by", type_=Integer),
            **stamps,
        )
        .returning(job.c.id)
    )


def give_back(job: Table, **also: Any) -> Update:
    """Jobs a worker claimed ahead and never started go back to the queue, fenced on
    ``started_on`` as a settlement is, as if the claim had not happened (plus
    ``also``); returns the ids changed.

    The claim raised ``retry_count`` when the job had started before (its
    ``started_on`` was set), and left it otherwise. Giving back lowers a raised
    count and keeps ``started_on`` set, so that the next claim raises it again;
    a count the claim left alone goes back with ``started_on`` cleared. Either way
    the next claim gives the job the ``retry_count`` it would have had, and a job
    that had started before waits as ``retry``, one that had not as ``created``.
    """
    src = fenced_input()
    raised = job.c.retry_count > 0
    return (
        job.update()
        .where(*_active_of(job, src), job.c.started_on == src.c.fence)
        .values(
            state=case((raised, state(JobState.RETRY)), else_=state(JobState.CREATED)),
            retry_count=case((raised, job.c.retry_count - 1), else_=job.c.retry_count),
            started_on=case((raised, job.c.started_on), else_=null()),
            **also,
        )
        .returning(job.c.id)
    )


def move(job: Table, from_state: JobState, **values: Any) -> Update:
    """Jobs ``:ids`` of ``:qname`` in ``from_state`` get ``values``; returns the ids
    changed."""
    return (
        job.update()
        .where(job.c.name == qname(), job.c.id == ids(), job.c.state == state_text(from_state))
        .values(**values)
        .returning(job.c.id)
    )


def retry(job: Table, **also: Any) -> Update:
    """``failed`` -> ``retry`` with one more attempt allowed and ``completed_on``
    cleared (plus ``also``); returns the ids changed.

    The next fetch raises ``retry_count`` too, so ``retry_limit + 1`` gives exactly
    one more run. ``completed_on`` is cleared so that the deletion rule cannot
    remove the job while it waits to run again.
    """
    return move(
        job,
        JobState.FAILED,
        state=state(JobState.RETRY),
        retry_limit=job.c.retry_limit + 1,
        completed_on=None,
        **also,
    )


def of_state(job: Table, which: str) -> list[ColumnElement[bool]]:
    """The jobs of ``:qname`` that ``which`` names: ``queued`` (created, retry),
    ``stored`` (finished) or ``all``."""
    conditions = [job.c.name == qname()]
    if which == "queued":
        conditions.append(job.c.state < state_text(JobState.ACTIVE))
    elif which == "stored":
        conditions.append(job.c.state > state_text(JobState.ACTIVE))
    elif which != "all":
        raise ValueError(which)
    return conditions


def locate(job: Table) -> Select[Any]:
    """``(id, name, state, started_on)`` of the jobs ``:ids``, in whichever queue.

    Read after a settle with ``per_job=True``, for the jobs it left as they were,
    to say why. Not limited to ``:qname``, so an id of another queue is told from
    an unknown one; the job table's primary key starts with ``name``, so this
    reads every queue's rows (or index): only the settle's leftovers pay for it.
    """
    return select(job.c.id, job.c.name, job.c.state, job.c.started_on).where(job.c.id == ids())
