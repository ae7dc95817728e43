"""Statements of the cron timekeeper and of schedules at schema 46 (pg-boss 12.38).

At 46 a schedule row has a ``kind`` (``cron`` or ``rrule``) and a ``last_job_id``;
the cron claim answers with the ``cron_on`` it replaced (for the ``missed``
catch-up), and an occurrence is filed into ``__pgboss__send-it`` under the key
``<name with _ escaped as \\_>__<key>`` and the 60-second slot it falls in,
written into ``singleton_on`` outright. The unique index on
``(name, singleton_key, singleton_on)`` then lets one job per occurrence in,
whichever timekeeper - Python or Node - sends it.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Float,
    Integer,
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
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, insert

from ..common.reading import infinite, readable_schedules
from .supervision import now, throttle_due
from .tables import JOB, QUEUE, SCHEDULE, VERSION


@functools.cache
def claim_cron() -> Select[Any]:
    """Try to take the cron turn on ``version.cron_on`` (due when ``:interval``
    seconds have passed, ``>=`` as pg-boss 12.38).

    Answers on both outcomes with ``(prior_cron_on, elapsed, claimed)``: the
    stamp it replaced (when a pass last ran; NULL on a database no pass has run
    on) is where a ``missed: 'once'`` catch-up starts. The prior value is read in
    a CTE of its own, which sees the row as it was before the update.
    """
    prior = select(*_turn_state()).cte("prior")
    claim = (
        VERSION.update()
        .where(throttle_due(VERSION.c.cron_on))
        .values(cron_on=now())
        .returning(true().label("won"))
        .cte("claim")
    )
    return select(
        prior.c.prior_cron_on,
        prior.c.elapsed,
        exists(select(claim.c.won)).label("claimed"),
    ).select_from(prior)


@functools.cache
def cron_turn_state() -> Select[Any]:
    """``(prior_cron_on, elapsed)`` of the cron turn, read without claiming it (no
    row lock): whether a claim could win now (``elapsed`` seconds since the last
    pass, a week on a database no pass has run on), and where a ``missed:
    'once'`` catch-up would start."""
    return select(*_turn_state())


def _turn_state() -> tuple[ColumnElement[Any], ColumnElement[Any]]:
    """``(prior_cron_on, elapsed)``: the stamp and the seconds since it (a week when no
    pass has run). A stamp at +/-infinity (another client may write one) reads as no
    stamp and infinitely long ago: due now, where a subtraction would fail the turn on
    every pass; the claim overwrites it with a finite time."""
    t = now()
    stamp = VERSION.c.cron_on
    since = func.coalesce(stamp, t - literal_column("interval '1 week'"))
    return (
        case((infinite(stamp), null()), else_=stamp).label("prior_cron_on"),
        case(
            (infinite(since), literal_column("'Infinity'::float8")),
            else_=cast(func.extract("epoch", t - since), Float),
        ).label("elapsed"),
    )


@functools.cache
def timekeeper_schedules() -> Select[Any]:
    """Every schedule row, in a stable order, as the timekeeper reads them
    (:func:`~alkstore_sa.sql.common.reading.readable_schedules`)."""
    return readable_schedules(SCHEDULE)


@functools.cache
def get_schedules(*, by_name: bool, by_key: bool) -> Select[Any]:
    """Stored schedules with their ``kind`` and ``last_job_id``, of queue
    ``:qname`` and key ``:key`` when asked."""
    return readable_schedules(SCHEDULE, by_name=by_name, by_key=by_key)


@functools.cache
def insert_occurrences() -> Any:
    """File occurrences into queue ``:queue`` (send-it): one job per
    ``(:datas[i], :keys[i], :slots[i])``, ``singleton_on`` set to the slot.

    The job takes the queue's options as pg-boss's insert does (retry, expiry,
    retention, deletion, policy, dead letter, heartbeat; the schema defaults
    where the queue is gone, so its foreign key refuses the job loudly rather
    than nothing being inserted). ``ON CONFLICT DO NOTHING``: an occurrence
    another timekeeper filed already is skipped. Returns ``(id, singleton_key,
    singleton_on)`` of the jobs inserted.
    """
    src = (
        func.unnest(
            bindparam("datas", type_=ARRAY(Text)),
            bindparam("keys", type_=ARRAY(Text)),
            bindparam("slots", type_=ARRAY(TIMESTAMP(timezone=False))),
        )
        .table_valued(
            column("data", Text), column("key", Text), column("slot", TIMESTAMP(timezone=False))
        )
        .render_derived(name="src")
    )
    name = bindparam("queue", type_=Text)
    q = select(QUEUE).where(QUEUE.c.name == name).subquery("q")
    t = now()
    retention = func.coalesce(q.c.retention_seconds, 1_209_600)
    rows = select(
        name,
        cast(src.c.data, JSONB),
        src.c.key,
        src.c.slot,
        literal_column("0", Integer),
        func.coalesce(q.c.retry_limit, 2),
        func.coalesce(q.c.retry_delay, 0),
        func.coalesce(q.c.retry_backoff, False),
        q.c.retry_delay_max,
        func.coalesce(q.c.expire_seconds, 900),
        func.coalesce(q.c.deletion_seconds, 604_800),
        t,
        t,
        t + retention * literal_column("interval '1 second'"),
        q.c.policy,
        q.c.dead_letter,
        q.c.heartbeat_seconds,
    ).select_from(src.outerjoin(q, true()))
    columns = [
        "name",
        "data",
        "singleton_key",
        "singleton_on",
        "priority",
        "retry_limit",
        "retry_delay",
        "retry_backoff",
        "retry_delay_max",
        "expire_seconds",
        "deletion_seconds",
        "start_after",
        "created_on",
        "keep_until",
        "policy",
        "dead_letter",
        "heartbeat_seconds",
    ]
    return (
        insert(JOB)
        .from_select(columns, rows)
        .on_conflict_do_nothing()
        .returning(JOB.c.id, JOB.c.singleton_key, JOB.c.singleton_on)
    )


@functools.cache
def set_last_job_ids() -> Any:
    """Point ``schedule.last_job_id`` of each ``(:names[i], :keys[i])`` at
    ``:ids[i]`` (the job its latest occurrence produced); ``updated_on`` stays."""
    src = (
        func.unnest(
            bindparam("names", type_=ARRAY(Text)),
            bindparam("keys", type_=ARRAY(Text)),
            bindparam("ids", type_=ARRAY(Uuid())),
        )
        .table_valued(column("name", Text), column("key", Text), column("id", Uuid()))
        .render_derived(name="src")
    )
    return (
        SCHEDULE.update()
        .where(SCHEDULE.c.name == src.c.name, SCHEDULE.c.key == src.c.key)
        .values(last_job_id=src.c.id)
    )


@functools.cache
def set_schedule_kinds() -> Any:
    """Relabel schedule ``(:names[i], :keys[i])`` as ``:kinds[i]`` where it still
    holds the expression ``:crons[i]`` it was read from (a ``schedule()`` that
    replaced it meanwhile wrote its own kind)."""
    src = (
        func.unnest(
            bindparam("names", type_=ARRAY(Text)),
            bindparam("keys", type_=ARRAY(Text)),
            bindparam("kinds", type_=ARRAY(Text)),
            bindparam("crons", type_=ARRAY(Text)),
        )
        .table_valued(
            column("name", Text), column("key", Text), column("kind", Text), column("cron", Text)
        )
        .render_derived(name="src")
    )
    return (
        SCHEDULE.update()
        .where(
            SCHEDULE.c.name == src.c.name,
            SCHEDULE.c.key == src.c.key,
            SCHEDULE.c.cron == src.c.cron,
        )
        .values(kind=src.c.kind)
    )


@functools.cache
def upsert_schedule() -> Any:
    """Insert or replace the schedule ``(:qname, :key)`` with its ``:kind``, as
    pg-boss 12.38 writes it (a replacement rewrites the kind too, so a row that
    held a rule and now holds a cron expression is read as one)."""
    t = now()
    stmt = insert(SCHEDULE).values(
        name=bindparam("qname", type_=Text),
        key=bindparam("key", type_=Text),
        kind=bindparam("kind", type_=Text),
        cron=bindparam("cron", type_=Text),
        timezone=bindparam("timezone", type_=Text),
        data=cast(bindparam("data", type_=Text), JSONB),
        options=cast(bindparam("options", type_=Text), JSONB),
        created_on=t,
        updated_on=t,
    )
    return stmt.on_conflict_do_update(
        index_elements=[SCHEDULE.c.name, SCHEDULE.c.key],
        set_={
            "kind": stmt.excluded.kind,
            "cron": stmt.excluded.cron,
            "timezone": stmt.excluded.timezone,
            "data": stmt.excluded.data,
            "options": stmt.excluded.options,
            "updated_on": t,
        },
    )


__all__ = [
    "claim_cron",
    "get_schedules",
    "insert_occurrences",
    "set_last_job_ids",
    "set_schedule_kinds",
    "upsert_schedule",
]
