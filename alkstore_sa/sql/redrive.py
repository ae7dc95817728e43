"""Taking jobs out of a dead-letter queue so they can be sent again."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Integer, Text, Uuid, bindparam, delete, func, select
from sqlalchemy.dialects.postgresql import ARRAY

from ..models.enums import JobState
from ._common import JOB, state_text


@functools.cache
def take(*, by_id: bool) -> Any:
    """Delete up to ``:limit`` waiting or failed jobs of ``:qname`` (optionally ``:ids``),
    oldest first, returning their ids and data. Active jobs are never taken."""
    conditions = [
        JOB.c.name == bindparam("qname", type_=Text),
        JOB.c.state.in_(
            [state_text(JobState.CREATED), state_text(JobState.RETRY), state_text(JobState.FAILED)]
        ),
    ]
    if by_id:
        conditions.append(JOB.c.id == func.any(bindparam("ids", type_=ARRAY(Uuid()))))
    victims = (
        select(JOB.c.name, JOB.c.id)
        .where(*conditions)
        .order_by(JOB.c.created_on, JOB.c.id)
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("victims")
    )
    return (
        delete(JOB)
        .where(JOB.c.name == victims.c.name, JOB.c.id == victims.c.id)
        .returning(JOB.c.id, JOB.c.data)
    )
