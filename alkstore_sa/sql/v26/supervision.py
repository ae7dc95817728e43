"""Statements of the supervisor: throttles, queue counters, deletion
(as pg-boss's maintenance does them).

Every statement that compares against the current time takes it as
``COALESCE(:now, now())``: production binds NULL and gets the database clock,
tests bind a fake clock's time and move days in milliseconds. Expiration lives
with the fail statement it shares (:func:`alkstore_sa.sql.v26.fail.expire_jobs`).
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
    Select,
    Update,
    bindparam,
    case,
    delete,
    func,
    literal_column,
    select,
    true,
)

from ...models.enums import JobState
from ..common.base import (
    JOB,
    QUEUE,
    SCHEDULE,
    VERSION,
    any_name,
    now_param,
    seconds,
    state_text,
)
from ..common.reading import infinite, readable_schedules

LOCK_TIMEOUT_MS = 30_000
"""``lock_timeout`` of a supervisor transaction, as pg-boss sets it around its
locked commands."""

IDLE_TIMEOUT_MS = 30_000
"""``idle_in_transaction_session_timeout`` of a supervisor transaction (pg-boss
sets it to the same value as the lock timeout; a separate name lets a test
shorten the wait for a lock without killing a slow step's connection)."""


def _elapsed_over(column: ColumnElement[Any]) -> ColumnElement[bool]:
    # pg-boss's throttle: a never-set column counts as set a week ago, so the
    # first instance to look always wins. A stamp at +/-infinity (another client
    # may write one) is due now, and the claim overwrites it with a finite time:
    # PostgreSQL cannot subtract an infinite timestamp, and would fail the step on
    # every pass. CASE evaluates the subtraction only for a finite stamp; a finite
    # stamp is compared exactly as pg-boss compares it.
    now = now_param()
    since = func.coalesce(column, now - literal_column("interval '1 week'"))
    elapsed = func.extract("epoch", now - since) > bindparam("interval", type_=Float)
    return case((infinite(since), true()), else_=elapsed)


@functools.cache
def local_timeouts() -> Select[Any]:
    """``SET LOCAL lock_timeout`` and the idle timeout, as Core (``set_config(..., true)``)."""
    return select(
        func.set_config("lock_timeout", str(LOCK_TIMEOUT_MS), true()),
        func.set_config("idle_in_transaction_session_timeout", str(IDLE_TIMEOUT_MS), true()),
    )


@functools.cache
def database_epoch() -> Select[tuple[float]]:
    """The database's ``now()`` as seconds since the epoch (clock skew, slot offsets)."""
    return select(func.extract("epoch", func.now()).label("epoch"))


@functools.cache
def queue_tables(*, by_name: bool) -> Select[Any]:
    """``(name, table_name)`` of every queue (or of ``:names``), grouped by table."""
    stmt = select(QUEUE.c.name, QUEUE.c.table_name).order_by(QUEUE.c.table_name, QUEUE.c.name)
    if by_name:
        stmt = stmt.where(QUEUE.c.name == any_name())
    return stmt


@functools.cache
def claim_queues(column: str) -> Update:
    """Take the cluster-wide turn for queues ``:names`` on ``monitor_on`` or ``maintain_on``.

    Stamps the column with the current time where more than ``:interval`` seconds
    have passed since it was last stamped, and returns those queue names. Node
    pg-boss runs the same UPDATE, so whichever instance (Python or Node) gets a
    row back works on that queue, and everyone else leaves it alone until the
    interval has passed again.
    """
    if column not in ("monitor_on", "maintain_on"):
        raise ValueError(column)
    col = QUEUE.c[column]
    return (
        QUEUE.update()
        .where(QUEUE.c.name == any_name(), _elapsed_over(col))
        .values({column: now_param()})
        .returning(QUEUE.c.name)
    )


@functools.cache
def claim_cron() -> Update:
    """Take the cluster-wide cron turn on ``version.cron_on`` (returns a row if won)."""
    return (
        VERSION.update()
        .where(_elapsed_over(VERSION.c.cron_on))
        .values(cron_on=now_param())
        .returning(true().label("won"))
    )


@functools.cache
def cache_stats() -> Update:
    """Write live counts into the queue rows of ``:names``; return the warning inputs.

    Counts as pg-boss's monitor: deferred (``start_after`` in the future), queued
    (created, retry), active, total, and ``singletons_active`` (keys of active
    singleton/stately jobs, NULL when none). The LEFT JOIN gives a queue without
    jobs zeros instead of keeping stale numbers (pg-boss 11.1.2 keeps them).
    Returns ``(name, queued_count, warning_queued)``.
    """
    j, q = JOB, QUEUE.alias("q")
    active = j.c.state == state_text(JobState.ACTIVE)
    stats = (
        select(
            q.c.name,
            func.count(j.c.id).filter(j.c.start_after > now_param()).label("deferred"),
            func.count(j.c.id).filter(j.c.state < state_text(JobState.ACTIVE)).label("queued"),
            func.count(j.c.id).filter(active).label("active"),
            func.count(j.c.id).label("total"),
            func.array_agg(j.c.singleton_key)
            .filter(active, j.c.policy.in_(("singleton", "stately")))
            .label("singletons"),
        )
        .select_from(q.outerjoin(j, j.c.name == q.c.name))
        .where(q.c.name == any_name())
        .group_by(q.c.name)
        .cte("stats")
    )
    return (
        QUEUE.update()
        .where(QUEUE.c.name == stats.c.name)
        .values(
            deferred_count=stats.c.deferred,
            queued_count=stats.c.queued,
            active_count=stats.c.active,
            total_count=stats.c.total,
            singletons_active=stats.c.singletons,
        )
        .returning(QUEUE.c.name, QUEUE.c.queued_count, QUEUE.c.warning_queued)
    )


@functools.cache
def delete_expired() -> Select[Any]:
    """Delete up to ``:limit`` jobs of queues ``:names`` whose time is up; counts per queue.

    Finished jobs (completed, cancelled, failed) go ``deletion_seconds`` after
    ``completed_on``; queued jobs go once ``keep_until`` has passed; active jobs
    never. pg-boss tests ``completed_on`` alone, which can also catch an active
    job that was manually retried (its ``completed_on`` survives the retry); the
    explicit state guard rules that out. The batch limit and ``SKIP LOCKED`` keep
    each statement short and out of the workers' way; the caller repeats it.
    """
    now = now_param()
    j = JOB.alias("j")
    finished = j.c.state > state_text(JobState.ACTIVE)
    victims = (
        select(j.c.name, j.c.id)
        .where(
            j.c.name == any_name(),
            (finished & (j.c.completed_on + seconds(j.c.deletion_seconds) < now))
            | ((j.c.state < state_text(JobState.ACTIVE)) & (j.c.keep_until < now)),
        )
        .limit(bindparam("limit", type_=Integer))
        .with_for_update(skip_locked=True)
        .cte("victims")
    )
    gone = (
        delete(JOB)
        .where(JOB.c.name == victims.c.name, JOB.c.id == victims.c.id)
        .returning(JOB.c.name)
        .cte("gone")
    )
    return select(gone.c.name, func.count().label("deleted")).group_by(gone.c.name)


@functools.cache
def all_schedules() -> Select[Any]:
    """Every stored schedule, in a stable order, as the timekeeper reads them
    (:func:`~alkstore_sa.sql.common.reading.readable_schedules`)."""
    return readable_schedules(SCHEDULE)
