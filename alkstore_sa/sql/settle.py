"""Statements that move jobs between states by id (pg-boss's job and queue operations)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Integer,
    Select,
    Text,
    Update,
    Uuid,
    bindparam,
    column,
    delete,
    func,
    or_,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP

from ..models.enums import JobState
from ._common import JOB, settle_input, state, state_text


def _ids() -> Any:
    return func.any(bindparam("ids", type_=ARRAY(Uuid())))


@functools.cache
def complete_jobs() -> Update:
    """``active`` -> ``completed`` with each job's output; returns the ids changed.

    Both forms need ``active`` (pg-boss's complete by id); a fenced one also needs
    the attempt that started at the fence.
    """
    src = settle_input()
    return (
        JOB.update()
        .where(
            JOB.c.name == bindparam("qname", type_=Text),
            JOB.c.id == src.c.id,
            JOB.c.state == state_text(JobState.ACTIVE),
            or_(src.c.fence.is_(None), JOB.c.started_on == src.c.fence),
        )
        .values(
            completed_on=func.now(),
            state=state(JobState.COMPLETED),
            output=func.cast(src.c.output, JSONB),
        )
        .returning(JOB.c.id)
    )


@functools.cache
def cancel_jobs() -> Update:
    """Not finished -> ``cancelled``."""
    return (
        JOB.update()
        .where(
            JOB.c.name == bindparam("qname", type_=Text),
            JOB.c.id == _ids(),
            JOB.c.state < state_text(JobState.COMPLETED),
        )
        .values(completed_on=func.now(), state=state(JobState.CANCELLED))
        .returning(JOB.c.id)
    )


@functools.cache
def resume_jobs() -> Update:
    """``cancelled`` -> ``created`` (start_after unchanged)."""
    return (
        JOB.update()
        .where(
            JOB.c.name == bindparam("qname", type_=Text),
            JOB.c.id == _ids(),
            JOB.c.state == state_text(JobState.CANCELLED),
        )
        .values(completed_on=None, state=state(JobState.CREATED))
        .returning(JOB.c.id)
    )


@functools.cache
def retry_jobs() -> Update:
    """``failed`` -> ``retry`` with one more attempt allowed.

    The next fetch raises ``retry_count`` too, so ``retry_limit + 1`` gives exactly
    one more run. Unlike pg-boss we clear ``completed_on``, so that the deletion
    rule cannot remove the job while it waits to run again.
    """
    return (
        JOB.update()
        .where(
            JOB.c.name == bindparam("qname", type_=Text),
            JOB.c.id == _ids(),
            JOB.c.state == state_text(JobState.FAILED),
        )
        .values(state=state(JobState.RETRY), retry_limit=JOB.c.retry_limit + 1, completed_on=None)
        .returning(JOB.c.id)
    )


@functools.cache
def delete_jobs() -> Any:
    """Delete jobs by id, whatever their state."""
    return (
        delete(JOB)
        .where(JOB.c.name == bindparam("qname", type_=Text), JOB.c.id == _ids())
        .returning(JOB.c.id)
    )


@functools.cache
def delete_by_state(which: str) -> Any:
    """Delete a queue's ``queued`` (created/retry), ``stored`` (finished) or ``all`` jobs."""
    cond = [JOB.c.name == bindparam("qname", type_=Text)]
    if which == "queued":
        cond.append(JOB.c.state < state_text(JobState.ACTIVE))
    elif which == "stored":
        cond.append(JOB.c.state > state_text(JobState.ACTIVE))
    elif which != "all":
        raise ValueError(which)
    return delete(JOB).where(*cond)


@functools.cache
def get_jobs() -> Select[Any]:
    """Jobs of queue ``:qname`` by id."""
    return select(*JOB.c).where(JOB.c.name == bindparam("qname", type_=Text), JOB.c.id == _ids())


@functools.cache
def extend_lease() -> Update:
    """Push an active job's expiry out to ``now() + :extend_by`` seconds.

    The lease of a job is ``started_on + expire_seconds``; raising
    ``expire_seconds`` is the only way to move it without touching the schema-26
    objects, and Node pg-boss's monitor honours it as well. Fenced on
    ``started_on`` so a worker only extends the attempt it owns.
    """
    src = (
        func.unnest(
            bindparam("ids", type_=ARRAY(Uuid())),
            bindparam("fences", type_=ARRAY(TIMESTAMP(timezone=True))),
        )
        .table_valued(column("id", Uuid()), column("fence", TIMESTAMP(timezone=True)), name="src")
        .render_derived()
    )
    elapsed = func.ceil(func.extract("epoch", func.now() - JOB.c.started_on))
    return (
        JOB.update()
        .where(
            JOB.c.name == bindparam("qname", type_=Text),
            JOB.c.id == src.c.id,
            JOB.c.state == state_text(JobState.ACTIVE),
            JOB.c.started_on == src.c.fence,
        )
        .values(expire_seconds=func.cast(elapsed, Integer) + bindparam("extend_by", type_=Integer))
        .returning(JOB.c.id)
    )
