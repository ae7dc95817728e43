"""Read-only statements for operators: listing a queue's jobs (``alkstore jobs list``)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Integer, Select, Text, bindparam, select

from ..models.enums import JobState
from ._common import JOB, state_text
from .reading import readable_columns


@functools.cache
def list_jobs(state: JobState | None = None) -> Select[Any]:
    """Jobs of queue ``:qname``, newest first, at most ``:limit``; only ``state`` if given.

    One cached statement per state, with the state as a literal: a generic plan with
    a bound state could not use the partial fetch index (``state < 'active'``).
    """
    # readable_columns: one row another client wrote with values Python cannot
    # hold is returned as an UnreadableJob rather than failing the whole list.
    stmt = select(*readable_columns(JOB.c)).where(JOB.c.name == bindparam("qname", type_=Text))
    if state is not None:
        stmt = stmt.where(JOB.c.state == state_text(state))
    return stmt.order_by(JOB.c.created_on.desc(), JOB.c.id).limit(bindparam("limit", type_=Integer))
