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

from sqlalchemy import CTE, Integer, Select, Text, bindparam, cast, delete, func, select
from sqlalchemy.dialects.postgresql import JSONB

from ...models.enums import JobState
from ..common import failing as _failing
from ..common.base import JOB, JOB_COLUMNS, QUEUE, any_name, now_param, seconds, state_text
from . import claims as _claims

TIMEOUT_OUTPUT = {"value": {"message": "job timed out"}}
"""Output written to a job failed by expiration (byte-compatible with pg-boss)."""


def _fail_from(deleted: CTE, cause: str | None = None, *, by_worker: bool = False) -> Select[Any]:
    """Re-insert the rows of ``deleted`` (all job columns + ``new_output``); with a
    ``cause``, record each as a failed attempt too
    (:func:`~alkstore_sa.sql.common.failing.with_history`).

    Returns ``(id, name, state, dead_letter, dead_lettered)`` of every job failed
    or set to retry.
    """
    d = deleted.c
    # Additive backoff: retry_delay + 2^n/2 * (1 + random()), capped by
    # retry_delay_max (LEAST ignores NULL, so no cap when it is unset).
    exponent = func.power(2, func.least(16, d.retry_count + 1))
    backoff = func.least(
        d.retry_delay_max, d.retry_delay + exponent / 2 + exponent / 2 * func.random()
    )
    as_retry, as_failed = _failing.outcomes(deleted, func.now(), backoff)
    retried, failed = _failing.reinsert(JOB, deleted, JOB_COLUMNS, as_retry, as_failed)
    results = _failing.results(
        retried, failed, ["id", "name", "state", "dead_letter", "data", "output"]
    )
    r = results.c
    # One dead-letter job per failed job, on the DLQ's settings; the rest take
    # the column defaults (policy NULL, so the DLQ's unique indexes never reject it).
    q = QUEUE.alias("dlq")
    dead_letter_copy: dict[str, Any] = {
        "name": q.c.name,
        "data": r.data,
        "output": r.output,
        "retry_limit": q.c.retry_limit,
        "retry_backoff": q.c.retry_backoff,
        "retry_delay": q.c.retry_delay,
        "keep_until": func.now() + seconds(q.c.retention_seconds),
        "deletion_seconds": q.c.deletion_seconds,
    }
    stmt = _failing.dead_letter(JOB, results, q, dead_letter_copy)
    return _failing.with_history(stmt, deleted, func.now(), cause, by_worker=by_worker)


@functools.cache
def fail_jobs(*, history: bool = False) -> Select[Any]:
    """Fail jobs ``:ids`` of queue ``:qname`` with per-job ``:outputs`` and ``:fences``;
    ``history``: record each attempt, by ``:worker`` and ``:worker_id``.

    Guard without a fence: the job is not finished (``state < 'completed'``), as
    pg-boss's fail by id. With a fence: the job is ``active`` in the attempt that
    started at that time (see :func:`alkstore_sa.sql.common.failing.fenced_delete`).
    """
    return _fail_from(_failing.fenced_delete(JOB), "failed" if history else None, by_worker=True)


@functools.cache
def expire_jobs(*, history: bool = False) -> Select[Any]:
    """Fail the active jobs of queues ``:names`` whose lease has run out.

    The lease is ``started_on + expire_seconds``, compared with ``:now`` (NULL =
    the database clock). Bounded by ``:limit`` rows per statement and ``SKIP
    LOCKED`` so a sweep never waits behind a worker. ``:timeout_output`` is the
    JSON text stored as output (:data:`TIMEOUT_OUTPUT`). ``history``: record each
    attempt (cause ``expired``).
    """
    j = JOB.alias("j")
    victims = (
        select(j.c.name, j.c.id)
        .where(
            j.c.name == any_name(),
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
    return _fail_from(deleted, "expired" if history else None)


@functools.cache
def fail_poison(*, history: bool = False) -> Select[Any]:
    """Fail jobs ``:ids`` of queue ``:qname`` for good, with per-job ``:outputs`` (JSON text).

    For jobs that can never run (a row no worker can read or activate): the
    normal fail statement, so the job is dead-lettered like any failed job, but
    with no retry left (see :func:`alkstore_sa.sql.common.failing.poison_delete`).
    Returns ``(id, name, state, dead_letter, dead_lettered)`` per job failed.
    ``history``: record each attempt (cause ``poison``).
    """
    return _fail_from(_failing.poison_delete(JOB), "poison" if history else None)


@functools.cache
def rescue_jobs(*, history: bool = False) -> Select[Any]:
    """Fail, as :func:`expire_jobs` does, at most ``:limit`` jobs of queues ``:names``
    active in an attempt one of our workers claimed and whose worker stopped renewing
    its liveness row (:mod:`~alkstore_sa.sql.v26.claims`), with ``:timeout_output``;
    ``history``: record each attempt (cause ``heartbeat``, the worker stopped answering).
    """
    return _fail_from(_claims.rescued(), "heartbeat" if history else None)
