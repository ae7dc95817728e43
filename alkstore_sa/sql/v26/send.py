"""The insert statement behind ``send``, ``send_many`` and friends.

One statement for one job or thousands: the jobs arrive as parallel arrays that
``unnest`` turns into rows, and every option missing on a job falls back to the
queue's value in SQL, exactly as pg-boss derives its job columns (pg-boss's insertJobs).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable
from typing import Any

from sqlalchemy import (
    Boolean,
    ColumnElement,
    Integer,
    Interval,
    Select,
    Text,
    Uuid,
    bindparam,
    case,
    cast,
    column,
    exists,
    func,
    literal_column,
    null,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, aggregate_order_by, insert

from ...options import OPTION, OPTIONS, OptionSpec
from ..common.base import JOB, QUEUE, seconds

# The SQL type of each kind of option value (see OptionSpec.kind), for its input array.
_INPUT_TYPES: dict[str, Any] = {
    "int": Integer(),
    "bool": Boolean(),
    "text": Text(),
    "queue": Text(),
    "uuid": Uuid(),
}

OPTION_INPUTS: tuple[str, ...] = tuple(o.name for o in OPTIONS if o.send and o.kind != "when")
"""The send options bound as an input array of their own name; ``start_after``
is bound as ``start_at`` (a time) or ``start_in`` (an interval)."""

INPUT_COLUMNS: list[tuple[str, Any]] = [
    *((name, _INPUT_TYPES[OPTION[name].kind]) for name in OPTION_INPUTS),
    ("data", Text()),
    ("start_at", TIMESTAMP(timezone=True)),
    ("start_in", Interval()),
]
"""Per-job input columns, in the order of the bound arrays."""

ALL_INPUTS = frozenset(n for n, _ in INPUT_COLUMNS)


def data_array(*, given: bool) -> ColumnElement[Any]:
    """The jobs' data as a ``jsonb[]``, from ``:in_data``: ONE JSON array text whose
    elements are the jobs' data in input order (JSON ``null`` for none, stored as
    SQL NULL as before).

    One text parameter instead of a ``text[]`` of JSON texts: the driver sends it
    as is, where an array of JSON texts is quoted and escaped element by element
    (most of the client's cost of a large ``send_many``). An uncorrelated subquery,
    so PostgreSQL parses the array once per statement.
    """
    if not given:
        return cast(null(), ARRAY(JSONB))
    element = column("e", JSONB)
    ordinal = column("i", Integer)
    elements = func.jsonb_array_elements(cast(bindparam("in_data", type_=Text), JSONB))
    rows = elements.table_valued(element.name, with_ordinality=ordinal.name).render_derived(
        name="d"
    )
    return (
        select(
            func.array_agg(
                aggregate_order_by(
                    func.nullif(rows.c.e, literal_column("'null'::jsonb", JSONB)), rows.c.i
                )
            )
        )
        .select_from(rows)
        .scalar_subquery()
    )


def id_array() -> ColumnElement[Any]:
    """The jobs' ids as a ``uuid[]``, from ``:in_id``: ONE text, a PostgreSQL array
    literal of the ids in input order (``{<32 hex digits>,...}``, see
    :func:`id_array_text`).

    The server parses it in one go, where a driver adapting a list of UUID objects
    converts each one in Python (about a microsecond apiece).
    """
    return cast(bindparam("in_id", type_=Text), ARRAY(Uuid))


def id_array_text(ids: Iterable[uuid.UUID]) -> str:
    """The ``:in_id`` text of :func:`id_array` for ``ids``."""
    return "{" + ",".join([i.hex for i in ids]) + "}"


def input_array(name: str, type_: Any, given: frozenset[str]) -> ColumnElement[Any]:
    """The input array of column ``name`` (of ``type_``): bound as ``:in_<name>`` if
    ``given`` names it, else a NULL array (``data`` and ``id`` as
    :func:`data_array` and :func:`id_array` have them)."""
    if name == "data":
        return data_array(given="data" in given)
    if name not in given:
        return cast(null(), ARRAY(type_))
    if name == "id":
        return id_array()
    return bindparam(f"in_{name}", type_=ARRAY(type_))


def job_source(given: frozenset[str]) -> Any:
    """The jobs as rows ``src(<INPUT_COLUMNS>)``, ``data`` as ``jsonb``: one
    multi-argument ``unnest`` over the bound arrays (see :func:`insert_jobs`)."""
    # A NULL array in a multi-argument unnest reads as NULL on every row.
    arrays = [input_array(n, t, given) for n, t in INPUT_COLUMNS]
    return (
        func.unnest(*arrays)
        .table_valued(
            *[column(n, JSONB() if n == "data" else t) for n, t in INPUT_COLUMNS], name="src"
        )
        .render_derived()
    )


def _job_value(src: Any, q: Any, spec: OptionSpec) -> ColumnElement[Any]:
    """The job's value of option ``spec``: its own, else the queue's (an option with
    a queue fallback), else pg-boss's default."""
    value: ColumnElement[Any] = src.c[spec.name]
    if spec.fallback:
        return func.coalesce(value, q.c[spec.queue_column])
    if spec.default is not None:
        return func.coalesce(value, spec.default)
    return value


@functools.cache
def insert_jobs(
    *, notify: bool, given: frozenset[str] = ALL_INPUTS, conflicts: bool = True
) -> Select[Any]:
    """Insert the jobs of ``:in_id``, ``:in_data`` ... into queue ``:qname``.

    Only the input columns named in ``given`` are bound (as arrays ``:in_<name>``);
    the others are NULL for every job and fall back to the queue's values. A plain
    ``send`` binds two arrays instead of sixteen, which halves the work of
    encoding parameters; each combination is its own cached statement.

    Returns ONE row ``(found, policy, inserted, ids)``: ``found`` is false when the
    queue does not exist, ``policy`` is the queue's, ``inserted`` counts the jobs
    inserted, and ``ids`` (see :func:`inserted_ids`) lists them only when that is
    fewer than ``:n_jobs``, the number of jobs given; otherwise every job went in
    and the caller knows the ids. Jobs that hit a unique index (policy, throttle
    slot, duplicate id) are skipped by ``ON CONFLICT DO NOTHING``, so a conflict
    never aborts the caller's transaction. With ``notify`` the statement also
    issues ``pg_notify`` on ``:channel`` when a job is ready now; PostgreSQL
    delivers it on commit and folds duplicates within one transaction.

    ``conflicts=False``: without ``ON CONFLICT``, whose speculative insertion costs
    the server a few microseconds per job (about 15 % of a 1,000-job insert at
    46). Only for jobs no unique index of the schema can refuse (see
    :data:`CONFLICT_FREE_POLICY`), run in a savepoint so that a unique index nobody
    expected fails only that savepoint.
    """
    src = job_source(given)
    q = QUEUE.alias("q")

    start_after = func.coalesce(
        src.c.start_at,
        func.now() + func.coalesce(src.c.start_in, literal_column("interval '0'", Interval)),
    )
    slot = src.c.singleton_seconds
    # Start of the current (or, with an offset, a later) slot of `slot` seconds,
    # stored as UTC-naive like pg-boss does: the i4 index keys on it.
    singleton_on = case(
        (
            slot.is_not(None),
            literal_column("'epoch'::timestamp")
            + seconds(
                slot
                * func.floor(
                    (func.extract("epoch", func.now()) + func.coalesce(src.c.singleton_offset, 0))
                    / slot
                )
            ),
        ),
    )
    values: dict[str, ColumnElement[Any]] = {
        # Options new since 26 (heartbeat_seconds) have no column here; ops refuse them.
        str(o.job_column): _job_value(src, q, o)
        for o in OPTIONS
        if o.send and o.job_column and o.since <= 26
    }
    values.update(
        name=q.c.name,
        data=src.c.data,
        singleton_on=singleton_on,
        start_after=start_after,
        # Retention counts from start_after, so deferred jobs are not cut short.
        keep_until=start_after + seconds(_job_value(src, q, OPTION["retention_seconds"])),
        policy=q.c.policy,
    )
    rows = (
        select(*values.values())
        .select_from(src.join(q, true()))
        .where(q.c.name == bindparam("qname", type_=Text))
    )
    ins, header, counted, columns = inserted(JOB, QUEUE, list(values), rows, conflicts=conflicts)
    if notify:
        ready = exists(select(ins.c.id).where(ins.c.start_after <= func.now()))
        announce = (
            select(func.pg_notify(bindparam("channel", type_=Text), bindparam("qname", type_=Text)))
            .where(ready)
            .scalar_subquery()
        )
        columns.append(announce.label("notified"))
    return select(*columns).select_from(header.join(counted, true()))


CONFLICT_FREE_POLICY = "standard"
"""The policy whose queues no built-in unique index ties jobs together in: its jobs
conflict only on their id (the primary key), or with a ``singleton_key`` or
``singleton_seconds`` (the throttle index), or as an upsert's."""


def inserted(
    job: Any, queue: Any, target: list[str], rows: Any, *, conflicts: bool
) -> tuple[Any, Any, Any, list[ColumnElement[Any]]]:
    """The insert of ``rows`` into ``job`` (``target`` columns; ``ON CONFLICT DO
    NOTHING`` with ``conflicts``) as the CTE ``ins``, the queue's header
    (:func:`queue_header`), the count (:func:`inserted_ids`), and the columns of the
    one row every insert returns: ``(found, policy, inserted, ids)``."""
    statement = insert(job).from_select(target, rows)
    if conflicts:
        statement = statement.on_conflict_do_nothing()
    ins = statement.returning(job.c.id, job.c.start_after).cte("ins")
    header = queue_header(queue)
    counted = inserted_ids(ins)
    columns: list[ColumnElement[Any]] = [
        header.c.found,
        header.c.policy,
        counted.c.inserted,
        counted.c.ids,
    ]
    return ins, header, counted, columns


def queue_header(queue: Any) -> Any:
    """One row ``(found, policy)`` for queue ``:qname`` of the table ``queue``:
    whether it exists, and its policy (NULL if not)."""
    hq = queue.alias("hq")
    name = bindparam("qname", type_=Text)
    return select(
        exists(select(hq.c.name).where(hq.c.name == name)).label("found"),
        select(hq.c.policy).where(hq.c.name == name).scalar_subquery().label("policy"),
    ).subquery("hdr")


def inserted_ids(ins: Any) -> Any:
    """One row ``(inserted, ids)`` over the insert's RETURNING rows ``ins``: their
    number, and their ids (``uuid[]``) only when fewer than ``:n_jobs`` jobs went
    in, else NULL.

    A batch that goes in whole, the usual case, returns a count rather than
    thousands of ids the caller already has (it made them); a batch with jobs
    skipped on a unique index returns the ids that did go in.
    """
    inserted = func.count()
    return (
        select(
            inserted.label("inserted"),
            case(
                (inserted < bindparam("n_jobs", type_=Integer), func.array_agg(ins.c.id)),
            ).label("ids"),
        )
        .select_from(ins)
        .subquery("counted")
    )


def queues_exist() -> Select[tuple[str]]:
    """Which of the queues ``:names`` exist?"""
    return select(QUEUE.c.name).where(
        QUEUE.c.name == func.any(bindparam("names", type_=ARRAY(Text)))
    )
