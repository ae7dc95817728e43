"""Read-only statements for operators: listing a queue's jobs (``alkstore jobs list``)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Integer, Select, Table, Text, Uuid, bindparam, cast, func, select, tuple_
from sqlalchemy.dialects.postgresql import ARRAY, TIMESTAMP

from ...models.enums import JobState
from ..common.base import JOB, state_text
from ..common.reading import EARLIEST, readable_columns


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
    # Jobs of one transaction share created_on; their ids are time-ordered (see
    # ops/sending.py), so id DESC lists them newest first too, as find_jobs does.
    return stmt.order_by(JOB.c.created_on.desc(), JOB.c.id.desc()).limit(
        bindparam("limit", type_=Integer)
    )


def find_jobs(
    table: Table,
    *,
    queue: bool,
    state: JobState | None,
    key: bool,
    group: bool,
    text: bool,
    since: bool,
    until: bool,
    after: bool,
) -> Select[Any]:
    """A page of jobs, newest first (``created_on DESC, id DESC``), keyset-paged.

    Each flag adds a condition on its bound parameter: ``:qname``, ``:key``
    (singleton key), ``:group_id``, ``:text`` (a LIKE pattern over the data's
    JSON text), ``:since``/``:until`` (``created_on`` bounds) and
    ``:after_on``/``:after_id`` (the last row of the previous page). The state
    is a literal, as in :func:`list_jobs`. ``:limit`` rows.
    """
    c = table.c
    stmt = select(*readable_columns(c, table))
    if queue:
        stmt = stmt.where(c.name == bindparam("qname", type_=Text))
    if state is not None:
        stmt = stmt.where(c.state == state_text(state))
    if key:
        stmt = stmt.where(c.singleton_key == bindparam("key", type_=Text))
    if group:
        stmt = stmt.where(c.group_id == bindparam("group_id", type_=Text))
    if text:
        stmt = stmt.where(cast(c.data, Text).ilike(bindparam("text", type_=Text), escape="\\"))
    if since:
        stmt = stmt.where(c.created_on >= bindparam("since", type_=TIMESTAMP(timezone=True)))
    if until:
        stmt = stmt.where(c.created_on < bindparam("until", type_=TIMESTAMP(timezone=True)))
    if after:
        # The plain bound first: an index on (name, created_on) can start there;
        # the row comparison then only settles ties on created_on.
        stmt = stmt.where(c.created_on <= bindparam("after_on", type_=TIMESTAMP(timezone=True)))
        stmt = stmt.where(
            tuple_(c.created_on, c.id)
            < tuple_(
                bindparam("after_on", type_=TIMESTAMP(timezone=True)),
                bindparam("after_id", type_=Uuid),
            )
        )
    return stmt.order_by(c.created_on.desc(), c.id.desc()).limit(bindparam("limit", type_=Integer))


def count_jobs(table: Table, *, named: bool) -> Select[Any]:
    """Jobs per queue and state, with the age in seconds of the oldest ready job
    (``created``/``retry`` with ``start_after`` passed) of each group; only the
    queues in ``:names`` when ``named``."""
    c = table.c
    ready = (c.state < state_text(JobState.ACTIVE)) & (c.start_after <= func.now())
    # A start_after another client wrote at -infinity (or before year 1) counts from the
    # earliest time Python holds, the stand-in readable_columns reads it as: now() minus
    # -infinity fails the whole count ("cannot subtract infinite timestamps"), and an
    # infinite age is no number a JSON answer or a duration can carry.
    oldest = func.greatest(func.min(c.start_after).filter(ready), EARLIEST)
    stmt = select(
        c.name,
        cast(c.state, Text).label("state"),
        func.count().label("n"),
        func.extract("epoch", func.now() - oldest).label("oldest"),
    )
    if named:
        stmt = stmt.where(c.name == func.any(bindparam("names", type_=ARRAY(Text))))
    return stmt.group_by(c.name, c.state)
