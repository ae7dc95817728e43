"""Reading and tidying the attempt history (:mod:`alkstore_sa.models.attempts`).

The same at every schema version: the table is ours, and a job is found by its queue
and id in ``job`` at 26 and 46 alike. The writes are in the fail statements
(:func:`alkstore_sa.sql.common.failing.record_attempts`).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import BigInteger, Integer, Select, Text, Uuid, bindparam, delete, exists, func
from sqlalchemy import select as select_

from ...models.attempts import ATTEMPT
from .base import JOB
from .reading import readable_columns


@functools.cache
def job_attempts() -> Select[Any]:
    """The recorded attempts of job ``:id`` of queue ``:qname``, oldest first, each row
    readable whatever it holds (:func:`~.reading.readable_columns`)."""
    a = ATTEMPT
    return (
        select_(*readable_columns(a.c, a))
        .where(
            a.c.name == bindparam("qname", type_=Text), a.c.job_id == bindparam("id", type_=Uuid)
        )
        .order_by(a.c.id)
    )


@functools.cache
def sweep_orphans() -> Select[Any]:
    """Delete, among the ``:limit`` attempts after id ``:after``, those whose job no
    longer exists (deleted by supervision, ours or Node's, by id or with its queue).

    Answers one row: ``last`` (the highest id looked at; NULL when none was left after
    ``:after``, so the next sweep starts again from the beginning) and ``deleted``.
    A job failed again meanwhile is deleted and inserted in one transaction, so its
    attempts never look orphaned.
    """
    a = ATTEMPT
    window = (
        select_(a.c.id, a.c.name, a.c.job_id)
        .where(a.c.id > bindparam("after", type_=BigInteger))
        .order_by(a.c.id)
        .limit(bindparam("limit", type_=Integer))
        .cte("window")
    )
    alive = exists().where(JOB.c.name == window.c.name, JOB.c.id == window.c.job_id)
    gone = delete(a).where(a.c.id == window.c.id, ~alive).returning(a.c.id).cte("gone")
    return select_(
        select_(func.max(window.c.id)).scalar_subquery().label("last"),
        select_(func.count()).select_from(gone).scalar_subquery().label("deleted"),
    )
