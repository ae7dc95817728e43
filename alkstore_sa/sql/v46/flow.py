"""The insert behind ``flow`` at schema 46 (pg-boss 12.38's flow: its jobs and
their ``job_dependency`` rows, written together).

One statement for the whole flow, whatever queues its jobs go to:

* the jobs arrive as the arrays of a send (:mod:`alkstore_sa.sql.v26.send`), plus
  three of the flow's own: each job's queue (``:in_flow_queue``), whether it is
  a parent (``:in_flow_blocking``) and how many parents it waits for
  (``:in_flow_pending``). They are inserted as :mod:`alkstore_sa.sql.v46.send`
  inserts a job (options falling back to the queue's, ``job_now()`` as clock),
  with the flow columns pg-boss writes: ``blocked`` when the job has parents,
  ``blocking`` when it is one, ``pending_dependencies`` = its number of parents;
* the dependencies arrive as four arrays (``:dep_child_name``,
  ``:dep_child_id``, ``:dep_parent_name``, ``:dep_parent_id``);
* there is no ``ON CONFLICT``: a job refused by a unique index (an id taken, a
  policy or throttle slot holding its key) fails the statement, which the
  operation runs in a savepoint, so the flow is all or nothing (pg-boss aborts
  the flow's transaction for the same conflict) and the caller's transaction
  stays usable;
* each queue with a job ready now (not blocked, due) is announced on
  ``:channel`` (with ``notify``) and, when the queue has ``notify`` set, on
  Node's channel ``:node_channel``.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    cast,
    column,
    func,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from ..v26.send import ALL_INPUTS, INPUT_COLUMNS, input_array
from . import job_now
from .send import job_values
from .tables import JOB, JOB_DEPENDENCY, QUEUE

FLOW_COLUMNS: list[tuple[str, Any]] = [
    ("flow_queue", Text()),
    ("flow_blocking", Boolean()),
    ("flow_pending", Integer()),
]
"""The flow's own per-job inputs, bound as ``:in_<name>`` arrays."""

DEPENDENCY_INPUTS: list[tuple[str, Any]] = [
    ("child_name", Text()),
    ("child_id", Uuid()),
    ("parent_name", Text()),
    ("parent_id", Uuid()),
]
"""The dependency rows, bound as ``:dep_<column>`` arrays."""


def _source(given: frozenset[str]) -> Any:
    columns = [*INPUT_COLUMNS, *FLOW_COLUMNS]
    arrays = [
        bindparam(f"in_{n}", type_=ARRAY(t)) if n.startswith("flow_") else input_array(n, t, given)
        for n, t in columns
    ]
    return (
        func.unnest(*arrays)
        .table_valued(*[column(n, JSONB() if n == "data" else t) for n, t in columns], name="src")
        .render_derived()
    )


def _dependencies() -> Any:
    arrays = [bindparam(f"dep_{n}", type_=ARRAY(t)) for n, t in DEPENDENCY_INPUTS]
    return (
        func.unnest(*arrays)
        .table_valued(*[column(n, t) for n, t in DEPENDENCY_INPUTS], name="dep")
        .render_derived()
    )


def _count(selectable: Any) -> ColumnElement[Any]:
    return select(cast(func.count(), Integer)).select_from(selectable).scalar_subquery()


