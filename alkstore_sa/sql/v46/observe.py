"""Observability at schema 46: reading queue-stats history and warnings, and the
instance registry (the "Observe queues, warnings and workers" page).

- **History** (:func:`stats_history`): a queue's ``queue_stats`` rows, newest
  first, between two capture times; bucketing is done on these rows by
  :mod:`alkstore_sa.ops.observe`.
- **Warnings** (:func:`get_warnings`): rows of ``warning``, newest first.
- **Instances**: a worker's row in ``instance``, registered at start
  (:func:`register_instance`), refreshed on each heartbeat
  (:func:`heartbeat_instance`, an upsert that restores a pruned row), stamped
  ``stopped_on`` at a graceful stop (:func:`stop_instance`); the registering
  instance's older dead rows of the same name (or host, unnamed) beyond the
  newest 20 are pruned (:func:`prune_instance_lives`); :func:`get_instances`
  lists them with ``live``.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    delete,
    func,
    literal_column,
    or_,
    select,
    true,
    tuple_,
    union_all,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP, UUID, insert

from ..common.base import seconds
from ..common.reading import readable_columns
from . import job_now
from .tables import INSTANCE, JOB, QUEUE_STATS, WARNING

INSTANCE_QUIET_BEATS = 3
"""An instance is live until it misses this many heartbeats."""

INSTANCE_DEAD_KEPT_PER_NAME = 20
"""Dead rows kept per instance name (per host when unnamed) when an instance registers."""

_TIME = TIMESTAMP(timezone=True)
_INT_MAX = 2_147_483_647


def _quiet(heartbeat_seconds: Any) -> ColumnElement[Any]:
    """The silence after which an instance beating every ``heartbeat_seconds`` is dead,
    as an interval; in bigint, so a row another client wrote with ``heartbeat_seconds``
    near the top of an integer does not overflow the product."""
    return seconds(cast(heartbeat_seconds, BigInteger) * INSTANCE_QUIET_BEATS)


def _dead(i: Any) -> ColumnElement[bool]:
    return or_(
        i.c.stopped_on.is_not(None),
        i.c.heartbeat_on < job_now() - _quiet(i.c.heartbeat_seconds),
    )


def live(i: Any) -> ColumnElement[bool]:
    """Not stopped, and heard from within three of its heartbeats."""
    return and_(
        i.c.stopped_on.is_(None),
        i.c.heartbeat_on >= job_now() - _quiet(i.c.heartbeat_seconds),
    )


# ------------------------------------------------------------------ history


@functools.cache
def stats_history(*, for_buckets: bool) -> Select[Any]:
    """``queue_stats`` rows of ``:qname`` captured in ``[:from_on, :to_on]`` (a NULL
    bound is open), newest first, at most ``:limit`` (raw rows). ``for_buckets``:
    also the rows whose ``delta_on`` is in the range (their counters belong
    there), without a limit."""
    s = QUEUE_STATS
    lo = bindparam("from_on", type_=_TIME, required=False)
    hi = bindparam("to_on", type_=_TIME, required=False)

    def within(col: Any) -> ColumnElement[bool]:
        return and_(or_(lo.is_(None), col >= lo), or_(hi.is_(None), col <= hi))

    # readable_columns: a time Python cannot hold (``infinity``, a year past 9999) comes
    # back as the nearest one it can, named in ``unreadable`` (read by ops/observe.py).
    stmt = select(*readable_columns(s.c, s)).where(s.c.name == bindparam("qname", type_=Text))
    if for_buckets:
        on_delta = and_(s.c.delta_on.is_not(None), within(s.c.delta_on))
        return stmt.where(or_(within(s.c.captured_on), on_delta)).order_by(s.c.captured_on.desc())
    return (
        stmt.where(within(s.c.captured_on))
        .order_by(s.c.captured_on.desc(), s.c.id.desc())
        .limit(bindparam("limit", type_=Integer))
    )


@functools.cache
def stats_extent() -> Select[Any]:
    """``(first, last)``: the earliest and latest capture of ``:qname``'s history."""
    s = QUEUE_STATS
    # Over the captures Python can hold: a row captured at infinity (one another client
    # wrote) is still read, in a bucket of its own, but does not stretch the others'.
    rows = select(*readable_columns(s.c, s)).where(s.c.name == bindparam("qname", type_=Text))
    r = rows.subquery("r")
    readable = or_(r.c.unreadable.is_(None), ~r.c.unreadable.contains("captured_on="))
    return select(
        func.min(r.c.captured_on).label("first"), func.max(r.c.captured_on).label("last")
    ).where(readable)


