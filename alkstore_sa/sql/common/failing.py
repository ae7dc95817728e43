"""The shape of fail that schema 26 and schema 46 share.

Both versions (:mod:`alkstore_sa.sql.v26.fail`, :mod:`alkstore_sa.sql.v46.fail`) fail
jobs as pg-boss does: delete the rows, insert them again as ``retry`` or
``failed`` in the same statement, and copy each failed job into its dead letter
queue. The steps here take the job table and the column values each version
writes, so what differs (which columns are carried, the backoff, the clock, what
a dead-letter copy keeps) stays in the version's module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Select,
    Table,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, Insert, insert

from ...limits import ATTEMPTS_KEPT, LONGEST_RETRY_DELAY, MAX_ATTEMPT_ERROR_BYTES
from ...models.attempts import ATTEMPT
from ...models.enums import JobState
from .base import seconds, settle_input, state, state_text


def _fenced(job: Table) -> tuple[list[ColumnElement[Any]], list[Any]]:
    """The rows :func:`fenced_delete` matches, and the columns it returns."""
    src = settle_input()
    where = [
        job.c.name == bindparam("qname", type_=Text),
        job.c.id == src.c.id,
        or_(
            and_(src.c.fence.is_(None), job.c.state < state_text(JobState.COMPLETED)),
            and_(
                job.c.state == state_text(JobState.ACTIVE),
                job.c.started_on == src.c.fence,
            ),
        ),
    ]
    return where, [*job.c, cast(src.c.output, JSONB).label("new_output")]


def fenced_delete(job: Table) -> CTE:
    """Delete jobs ``:ids`` of ``:qname`` per :func:`~._common.settle_input`, as the
    CTE ``deleted`` (every column + ``new_output``).

    Without a fence the job must not be finished (``state < 'completed'``), as
    pg-boss's fail by id. With one it must be ``active`` in the attempt that
    started at that time. ``active`` matters: a job that expiry moved to
    ``retry`` keeps its ``started_on``, so the fence alone would let a late
    worker overwrite the timeout output and restart the retry delay.
    """
    where, returned = _fenced(job)
    return delete(job).where(*where).returning(*returned).cte("deleted")


def fenced_pick(job: Table) -> Select[Any]:
    """The rows :func:`fenced_delete` deletes, with the same columns, row-locked
    instead (the first of the separate statements of a fail, see
    :mod:`alkstore_sa.sql.v46.fail`)."""
    where, returned = _fenced(job)
    return select(*returned).where(*where).with_for_update(of=job)


def _poison(job: Table) -> tuple[list[ColumnElement[Any]], list[Any]]:
    """The rows :func:`poison_delete` matches, and the columns it returns."""
    src = (
        func.unnest(
            bindparam("ids", type_=ARRAY(Uuid())),
            bindparam("outputs", type_=ARRAY(Text())),
        )
        .table_valued(column("id", Uuid()), column("output", Text()), name="src")
        .render_derived()
    )
    returned = [
        job.c.retry_count.label("retry_limit") if c.name == "retry_limit" else c for c in job.c
    ]
    where = [
        job.c.name == bindparam("qname", type_=Text),
        job.c.id == src.c.id,
        job.c.state < state_text(JobState.COMPLETED),
    ]
    return where, [*returned, cast(src.c.output, JSONB).label("new_output")]


def poison_delete(job: Table) -> CTE:
    """Delete unfinished jobs ``:ids`` of ``:qname`` with per-job ``:outputs``, as the
    CTE ``deleted``, returning ``retry_limit`` lowered to ``retry_count``: a row
    that cannot be read or activated would only fail again, so it gets no retry,
    and the record still says how many attempts there were."""
    where, returned = _poison(job)
    return delete(job).where(*where).returning(*returned).cte("deleted")


def poison_pick(job: Table) -> Select[Any]:
    """The rows :func:`poison_delete` deletes, with the same columns, row-locked."""
    where, returned = _poison(job)
    return select(*returned).where(*where).with_for_update(of=job)


def capped(delay: ColumnElement[Any]) -> ColumnElement[Any]:
    """``LEAST(delay, LONGEST_RETRY_DELAY)``: a retry delay in seconds that stays
    inside PostgreSQL's interval range and leaves ``now + delay`` a time every
    client reads (100 years; pg-boss's backoff at 46 reaches 2.8e14 seconds, past the
    interval range, and one such row made the whole fail or expiry statement raise).
    A delay under the cap is left as pg-boss computes it. Written into the SQL text
    as a constant, not bound."""
    return func.least(delay, literal_column(str(LONGEST_RETRY_DELAY), BigInteger))


def outcomes(
    deleted: CTE, now: ColumnElement[Any], backoff: ColumnElement[Any], **also: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The values a row of ``deleted`` is inserted again with, as ``retry`` (or
    ``failed`` when no retry is left) and as ``failed`` (see :func:`reinsert`).

    A retry starts after ``retry_delay`` seconds, or ``backoff`` seconds (the
    version's formula) when ``retry_backoff`` is set, either capped at
    :data:`~alkstore_sa.limits.LONGEST_RETRY_DELAY` (see :func:`capped`); a job
    failed for good keeps its ``start_after``. ``also``: more values both set.
    """
    d = deleted.c
    retrying = d.retry_count < d.retry_limit
    start_after = case(
        # The last attempt failed: the job is done, start_after stays as it was.
        (d.retry_count == d.retry_limit, d.start_after),
        (d.retry_backoff.is_(False), now + seconds(capped(d.retry_delay))),
        else_=now + seconds(capped(backoff)),
    )
    common = {"output": d.new_output, **also}
    as_retry = {
        **common,
        "state": case((retrying, state(JobState.RETRY)), else_=state(JobState.FAILED)),
        "start_after": start_after,
        "completed_on": case((retrying, None), else_=now),
    }
    as_failed = {**common, "state": state(JobState.FAILED), "completed_on": now}
    return as_retry, as_failed