@functools.cache
def insert_flow(
    *, notify: bool, given: frozenset[str] = ALL_INPUTS, traced: bool = False
) -> Select[Any]:
    """Insert a flow's jobs and dependencies; one row ``(inserted, dependencies)``.

    ``given`` as in :func:`alkstore_sa.sql.v26.send.insert_jobs`. A job whose queue
    does not exist is left out (the operation checks the queues first and locks
    them ``FOR KEY SHARE``, so that cannot happen by the time this runs).
    ``traced``: every job stores ``:trace_context`` (see
    :func:`alkstore_sa.sql.v46.send.job_values`).
    """
    src = _source(given)
    q = QUEUE.alias("q")
    values = job_values(src, q, traced=traced)
    values.update(
        blocked=src.c.flow_pending > 0,
        blocking=src.c.flow_blocking,
        pending_dependencies=src.c.flow_pending,
    )
    rows = select(*values.values()).select_from(src.join(q, q.c.name == src.c.flow_queue))
    ins = (
        insert(JOB)
        .from_select(list(values), rows)
        .returning(JOB.c.name, JOB.c.start_after, JOB.c.blocked)
        .cte("ins")
    )
    dep = _dependencies()
    d = JOB_DEPENDENCY
    deps = (
        insert(d)
        .from_select(
            [d.c.child_name, d.c.child_id, d.c.parent_name, d.c.parent_id],
            select(dep.c.child_name, dep.c.child_id, dep.c.parent_name, dep.c.parent_id),
        )
        .on_conflict_do_nothing()
        .returning(d.c.child_id)
        .cte("deps")
    )
    ready = (
        select(ins.c.name)
        .where(~ins.c.blocked, ins.c.start_after <= job_now())
        .distinct()
        .subquery("ready")
    )
    columns: list[ColumnElement[Any]] = [
        _count(ins).label("inserted"),
        _count(deps).label("dependencies"),
    ]
    if notify:
        ours = select(
            cast(
                func.count(func.pg_notify(bindparam("channel", type_=Text), ready.c.name)), Integer
            )
        ).scalar_subquery()
        columns.append(ours.label("notified"))
    nq = QUEUE.alias("nq")
    node = (
        select(
            cast(
                func.count(func.pg_notify(bindparam("node_channel", type_=Text), ready.c.name)),
                Integer,
            )
        )
        .select_from(ready.join(nq, nq.c.name == ready.c.name))
        .where(nq.c.notify)
        .scalar_subquery()
    )
    columns.append(node.label("node_notified"))
    return select(*columns)


@functools.cache
def lock_queues() -> Select[Any]:
    """The name and policy of each of the queues ``:names`` that exists, locked
    ``FOR KEY SHARE`` until the transaction ends (a queue cannot be deleted under
    the flow being inserted into it; counters may still be updated)."""
    return (
        select(QUEUE.c.name, QUEUE.c.policy)
        .where(QUEUE.c.name == func.any(bindparam("names", type_=ARRAY(Text()))))
        .with_for_update(key_share=True, read=True)
    )


@functools.cache
def related_jobs(*, parents: bool, after: bool) -> Select[Any]:
    """The parents (``parents``) or the children of job ``:qname``/``:id`` as
    rows ``(name, id, state)``, ordered by queue then id, at most ``:limit``;
    with ``after``, only those past ``(:after_name, :after_id)``.

    They are read from ``job_dependency``, as pg-boss's ``getDependencies`` and
    ``getDependents`` read them; ``state`` comes from the job row and is NULL
    when the job no longer exists (maintenance drops such rows later).
    """
    d = JOB_DEPENDENCY
    if parents:
        mine, other = (d.c.child_name, d.c.child_id), (d.c.parent_name, d.c.parent_id)
    else:
        mine, other = (d.c.parent_name, d.c.parent_id), (d.c.child_name, d.c.child_id)
    j = JOB.alias("j")
    conditions = [
        mine[0] == bindparam("qname", type_=Text),
        mine[1] == bindparam("id", type_=Uuid),
    ]
    if after:
        conditions.append(
            tuple_(*other)
            > tuple_(bindparam("after_name", type_=Text), bindparam("after_id", type_=Uuid))
        )
    return (
        select(other[0].label("name"), other[1].label("id"), j.c.state)
        .select_from(d.outerjoin(j, and_(j.c.name == other[0], j.c.id == other[1])))
        .where(*conditions)
        .order_by(*other)
        .limit(bindparam("limit", type_=Integer))
    )


__all__ = ["DEPENDENCY_INPUTS", "FLOW_COLUMNS", "insert_flow", "lock_queues", "related_jobs"]