# ------------------------------------------------------------------ warnings


@functools.cache
def get_warnings() -> Select[Any]:
    """Warnings of ``:type`` (NULL: all) created at or after ``:since`` (NULL: any
    time), newest first, ``:limit`` rows after skipping ``:offset``."""
    w = WARNING
    kind = bindparam("type", type_=Text, required=False)
    since = bindparam("since", type_=_TIME, required=False)
    return (
        select(*readable_columns(w.c, w))
        .where(or_(kind.is_(None), w.c.type == kind), or_(since.is_(None), w.c.created_on >= since))
        .order_by(w.c.created_on.desc(), w.c.id.desc())
        .limit(bindparam("limit", type_=Integer))
        .offset(bindparam("offset", type_=Integer))
    )


# ------------------------------------------------------------------ instances

_REGISTERED = (
    "name",
    "host",
    "pid",
    "version",
    "node_version",
    "heartbeat_seconds",
    "supervise",
    "schedule",
    "migrate",
    "persist_queue_stats",
    "persist_warnings",
    "application_name",
    "config",
)
_BEAT = (
    "pool_max",
    "pool_total",
    "pool_idle",
    "pool_waiting",
    "workers",
    "metrics",
    "heartbeat_on",
)


def _instance_values(started_on: ColumnElement[Any]) -> dict[str, Any]:
    def json(name: str) -> ColumnElement[Any]:
        return cast(bindparam(name, type_=Text), JSONB)

    return {
        "id": bindparam("id", type_=UUID(as_uuid=True)),
        "name": bindparam("name", type_=Text, required=False),
        "host": bindparam("host", type_=Text),
        "pid": bindparam("pid", type_=Integer),
        "version": bindparam("version", type_=Text),
        "node_version": bindparam("node_version", type_=Text),
        "heartbeat_seconds": bindparam("heartbeat_seconds", type_=Integer),
        "supervise": bindparam("supervise"),
        "schedule": bindparam("schedule"),
        "migrate": bindparam("migrate"),
        "persist_queue_stats": bindparam("persist_queue_stats"),
        "persist_warnings": bindparam("persist_warnings"),
        "pool_max": bindparam("pool_max", type_=Integer, required=False),
        "pool_total": bindparam("pool_total", type_=Integer, required=False),
        "pool_idle": bindparam("pool_idle", type_=Integer, required=False),
        "pool_waiting": bindparam("pool_waiting", type_=Integer, required=False),
        "workers": json("workers"),
        "metrics": json("metrics"),
        "config": json("config"),
        "application_name": func.current_setting("application_name"),
        "started_on": started_on,
        "heartbeat_on": job_now(),
    }


@functools.cache
def register_instance() -> Any:
    """Insert (or replace) the instance row ``:id``, live again from a new
    ``started_on``; returns ``started_on``."""
    stmt = insert(INSTANCE).values(_instance_values(job_now()))
    ex = stmt.excluded
    sets: dict[str, Any] = {c: ex[c] for c in (*_REGISTERED, *_BEAT)}
    sets.update(
        started_on=ex.started_on, stopped_on=None, crash_restarts=0, crash_restarts_since=None
    )
    return stmt.on_conflict_do_update(index_elements=["id"], set_=sets).returning(
        INSTANCE.c.started_on
    )