def reinsert(
    job: Table,
    deleted: CTE,
    columns: Sequence[str],
    as_retry: Mapping[str, Any],
    as_failed: Mapping[str, Any],
) -> tuple[CTE, CTE]:
    """Insert the rows of ``deleted`` again into ``job``: ``columns`` from the row,
    but those ``as_retry`` sets; the rows that insert skipped again, with
    ``as_failed`` instead. Returns the CTEs ``(retried, failed)``.
    """
    d = deleted.c
    retried = (
        insert(job)
        .from_select(columns, select(*[as_retry.get(c, d[c]) for c in columns]))
        .on_conflict_do_nothing()
        .returning(*job.c)
        .cte("retried")
    )
    # A retry that met a unique index (a stately queue with its retry slot taken)
    # fails for good instead. No ON CONFLICT here: the row just deleted held
    # every slot this one needs, and an error is better than a lost job.
    failed = (
        insert(job)
        .from_select(
            columns,
            select(*[as_failed.get(c, d[c]) for c in columns]).where(
                d.id.not_in(select(retried.c.id))
            ),
        )
        .returning(*job.c)
        .cte("failed")
    )
    return retried, failed


def results(retried: CTE, failed: CTE, kept: Sequence[str]) -> CTE:
    """The ``kept`` columns of every row retried or failed, as the CTE ``results``."""
    return union_all(
        select(*[retried.c[c] for c in kept]), select(*[failed.c[c] for c in kept])
    ).cte("results")


def dead_letter(job: Table, rows: CTE, dlq: Any, copy: Mapping[str, Any]) -> Select[Any]:
    """Copy each failed row of ``rows`` into its dead letter queue ``dlq`` (an alias
    of the queue table) with the values ``copy`` names, and return
    ``(id, name, state, dead_letter, dead_lettered)`` per row."""
    r = rows.c
    dead = (
        insert(job)
        .from_select(
            list(copy),
            select(*copy.values())
            .select_from(rows.join(dlq, dlq.c.name == r.dead_letter))
            .where(r.state == state_text(JobState.FAILED)),
        )
        .returning(job.c.id)
        .cte("dead")
    )
    return select(
        r.id,
        r.name,
        r.state,
        r.dead_letter,
        select(func.count()).select_from(dead).scalar_subquery().label("dead_lettered"),
    )


_RECORDED = ["name", "job_id", "attempt", "cause", "failed_on", "started_on", "error", "worker"]


