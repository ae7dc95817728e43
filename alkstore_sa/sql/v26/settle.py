"""Statements that move jobs between states by id (pg-boss's job and queue operations)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, Update, delete, func, select

from ...models.enums import JobState
from ..common import settling as _settling
from ..common.base import JOB, ids, qname, state


@functools.cache
def complete_jobs() -> Update:
    """``active`` -> ``completed`` with each job's output; returns the ids changed.

    Both forms need ``active`` (pg-boss's complete by id); a fenced one also needs
    the attempt that started at the fence.
    """
    return _settling.complete(JOB, func.now())


@functools.cache
def cancel_jobs() -> Update:
    """Not finished -> ``cancelled``."""
    return _settling.cancel(JOB, func.now())


@functools.cache
def resume_jobs() -> Update:
    """``cancelled`` -> ``created`` (start_after unchanged)."""
    return _settling.move(JOB, JobState.CANCELLED, completed_on=None, state=state(JobState.CREATED))


@functools.cache
def retry_jobs() -> Update:
    """``failed`` -> ``retry`` with one more attempt allowed.

    The next fetch raises ``retry_count`` too, so ``retry_limit + 1`` gives exactly
    one more run. Unlike pg-boss we clear ``completed_on``, so that the deletion
    rule cannot remove the job while it waits to run again.
    """
    return _settling.retry(JOB)


@functools.cache
def delete_jobs() -> Any:
    """Delete jobs by id, whatever their state."""
    return delete(JOB).where(JOB.c.name == qname(), JOB.c.id == ids()).returning(JOB.c.id)


@functools.cache
def delete_by_state(which: str) -> Any:
    """Delete a queue's ``queued`` (created/retry), ``stored`` (finished) or ``all`` jobs."""
    return delete(JOB).where(*_settling.of_state(JOB, which))


@functools.cache
def get_jobs() -> Select[Any]:
    """Jobs of queue ``:qname`` by id."""
    return select(*JOB.c).where(JOB.c.name == qname(), JOB.c.id == ids())


@functools.cache
def extend_lease() -> Update:
    """Push an active job's expiry out to ``now() + :extend_by`` seconds, fenced on
    ``started_on`` (see :func:`alkstore_sa.sql.common.settling.extend_lease`)."""
    return _settling.extend_lease(JOB, func.now())


@functools.cache
def locate_jobs() -> Select[Any]:
    """``(id, name, state, started_on)`` of jobs ``:ids`` in any queue (see
    :func:`alkstore_sa.sql.common.settling.locate`)."""
    return _settling.locate(JOB)


def give_back() -> Update:
    """Unstarted jobs claimed ahead back to the queue, fenced (see
    :func:`alkstore_sa.sql.common.settling.give_back`)."""
    return _settling.give_back(JOB)