@functools.cache
def heartbeat_instance() -> Any:
    """Refresh the instance row ``:id`` (pool, workers, metrics, heartbeat); a
    row pruned meanwhile comes back with ``:started_on``."""
    stmt = insert(INSTANCE).values(_instance_values(bindparam("started_on", type_=_TIME)))
    ex = stmt.excluded
    return stmt.on_conflict_do_update(index_elements=["id"], set_={c: ex[c] for c in _BEAT})


@functools.cache
def stop_instance() -> Any:
    """Stamp ``stopped_on`` on the instance row ``:instance_id``."""
    return (
        INSTANCE.update()
        .where(INSTANCE.c.id == bindparam("instance_id", type_=UUID(as_uuid=True)))
        .values(stopped_on=job_now())
    )


@functools.cache
def prune_instance_lives() -> Any:
    """Dead rows of the same ``:name`` (``:host`` when unnamed) as instance ``:id``,
    beyond the newest :data:`INSTANCE_DEAD_KEPT_PER_NAME`; rows another session
    holds are skipped, not waited for."""
    i = INSTANCE.alias("i")
    name = bindparam("name", type_=Text, required=False)
    mine = case(
        (name.is_(None), and_(i.c.name.is_(None), i.c.host == bindparam("host", type_=Text))),
        else_=i.c.name == name,
    )
    ranked = (
        select(
            i.c.id,
            func.row_number().over(order_by=(i.c.started_on.desc(), i.c.id.desc())).label("n"),
        )
        .where(i.c.id != bindparam("id", type_=UUID(as_uuid=True)), mine, _dead(i))
        .subquery("ranked")
    )
    victims = (
        select(INSTANCE.c.id)
        .where(
            INSTANCE.c.id.in_(select(ranked.c.id).where(ranked.c.n > INSTANCE_DEAD_KEPT_PER_NAME))
        )
        .with_for_update(skip_locked=True)
    )
    return delete(INSTANCE).where(INSTANCE.c.id.in_(victims))


@functools.cache
def count_crash_restarts() -> Any:
    """Count the crash restarts of instance ``:instance_id`` (``:instance_name``,
    ``:instance_host``, ``:instance_pid``,
    its process started at ``:process_start``), as pg-boss's registrar does.

    The rows of the same name and host that started before it and have not beaten
    since it started are its earlier lives; the streak is those after the last one
    that stopped gracefully. A life counts once it is dead (quiet for three beats, or
    a row of this pid from before this process started: the pid was reused). The
    streak's dead rows are numbered from the earliest one kept, whose count stands
    for the lives pruned before it, and each later row and this instance get theirs;
    rewriting the streak keeps the earliest kept row's count right when pruning
    moves past it.
    """
    # Parameters named apart from the columns: an UPDATE reserves the column names.
    i = INSTANCE
    ident = bindparam("instance_id", type_=UUID(as_uuid=True))
    name = bindparam("instance_name", type_=Text, required=False)
    pid = bindparam("instance_pid", type_=Integer)
    born = bindparam("process_start", type_=_TIME)
    me = select(i.c.id, i.c.started_on).where(i.c.id == ident).cte("me")
    o = INSTANCE.alias("o")
    slot = (
        select(o)
        .select_from(o.join(me, true()))
        .where(
            o.c.id != me.c.id,
            o.c.host == bindparam("instance_host", type_=Text),
            or_(o.c.name == name, and_(o.c.name.is_(None), name.is_(None))),
            o.c.started_on < me.c.started_on,
            o.c.heartbeat_on <= me.c.started_on,
            ~and_(o.c.pid == pid, o.c.started_on >= born),
        )
        .cte("slot")
    )
    boundary = (
        select(func.max(slot.c.started_on).label("at"))
        .where(slot.c.stopped_on.is_not(None))
        .cte("boundary")
    )
    streak = (
        select(slot)
        .select_from(slot.join(boundary, true()))
        .where(
            slot.c.stopped_on.is_(None),
            or_(boundary.c.at.is_(None), slot.c.started_on > boundary.c.at),
        )
        .cte("streak")
    )
    quiet = streak.c.heartbeat_on < job_now() - _quiet(streak.c.heartbeat_seconds)
    dead = or_(quiet, and_(streak.c.pid == pid, streak.c.heartbeat_on < born))
    crashed = (
        select(
            streak.c.id,
            streak.c.crash_restarts,
            streak.c.crash_restarts_since,
            streak.c.heartbeat_on,
            func.row_number().over(order_by=(streak.c.started_on, streak.c.id)).label("n"),
            func.count().over().label("k"),
        )
        .where(dead)
        .cte("crashed")
    )
    head = (
        select(
            crashed.c.crash_restarts.label("base"),
            func.coalesce(crashed.c.crash_restarts_since, crashed.c.heartbeat_on).label("since"),
            crashed.c.k,
        )
        .where(crashed.c.n == 1)
        .cte("head")
    )
    later = (
        select(
            crashed.c.id,
            (head.c.base + crashed.c.n - 1).label("restarts"),
            head.c.since,
        )
        .select_from(crashed.join(head, true()))
        .where(crashed.c.n > 1)
    )
    mine = select(
        me.c.id, func.coalesce(head.c.base + head.c.k, 0).label("restarts"), head.c.since
    ).select_from(me.outerjoin(head, true()))
    counts = union_all(later, mine).cte("counts")
    return (
        INSTANCE.update()
        .where(INSTANCE.c.id == counts.c.id)
        .values(
            crash_restarts=cast(counts.c.restarts, Integer),
            crash_restarts_since=counts.c.since,
        )
    )