def attempts_recorded(
    deleted: Any, now: ColumnElement[Any], cause: str, *, by_worker: bool
) -> Insert:
    """Insert each row of ``deleted`` (every job column + ``new_output``) as a failed
    attempt into the attempt history.

    ``by_worker``: the statement binds ``:worker`` (text) and ``:worker_id`` (UUID), the
    worker that failed the attempt (either may be NULL); otherwise both are NULL (expiry
    by supervision, a poison row). The attempt number is the job's ``retry_count`` plus
    one: a claim counts an attempt when it starts one, not the first.
    """
    d = deleted.c
    worker: Any = bindparam("worker", type_=Text) if by_worker else null()
    worker_id: Any = bindparam("worker_id", type_=Uuid) if by_worker else null()
    values = [d.name, d.id, d.retry_count + 1, literal(cause, Text), now, d.started_on]
    return insert(ATTEMPT).from_select(
        [*_RECORDED, "worker_id"], select(*values, kept_error(d.new_output), worker, worker_id)
    )


def kept_error(output: Any) -> ColumnElement[Any]:
    """The error an attempt keeps: the output as written, or, past
    :data:`~alkstore_sa.limits.MAX_ATTEMPT_ERROR_BYTES` of JSON text, its ``name``, the
    start of its ``message`` and of its ``stack``, and how big it was (``truncated``): 25
    attempts of a job must not each keep a megabyte of output."""
    size = func.octet_length(cast(output, Text))
    small = MAX_ATTEMPT_ERROR_BYTES
    head = MAX_ATTEMPT_ERROR_BYTES // 4
    shortened = func.jsonb_build_object(
        "name",
        output.op("->>")("name"),
        "message",
        func.left(output.op("->>")("message"), head),
        "stack",
        func.left(output.op("->>")("stack"), head),
        "truncated",
        size,
    )
    return case((size > small, shortened), else_=output)


def attempts_beyond(kept: int, *where: ColumnElement[bool], join: Any = None) -> Select[Any]:
    """The ids of the attempts of the jobs ``where`` picks (over the attempt history,
    joined to ``join`` if given) that are not among each job's newest ``kept``."""
    a = ATTEMPT
    newer = func.row_number().over(partition_by=(a.c.name, a.c.job_id), order_by=a.c.id.desc())
    source = a if join is None else a.join(join, and_(*where))
    ranked = select(a.c.id, newer.label("newer")).select_from(source)
    if join is None:
        ranked = ranked.where(*where)
    r = ranked.subquery("ranked")
    return select(r.c.id).where(r.c.newer > kept)


def record_attempts(
    deleted: Any, now: ColumnElement[Any], cause: str, *, by_worker: bool
) -> tuple[CTE, CTE]:
    """The CTEs ``(recorded, trimmed)`` a fail statement carries (:func:`with_history`):
    each row of ``deleted`` recorded as a failed attempt (:func:`attempts_recorded`),
    and each of those jobs trimmed to its newest :data:`~alkstore_sa.limits.ATTEMPTS_KEPT`
    attempts.
    """
    d = deleted.c
    recorded = attempts_recorded(deleted, now, cause, by_worker=by_worker)
    # The statement's snapshot holds the job's earlier attempts, not the one recorded
    # beside this: keep the newest ATTEMPTS_KEPT - 1 of them.
    old = attempts_beyond(
        ATTEMPTS_KEPT - 1, ATTEMPT.c.name == d.name, ATTEMPT.c.job_id == d.id, join=deleted
    )
    trimmed = delete(ATTEMPT).where(ATTEMPT.c.id.in_(old)).returning(ATTEMPT.c.id)
    return recorded.returning(ATTEMPT.c.id).cte("recorded"), trimmed.cte("trimmed")


def with_history(
    stmt: Select[Any],
    deleted: Any,
    now: ColumnElement[Any],
    cause: str | None,
    *,
    by_worker: bool = False,
) -> Select[Any]:
    """``stmt`` (a fail, whose rows come from ``deleted``) also recording each attempt
    it fails (:func:`record_attempts`) when ``cause`` is given; unchanged without."""
    if cause is None:
        return stmt
    return stmt.add_cte(*record_attempts(deleted, now, cause, by_worker=by_worker))
