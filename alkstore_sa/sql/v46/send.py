"""The insert behind ``send`` and its relatives at schema 46 (pg-boss 12.38's insertJobs).

Same inputs as the schema-26 statement (:mod:`alkstore_sa.sql.v26.send`: parallel
arrays that ``unnest`` turns into rows), written for the columns of 46:

* ``created_on`` and every other instant come from ``job_now()``, the clock
  pg-boss 12.38 reads everywhere;
* ``heartbeat_seconds`` (a send option at 46) falls back to the queue's, as
  ``dead_letter`` and the retry options do (a queue default new since 26);
* ``policy`` is the queue's; ``blocked``, ``blocking`` and
  ``pending_dependencies`` are written explicitly as a plain send's (no flow);
  ``group_id``/``group_tier`` are the send options of 46; ``upsert_by_key`` (but
  for an upsert) and ``source_*`` stay NULL; ``trace_context`` is the one
  ``:trace_context`` (JSON text) of every job when the statement is built
  ``traced`` (:mod:`alkstore_sa.tracing`), NULL otherwise;
* a key_strict_fifo queue refuses a job without ``singleton_key`` (its CHECK
  would abort the transaction): the statement then inserts nothing and reports
  the queue's policy, so the operation can raise a clear error;
* a queue created with ``notify`` gets ``pg_notify`` on Node's channel
  (:func:`alkstore_sa.sql.v46.node_channel`) when a job is ready now, besides ours.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Interval,
    Select,
    Text,
    bindparam,
    case,
    cast,
    exists,
    false,
    func,
    literal,
    literal_column,
    or_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB

from ...options import OPTION, OPTIONS, OptionSpec
from ..common.base import seconds
from ..v26.send import ALL_INPUTS, inserted, job_source
from . import job_now
from .tables import JOB, QUEUE

KEY_STRICT_FIFO = "key_strict_fifo"
"""The policy (pg-boss 12, schema 28 on) that runs each key's jobs one at a time, in order."""


def _job_value(src: Any, q: Any, spec: OptionSpec) -> ColumnElement[Any]:
    """The job's value of ``spec``: its own, else the queue's, else pg-boss's default."""
    value: ColumnElement[Any] = src.c[spec.name]
    if spec.fallback:
        return func.coalesce(value, q.c[spec.queue_column])
    if spec.default is not None:
        return func.coalesce(value, spec.default)
    return value


def job_values(src: Any, q: Any, *, traced: bool = False) -> dict[str, ColumnElement[Any]]:
    """The ``job`` columns of an insert from the input rows ``src`` joined to their
    queue ``q``, as a send writes them (the flow columns are the caller's): each
    option's value or the queue's default, the throttle slot, ``start_after`` and
    ``keep_until``; with ``traced``, ``trace_context`` from ``:trace_context``.
    Shared by sends and flows."""
    now = job_now()
    start_after = func.coalesce(
        src.c.start_at,
        now + func.coalesce(src.c.start_in, literal_column("interval '0'", Interval)),
    )
    slot = src.c.singleton_seconds
    # Start of the current (or, with an offset, a later) throttle slot, stored as
    # UTC-naive like pg-boss does: job_i4 keys on it.
    singleton_on = case(
        (
            slot.is_not(None),
            literal_column("'epoch'::timestamp")
            + seconds(
                slot
                * func.floor(
                    (func.extract("epoch", now) + func.coalesce(src.c.singleton_offset, 0)) / slot
                )
            ),
        ),
    )
    values: dict[str, ColumnElement[Any]] = {
        str(o.job_column): _job_value(src, q, o) for o in OPTIONS if o.send and o.job_column
    }
    values.update(
        name=q.c.name,
        data=src.c.data,
        singleton_on=singleton_on,
        start_after=start_after,
        created_on=now,
        # Retention counts from start_after, so deferred jobs are not cut short.
        keep_until=start_after + seconds(_job_value(src, q, OPTION["retention_seconds"])),
        policy=q.c.policy,
    )
    if traced:
        values["trace_context"] = cast(bindparam("trace_context", type_=Text), JSONB)
    return values


@functools.cache
def insert_jobs(
    *,
    notify: bool,
    given: frozenset[str] = ALL_INPUTS,
    upsert_by_key: bool = False,
    traced: bool = False,
    conflicts: bool = True,
) -> Select[Any]:
    """Insert the jobs of ``:in_id``, ``:in_data`` ... into queue ``:qname`` at schema 46.

    Inputs as :func:`alkstore_sa.sql.v26.send.insert_jobs`, plus ``:all_keyed`` (every
    job has a ``singleton_key``) and ``:node_channel``. Returns ONE row ``(found,
    policy, inserted, ids)``: ``found`` is false when the queue does not exist,
    ``policy`` is the queue's, ``inserted`` and ``ids`` as
    :func:`alkstore_sa.sql.v26.send.inserted_ids` has them. Conflicts with a
    unique index are skipped (``ON CONFLICT DO NOTHING``), never raised.

    With ``notify`` the statement announces ready jobs on ``:channel`` (our
    workers); whatever ``notify``, it announces them on ``:node_channel`` when the
    queue has ``notify`` set, as pg-boss's own sends do, so Node workers wake.

    ``upsert_by_key``: the insert of an upsert by key (see
    :mod:`alkstore_sa.sql.v46.keys`): the jobs are marked ``upsert_by_key``, so
    ``job_i13`` keeps one created job per key among them.

    ``traced``: every job stores ``:trace_context`` (see :func:`job_values`).

    ``conflicts=False``: without ``ON CONFLICT``, as
    :func:`alkstore_sa.sql.v26.send.insert_jobs` has it.
    """
    src = job_source(given)
    q = QUEUE.alias("q")
    values = job_values(src, q, traced=traced)
    values.update(
        blocked=false(),
        blocking=false(),
        pending_dependencies=literal(0),
    )
    if upsert_by_key:
        values["upsert_by_key"] = true()
    all_keyed = bindparam("all_keyed", type_=Boolean)
    rows = (
        select(*values.values())
        .select_from(src.join(q, true()))
        .where(
            q.c.name == bindparam("qname", type_=Text),
            # All or nothing: a batch with an unkeyed job inserts no job into a
            # key_strict_fifo queue, so the caller's error leaves nothing behind.
            or_(all_keyed, q.c.policy != KEY_STRICT_FIFO),
        )
    )
    ins, header, counted, columns = inserted(JOB, QUEUE, list(values), rows, conflicts=conflicts)
    ready = exists(select(ins.c.id).where(ins.c.start_after <= job_now()))
    if notify:
        announce = (
            select(func.pg_notify(bindparam("channel", type_=Text), bindparam("qname", type_=Text)))
            .where(ready)
            .scalar_subquery()
        )
        columns.append(announce.label("notified"))
    nq = QUEUE.alias("nq")
    node_announce = (
        select(
            func.pg_notify(bindparam("node_channel", type_=Text), bindparam("qname", type_=Text))
        )
        .where(nq.c.name == bindparam("qname", type_=Text), nq.c.notify, ready)
        .scalar_subquery()
    )
    columns.append(node_announce.label("node_notified"))
    return select(*columns).select_from(header.join(counted, true()))