@functools.cache
def get_instances(*, after: bool) -> Select[Any]:
    """Registered instances by ``(started_on, id)``, at most ``:limit``; with
    ``after``, those following the row ``:after``."""
    i = INSTANCE
    stmt = select(*readable_columns(i.c, i), live(i).label("live"))
    if after:
        ref = bindparam("after", type_=UUID(as_uuid=True))
        started = select(i.c.started_on).where(i.c.id == ref).scalar_subquery()
        stmt = stmt.where(tuple_(i.c.started_on, i.c.id) > tuple_(started, ref))
    return stmt.order_by(i.c.started_on, i.c.id).limit(bindparam("limit", type_=Integer))


@functools.cache
def instance_exists() -> Select[Any]:
    """One row if the instance ``:id`` is registered."""
    return select(literal_column("1")).where(
        INSTANCE.c.id == bindparam("id", type_=UUID(as_uuid=True))
    )


__all__ = [
    "INSTANCE_DEAD_KEPT_PER_NAME",
    "INSTANCE_QUIET_BEATS",
    "count_crash_restarts",
    "get_instances",
    "get_warnings",
    "heartbeat_instance",
    "instance_exists",
    "live",
    "prune_instance_lives",
    "register_instance",
    "stats_extent",
    "stats_history",
    "stop_instance",
]


@functools.cache
def completions() -> Select[Any]:
    """Completed jobs of the queues ``:names`` since ``:since``, counted per bucket of
    ``:bucket`` seconds (bucket 0 starts at ``:since``): ``name, bucket, n``. A range
    read of index i16 (``name, completed_on``), never the whole table."""
    # From the epochs, not from completed_on - :since: a completion another client wrote
    # at infinity has an infinite epoch (no interval), and least() makes it the last
    # bucket there is (the caller counts every bucket past its last in the last).
    since = func.extract("epoch", bindparam("since", type_=_TIME))
    offset = (func.extract("epoch", JOB.c.completed_on) - since) / bindparam(
        "bucket", type_=Integer
    )
    bucket = cast(func.floor(func.least(offset, _INT_MAX)), Integer).label("bucket")
    return (
        select(JOB.c.name, bucket, func.count().label("n"))
        .where(
            JOB.c.name == func.any(bindparam("names", type_=ARRAY(Text))),
            JOB.c.completed_on >= bindparam("since", type_=_TIME),
            JOB.c.state == literal_column("'completed'"),
        )
        .group_by(JOB.c.name, bucket)
    )
