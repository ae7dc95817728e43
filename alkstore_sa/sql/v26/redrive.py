"""Picking jobs out of a dead-letter queue so they can be sent again, and removing
them once they are."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Integer, Text, Uuid, bindparam, cast, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY

from ...models.enums import JobState
from ..common.base import JOB, state_text


@functools.cache
def pick(*, by_id: bool) -> Any:
    """Lock up to ``:limit`` waiting or failed jobs of ``:qname`` (optionally ``:ids``),
    oldest first, returning their ids and data. Active jobs are never taken.

    ``data`` comes back as JSON text, decoded per row by the caller: a row another
    client wrote past our limits must stay behind, not fail the whole redrive.

    The rows stay where they are, locked, until :func:`remove` deletes those that
    reached their new queue: a job the new queue refuses is not lost.
    """
    conditions = [
        JOB.c.name == bindparam("qname", type_=Text),
        JOB.c.state.in_(
            [state_text(JobState.CREATED), state_text(JobState.RETRY), state_text(JobState.FAILED)]
        ),
    ]
    if by_id:
        conditions.append(JOB.c.id == func.any(bindparam("ids", type_=ARRAY(Uuid()))))
    return (
        select(JOB.c.id, cast(JOB.c.data, Text).label("data"))
        .where(*conditions)
        .order_by(JOB.c.created_on, JOB.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
    )


@functools.cache
def remove() -> Any:
    """Delete jobs ``:ids`` of ``:qname`` (those that were sent on)."""
    return delete(JOB).where(
        JOB.c.name == bindparam("qname", type_=Text),
        JOB.c.id == func.any(bindparam("ids", type_=ARRAY(Uuid()))),
    )
