"""The fail statement: delete, re-insert as retry or failed, dead-letter (pg-boss's failJobs).

pg-boss fails jobs by deleting the rows and inserting them again in one
statement, rather than updating them in place. We keep that shape: it is what
lets a stately queue whose retry slot is taken fall through to ``failed``
(the retry insert meets i3 and is skipped), and it is what Node pg-boss does to
the same rows, so both sides leave identical results.

Three statements share that shape: :func:`fail_jobs` (a handler's failure),
:func:`expire_jobs` (a lease that ran out) and :func:`fail_poison` (a row that can
never run, failed for good).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    CTE,
    Integer,
    Select,
    Text,
    Uuid,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    func,
    or_,
    select,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from ..models.enums import JobState
from ._common import (
    JOB,
    JOB_COLUMNS,
    QUEUE,
    now_param,
    seconds,
    settle_input,
    state,
    state_text,
)

TIMEOUT_OUTPUT = {"value": {"message": "job timed out"}}
"""Output written to a job failed by expiration (byte-compatible with pg-boss)."""


def _fail_from(deleted: CTE) -> Select[Any]:
    """Re-insert the rows of ``deleted`` (all job columns + ``new_output``).

    Returns ``(id, name, state, dead_letter)`` of every job failed or set to retry.
    """
    d = deleted.c
    retrying = d.retry_count < d.retry_limit
    # Additive backoff: retry_delay + 2^n/2 * (1 + random()), capped by
    # retry_delay_max (LEAST ignores NULL, so no cap when it is unset).
    exponent = func.power(2, func.least(16, d.retry_count + 1))
    backoff = func.least(
        d.retry_delay_max, d.retry_delay + exponent / 2 + exponent / 2 * func.random()
    )
    start_after = case(
        (d.retry_count == d.retry_limit, d.start_after),
        (
            d.retry_backoff.is_(False),
            func.now() + seconds(d.retry_delay),
        ),
        else_=func.now() + seconds(backoff),
    )
    overrides: dict[str, Any] = {
        "state": case((retrying, state(JobState.RETRY)), else_=state(JobState.FAILED)),
        "start_after": start_after,
        "completed_on": case((retrying, None), else_=func.now()),
        "output": d.new_output,
    }
    retried = (
        insert(JOB)
        .from_select(JOB_COLUMNS, select(*[overrides.get(c, d[c]) for c in JOB_COLUMNS]))
        .on_conflict_do_nothing()
        .returning(*JOB.c)
        .cte("retried")
    )
    # A retry that met a unique index (a stately queue with its retry slot taken)
    # fails for good instead. No ON CONFLICT here: the row just deleted held
    # every slot this one needs, and an error is better than a lost job.
    terminal = {"state": state(JobState.FAILED), "completed_on": func.now(), "output": d.new_output}
    failed = (
        insert(JOB)
        .from_select(
            JOB_COLUMNS,
            select(*[terminal.get(c, d[c]) for c in JOB_COLUMNS]).where(
                d.id.not_in(select(retried.c.id))
            ),
        )
        .returning(*JOB.c)
        .cte("failed")
    )
    results = union_all(
        select(
            retried.c.id,
            retried.c.name,
            retried.c.state,
            retried.c.dead_letter,
            retried.c.data,
            retried.c.output,
        ),
        select(
            failed.c.id,
            failed.c.name,
            failed.c.state,
            failed.c.dead_letter,
            failed.c.data,
            failed.c.output,
        ),
    ).cte("results")
    # One dead-letter job per failed job, on the DLQ's settings; the rest take
    # the column defaults (policy NULL, so the DLQ's unique indexes never reject it).
    q = QUEUE.alias("dlq")
    dead = (
        insert(JOB)
        .from_select(
            [
                "name",
                "data",
                "output",
                "retry_limit",
                "retry_backoff",
                "retry_delay",
                "keep_until",
                "deletion_seconds",
            ],
            select(
                q.c.name,
                results.c.data,
                results.c.output,
                q.c.retry_limit,
                q.c.retry_backoff,
                q.c.retry_delay,
                func.now() + seconds(q.c.retention_seconds),
                q.c.deletion_seconds,
            )
            .select_from(results.join(q, q.c.name == results.c.dead_letter))
            .where(results.c.state == state_text(JobState.FAILED)),
        )
        .returning(JOB.c.id)
        .cte("dead")
    )
    return select(
        results.c.id,
        results.c.name,
        results.c.state,
        results.c.dead_letter,
        select(func.count()).select_from(dead).scalar_subquery().label("dead_lettered"),
    )


@functools.cache
def fail_jobs() -> Select[Any]:
    """Fail jobs ``:ids`` of queue ``:qname`` with per-job ``:outputs`` and ``:fences``.

    Guard without a fence: the job is not finished (``state < 'completed'``), as
    pg-boss's fail by id. With a fence: the job is ``active`` in the attempt that
    started at that time. ``active`` matters: a job that expiry moved to
    ``retry`` keeps its ``started_on``, so the fence alone would let a late
    worker overwrite the timeout output and restart the retry delay.
    """
    src = settle_input()
    deleted = (
        delete(JOB)
        .where(
            JOB.c.name == bindparam("qname", type_=Text),
            JOB.c.id == src.c.id,
            or_(
                and_(src.c.fence.is_(None), JOB.c.state < state_text(JobState.COMPLETED)),
                and_(
                    JOB.c.state == state_text(JobState.ACTIVE),
                    JOB.c.started_on == src.c.fence,
                ),
            ),
        )
        .returning(*JOB.c, cast(src.c.output, JSONB).label("new_output"))
        .cte("deleted")
    )
    return _fail_from(deleted)


@functools.cache
def expire_jobs() -> Select[Any]:
    """Fail the active jobs of queues ``:names`` whose lease has run out.

    The lease is ``started_on + expire_seconds``, compared with ``:now`` (NULL =
    the database clock). Bounded by ``:limit`` rows per statement and ``SKIP
    LOCKED`` so a sweep never waits behind a worker. ``:timeout_output`` is the
    JSON text stored as output (:data:`TIMEOUT_OUTPUT`).
    """
    j = JOB.alias("j")
    victims = (
        select(j.c.name, j.c.id)
        .where(
            j.c.name == func.any(bindparam("names", type_=ARRAY(Text))),
            j.c.state == state_text(JobState.ACTIVE),
            # COALESCE(:now, now()): the supervisor's fake clock in tests.
            j.c.started_on + seconds(j.c.expire_seconds) < now_param(),
        )
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("victims")
    )
    deleted = (
        delete(JOB)
        .where(JOB.c.name == victims.c.name, JOB.c.id == victims.c.id)
        .returning(*JOB.c, cast(bindparam("timeout_output", type_=Text), JSONB).label("new_output"))
        .cte("deleted")
    )
    return _fail_from(deleted)


@functools.cache
def fail_poison() -> Select[Any]:
    """Fail jobs ``:ids`` of queue ``:qname`` for good, with per-job ``:outputs`` (JSON text).

    For jobs that can never run (a row no worker can read or activate): the
    normal fail statement, so the job is dead-lettered like any failed job, but
    with no retry left, because retrying a row that cannot be read or activated
    would only fail again. ``retry_limit`` is lowered to ``retry_count`` for that,
    which also leaves the record saying how many attempts there were.
    Returns ``(id, name, state, dead_letter, dead_lettered)`` per job failed.
    """
    src = (
        func.unnest(
            bindparam("ids", type_=ARRAY(Uuid())),
            bindparam("outputs", type_=ARRAY(Text())),
        )
        .table_valued(column("id", Uuid()), column("output", Text()), name="src")
        .render_derived()
    )
    returned = [
        JOB.c.retry_count.label("retry_limit") if c.name == "retry_limit" else c for c in JOB.c
    ]
    deleted = (
        delete(JOB)
        .where(
            JOB.c.name == bindparam("qname", type_=Text),
            JOB.c.id == src.c.id,
            JOB.c.state < state_text(JobState.COMPLETED),
        )
        .returning(*returned, cast(src.c.output, JSONB).label("new_output"))
        .cte("deleted")
    )
    return _fail_from(deleted)
