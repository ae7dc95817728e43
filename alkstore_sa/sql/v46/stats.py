"""Queue-stats history at schema 46: what pg-boss 12.38's monitor writes with
``persistQueueStats``, as our own statements (the "Supervision and cron" page, "Queue-stats
history").

- **Throughput** (:func:`throughput`, joined into the monitor's aggregate): per
  queue, the window ``[delta_on, now - DELTA_LAG)`` (started afresh, with NULL
  seconds, when ``delta_on`` is older than ``:reset_seconds``); the jobs created
  in it, the jobs completed and failed in it, the wait and run histograms of the
  jobs finished in it (48 slots, see :func:`latency_slot`), the age of the
  oldest ready job, and whether the recorded windows of the last hour hold
  fewer jobs than a recount finds (the true-up check).
- **History rows** (:func:`insert_history`): one ``queue_stats`` row per queue
  the aggregate wrote, a copy of its queue row, under ``queue-stats-insert``.
- **True-up** (:func:`true_up`): raise the recent rows' deltas to a recount.
- **Partitions and retention**: today's and tomorrow's ``queue_stats_YYYYMMDD``
  (UTC) when ``queue_stats`` is partitioned by day; old days dropped, or old rows
  deleted in batches when it is one plain table.
- **Who persists** (:func:`persisted_elsewhere`): the evidence that another
  instance writes history, so that a monitor turn we win writes it too.
"""

from __future__ import annotations

import datetime as dt
import functools
import math
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Float,
    Integer,
    Select,
    Text,
    TextClause,
    and_,
    bindparam,
    case,
    cast,
    delete,
    exists,
    false,
    func,
    insert,
    literal_column,
    or_,
    select,
    text,
    true,
    tuple_,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import TIMESTAMP, aggregate_order_by

from ...errors import shown
from ...models.enums import JobState
from ..common import locks
from ..common.base import now_param, seconds, state_text
from . import job_now
from .tables import INSTANCE, JOB, QUEUE, QUEUE_STATS

LATENCY_SLOTS = 48
"""Slots of a wait or run histogram: under 10 ms, 46 slots growing by √2, overflow."""

TRUE_UP_SECONDS = 3_600
"""How far back recorded windows may still be raised (pg-boss's true-up horizon)."""

RESET_SECONDS = 7_200
"""A window whose start is older than this (or two pass intervals, if longer)
starts afresh: counting was off for a while."""

PARTITION_PREFIX = "queue_stats_"

_LN_MIN = math.log(0.01)  # ln of the first slot's lower edge, 10 ms
_LN_STEP = math.log(2) / 2  # ln √2, the growth of one slot
_FINISHED = ("completed", "failed")
_MARK_POSITION = 15  # the version digit of a UUID's text form


def now() -> ColumnElement[Any]:
    """``COALESCE(:now, <schema>.job_now())``."""
    return now_param(job_now())


def _float(value: float) -> ColumnElement[Any]:
    return literal_column(f"{shown(value)}::float8", Float)


def _interval(seconds_: int) -> ColumnElement[Any]:
    return literal_column(f"interval '{seconds_} seconds'")


def latency_slot(duration: ColumnElement[Any]) -> ColumnElement[int]:
    """The histogram slot of a duration in seconds: 0 under 10 ms, ``k`` (1-46)
    from 10 ms·√2^(k-1) up to 10 ms·√2^k, 47 beyond (zero or less: slot 0)."""
    at_least = func.greatest(cast(duration, Float), _float(0.001))
    raw = cast(func.floor((func.ln(at_least) - _float(_LN_MIN)) / _float(_LN_STEP)), Integer) + 1
    return func.least(func.greatest(raw, 0), LATENCY_SLOTS - 1)


def _histogram(slots: ColumnElement[Any]) -> ColumnElement[Any]:
    # An array of slot numbers counted into LATENCY_SLOTS counts, NULL where none.
    slot = func.generate_series(0, LATENCY_SLOTS - 1).table_valued("slot").render_derived()
    u = func.unnest(slots).table_valued("v").render_derived()
    counts = select(u.c.v, cast(func.count(), Integer).label("n")).group_by(u.c.v).subquery("c")
    return (
        select(func.array_agg(aggregate_order_by(counts.c.n, slot.c.slot)))
        .select_from(slot.outerjoin(counts, counts.c.v == slot.c.slot))
        .scalar_subquery()
    )


def _reach(s: Any) -> ColumnElement[bool]:
    # The recorded rows a true-up may look at: captured within twice the horizon.
    return and_(
        s.c.captured_on >= now() - _interval(2 * TRUE_UP_SECONDS), s.c.delta_on.is_not(None)
    )


def _anchor(q: Any, s: Any) -> Select[Any]:
    """Per queue ``q``: ``b``, the newest window end at least the horizon old (or
    that started afresh), else the oldest in reach; ``f``, the oldest window end
    inside the queue's retention (rows deleted earlier would make a recount fall short)."""
    old = or_(s.c.delta_on <= now() - _interval(TRUE_UP_SECONDS), s.c.delta_seconds.is_(None))
    kept = case(
        (
            and_(q.c.deletion_seconds > 0, q.c.deletion_seconds < q.c.retention_seconds),
            q.c.deletion_seconds,
        ),
        else_=q.c.retention_seconds,
    )
    in_retention = s.c.delta_on >= now() - seconds(kept)
    b = func.coalesce(func.max(s.c.delta_on).filter(old), func.min(s.c.delta_on))
    f = func.min(s.c.delta_on).filter(in_retention)
    return select(b.label("b"), f.label("f")).where(s.c.name == q.c.name, _reach(s))


def _h(ax: Any) -> ColumnElement[Any]:
    # The anchor: the later of b and f; no f means nothing may be revised.
    return case((or_(ax.c.f.is_(None), ax.c.f > ax.c.b), ax.c.f), else_=ax.c.b)


THROUGHPUT_COLUMNS = (
    "created_delta",
    "completed_delta",
    "failed_delta",
    "wait_bins",
    "run_bins",
    "ready_oldest_seconds",
    "true_up",
)
"""The columns :func:`throughput` adds to the monitor's aggregate."""


def window_start(delta_on: ColumnElement[Any], end: ColumnElement[Any]) -> ColumnElement[Any]:
    """Where a queue's window starts: its ``delta_on`` unless older than
    ``:reset_seconds`` before ``end`` (then NULL, which counts nothing)."""
    reset = seconds(bindparam("reset_seconds", type_=Integer))
    return case((delta_on > end - reset, delta_on))


def throughput(name: ColumnElement[Any], end: ColumnElement[Any]) -> Any:
    """A lateral subquery of the :data:`THROUGHPUT_COLUMNS` of queue ``name``
    over the window ending at ``end`` (see the module)."""
    q = QUEUE.alias("qt")
    start = window_start(q.c.delta_on, end)
    t = now()

    c = JOB.alias("jc")
    created = (
        select(func.count())
        .where(c.c.name == q.c.name, c.c.created_on >= start, c.c.created_on < end)
        .scalar_subquery()
    )
    d = JOB.alias("jd")
    timed = d.c.state.in_(_FINISHED) & d.c.started_on.is_not(None)
    wait = func.date_part("epoch", d.c.started_on - func.greatest(d.c.created_on, d.c.start_after))
    run = func.date_part("epoch", d.c.completed_on - d.c.started_on)
    done = (
        select(
            func.count().filter(d.c.state == state_text(JobState.COMPLETED)).label("completed"),
            func.count().filter(d.c.state == state_text(JobState.FAILED)).label("failed"),
            func.array_agg(latency_slot(wait)).filter(timed).label("waits"),
            func.array_agg(latency_slot(run)).filter(timed).label("runs"),
        )
        .where(d.c.name == q.c.name, d.c.completed_on >= start, d.c.completed_on < end)
        .lateral("done")
    )
    r = JOB.alias("jr")
    ready = and_(r.c.state < state_text(JobState.ACTIVE), ~r.c.blocked, r.c.start_after <= t)
    waited = t - func.min(func.greatest(r.c.created_on, r.c.start_after))
    oldest = (
        select(cast(func.round(func.extract("epoch", waited)), Integer))
        .where(r.c.name == q.c.name, ready)
        .scalar_subquery()
    )

    ax = _anchor(q, QUEUE_STATS.alias("sa")).lateral("ax")
    h = _h(ax)
    s = QUEUE_STATS.alias("st")
    settled = (
        select(
            func.max(s.c.delta_on).label("top"),
            func.sum(s.c.created_delta + s.c.completed_delta + s.c.failed_delta).label("settled"),
        )
        .where(s.c.name == q.c.name, _reach(s), s.c.delta_on > h)
        .lateral("settled")
    )
    rc, rf = JOB.alias("rc"), JOB.alias("rf")
    recreated = (
        select(func.count())
        .where(rc.c.name == q.c.name, rc.c.created_on >= h, rc.c.created_on < settled.c.top)
        .scalar_subquery()
    )
    refinished = (
        select(func.count())
        .where(
            rf.c.name == q.c.name,
            rf.c.completed_on >= h,
            rf.c.completed_on < settled.c.top,
            rf.c.state.in_(_FINISHED),
        )
        .scalar_subquery()
    )
    return (
        select(
            cast(created, Integer).label("created_delta"),
            cast(done.c.completed, Integer).label("completed_delta"),
            cast(done.c.failed, Integer).label("failed_delta"),
            _histogram(done.c.waits).label("wait_bins"),
            _histogram(done.c.runs).label("run_bins"),
            oldest.label("ready_oldest_seconds"),
            func.coalesce(recreated + refinished > settled.c.settled, false()).label("true_up"),
        )
        .select_from(q.join(done, true()).join(ax, true()).join(settled, true()))
        .where(q.c.name == name)
        .lateral("tp")
    )


def throughput_values(src: Any, end: ColumnElement[Any]) -> dict[str, Any]:
    """The queue columns a counting aggregate writes from ``src`` (the
    :data:`THROUGHPUT_COLUMNS`), measured from the row's ``delta_on`` as it was."""
    start = window_start(QUEUE.c.delta_on, end)
    length = cast(func.round(func.extract("epoch", end - start)), Integer)
    empty: ColumnElement[Any] = literal_column(f"array_fill(NULL::int, ARRAY[{LATENCY_SLOTS}])")
    return {
        "created_delta": func.coalesce(src.c.created_delta, 0),
        "completed_delta": func.coalesce(src.c.completed_delta, 0),
        "failed_delta": func.coalesce(src.c.failed_delta, 0),
        # NULL (a window started afresh) stays NULL: not counted is not zero.
        "delta_seconds": case((length < 0, 0), else_=length),
        "delta_on": func.greatest(QUEUE.c.delta_on, end),
        "wait_bins": func.coalesce(src.c.wait_bins, empty),
        "run_bins": func.coalesce(src.c.run_bins, empty),
        "ready_oldest_seconds": func.coalesce(src.c.ready_oldest_seconds, 0),
    }


def _marked(id_: ColumnElement[Any]) -> ColumnElement[bool]:
    return func.substr(cast(id_, Text), _MARK_POSITION, 1) == "8"


@functools.cache
def insert_history() -> Any:
    """One ``queue_stats`` row per queue of ``:names``: its counters as the
    aggregate just wrote them, captured now. With ``:marked`` the row's id is a
    version-8 UUID: written only because another instance persists history, so it
    is never taken as evidence that someone does (see :func:`persisted_elsewhere`)."""

    # The version digit replaced by 8 (two random halves: still random).
    def half(start: int, length: int | None = None) -> ColumnElement[Any]:
        text_id = cast(func.gen_random_uuid(), Text)
        args = (text_id, start) if length is None else (text_id, start, length)
        return func.substr(*args)

    mark = half(1, _MARK_POSITION - 1) + "8" + half(_MARK_POSITION + 1)
    new_id = case(
        (bindparam("marked", type_=postgresql.BOOLEAN), cast(mark, postgresql.UUID)),
        else_=func.gen_random_uuid(),
    )
    copied = (
        "deferred_count",
        "queued_count",
        "ready_count",
        "active_count",
        "failed_count",
        "total_count",
        "created_delta",
        "completed_delta",
        "failed_delta",
        "delta_seconds",
        "delta_on",
        "wait_bins",
        "run_bins",
        "ready_oldest_seconds",
    )
    rows = select(new_id, QUEUE.c.name, *[QUEUE.c[c] for c in copied], now()).where(
        QUEUE.c.name == func.any(bindparam("names", type_=postgresql.ARRAY(Text)))
    )
    return (
        insert(QUEUE_STATS)
        .from_select(["id", "name", *copied, "captured_on"], rows)
        .returning(QUEUE_STATS.c.name)
    )


@functools.cache
def true_up(*, advisory: bool = True) -> Any:
    """Raise the deltas of the recent ``queue_stats`` rows of ``:names`` to a
    recount of their windows (jobs committed after their window was counted).

    A row's window runs from the previous row's ``delta_on`` to its own; the
    windows revised are those ending after the queue's anchor (see
    :func:`_anchor`). Each job is placed in its window by ``width_bucket`` over
    the window ends. Counts only rise. Under the ``queue-stats`` try-lock:
    returns one row ``(raised, pin_seconds)``, none when the lock was held.
    """
    lock = locks.try_lock_cte(locks.QUEUE_STATS, advisory=advisory)
    got = select(lock.c.got).scalar_subquery()
    q = QUEUE.alias("q")
    names = func.any(bindparam("names", type_=postgresql.ARRAY(Text)))
    ax = _anchor(q, QUEUE_STATS.alias("sa")).lateral("ax")
    s = QUEUE_STATS.alias("s")
    win = (
        select(
            s.c.id,
            s.c.captured_on,
            s.c.name,
            s.c.delta_on,
            s.c.created_delta,
            s.c.completed_delta,
            s.c.failed_delta,
            _h(ax).label("h"),
            func.row_number()
            .over(partition_by=s.c.name, order_by=(s.c.delta_on, s.c.captured_on))
            .label("i"),
        )
        .select_from(q.join(ax, true()).join(s, s.c.name == q.c.name))
        .where(q.c.name == names, _reach(s), s.c.delta_on > _h(ax), got)
        .cte("win")
    )
    thresholds = (
        select(
            win.c.name,
            win.c.h,
            func.array_prepend(
                win.c.h, func.array_agg(aggregate_order_by(win.c.delta_on, win.c.i))
            ).label("t"),
        )
        .group_by(win.c.name, win.c.h)
        .cte("th")
    )
    jc, jf = JOB.alias("jc"), JOB.alias("jf")
    created = (
        select(
            thresholds.c.name,
            func.width_bucket(jc.c.created_on, thresholds.c.t).label("i"),
            cast(func.count(), Integer).label("created"),
            literal_column("0").label("completed"),
            literal_column("0").label("failed"),
        )
        .select_from(
            thresholds.join(
                jc, and_(jc.c.name == thresholds.c.name, jc.c.created_on >= thresholds.c.h)
            )
        )
        .group_by(thresholds.c.name, literal_column("2"))
    )
    finished = (
        select(
            thresholds.c.name,
            func.width_bucket(jf.c.completed_on, thresholds.c.t).label("i"),
            literal_column("0").label("created"),
            cast(func.count().filter(jf.c.state == state_text(JobState.COMPLETED)), Integer),
            cast(func.count().filter(jf.c.state == state_text(JobState.FAILED)), Integer),
        )
        .select_from(
            thresholds.join(
                jf, and_(jf.c.name == thresholds.c.name, jf.c.completed_on >= thresholds.c.h)
            )
        )
        .where(jf.c.state.in_(_FINISHED))
        .group_by(thresholds.c.name, literal_column("2"))
    )
    counted = created.union_all(finished).subquery("counted")
    recount = (
        select(
            win.c.id,
            win.c.captured_on,
            cast(func.sum(counted.c.created), Integer).label("created"),
            cast(func.sum(counted.c.completed), Integer).label("completed"),
            cast(func.sum(counted.c.failed), Integer).label("failed"),
        )
        .select_from(win.join(counted, and_(counted.c.name == win.c.name, counted.c.i == win.c.i)))
        .group_by(win.c.id, win.c.captured_on)
        .subquery("recount")
    )
    qs = QUEUE_STATS
    raised = (
        qs.update()
        .where(
            qs.c.id == recount.c.id,
            qs.c.captured_on == recount.c.captured_on,
            or_(
                recount.c.created > qs.c.created_delta,
                recount.c.completed > qs.c.completed_delta,
                recount.c.failed > qs.c.failed_delta,
            ),
        )
        .values(
            created_delta=func.greatest(qs.c.created_delta, recount.c.created),
            completed_delta=func.greatest(qs.c.completed_delta, recount.c.completed),
            failed_delta=func.greatest(qs.c.failed_delta, recount.c.failed),
        )
        .returning(qs.c.id)
        .cte("raised")
    )
    pin = cast(func.extract("epoch", func.clock_timestamp() - func.transaction_timestamp()), Float)
    return (
        select(
            cast(select(func.count()).select_from(raised).scalar_subquery(), Integer).label(
                "raised"
            ),
            pin.label("pin_seconds"),
        )
        .where(got)
        .add_cte(lock)
    )


@functools.cache
def persisted_elsewhere() -> Select[Any]:
    """Does another instance persist queue-stats history? One row, ``persisted``.

    Yes when a live instance in ``instance`` (not stopped, heartbeat within three
    of its beats) has ``persist_queue_stats`` (whether its supervisor runs on a
    timer or is called by hand, its passes write history), or when some queue has a
    ``queue_stats`` row captured in the last ``:window_seconds`` that was not
    written only because of this rule (its id is not version 8).
    """
    i = INSTANCE
    live = exists().where(
        i.c.persist_queue_stats,
        i.c.stopped_on.is_(None),
        # In bigint: a row another client wrote with heartbeat_seconds near the top
        # of an integer does not overflow the product.
        i.c.heartbeat_on >= now() - seconds(cast(i.c.heartbeat_seconds, BigInteger) * 3),
    )
    # Queue by queue through queue_stats_i1 (name, captured_on), stopping at the
    # first queue that has such a row.
    s, q = QUEUE_STATS.alias("s"), QUEUE.alias("q")
    row = exists().where(
        s.c.name == q.c.name,
        s.c.captured_on >= now() - seconds(bindparam("window_seconds", type_=Float)),
        ~_marked(s.c.id),
    )
    recent = select(q.c.name).where(row).exists()
    return select(or_(live, recent).label("persisted"))


@functools.cache
def partition_state() -> Any:
    """``(partitioned, today)``: whether ``:schema_name``.queue_stats is partitioned,
    and the current UTC day."""
    day = cast(func.timezone("UTC", now()), postgresql.DATE)
    kind = (
        select(literal_column("c.relkind") == "p")
        .select_from(text("pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"))
        .where(
            literal_column("n.nspname") == bindparam("schema_name", type_=Text),
            literal_column("c.relname") == "queue_stats",
        )
        .scalar_subquery()
    )
    return select(func.coalesce(kind, false()).label("partitioned"), day.label("today"))


def _quote(name: str) -> str:
    preparer: Any = postgresql.dialect().identifier_preparer  # type: ignore[no-untyped-call]
    return str(preparer.quote(name))


def partition_name(day: dt.date) -> str:
    """``queue_stats_YYYYMMDD``: the partition of one UTC day."""
    return f"{PARTITION_PREFIX}{day:%Y%m%d}"


def create_partition(schema: str, day: dt.date) -> TextClause:
    """DDL for the partition of the UTC ``day`` (bounds written in UTC, so the
    session's time zone does not move them); nothing when it exists."""
    bounds = (f"{d:%Y-%m-%d} 00:00:00+00" for d in (day, day + dt.timedelta(days=1)))
    low, high = bounds
    return text(
        f"CREATE TABLE IF NOT EXISTS {_quote(schema)}.{_quote(partition_name(day))} "
        f"PARTITION OF {_quote(schema)}.queue_stats FOR VALUES FROM ('{low}') TO ('{high}')"
    )


@functools.cache
def day_partitions() -> Select[Any]:
    """The partitions of ``:schema_name``.queue_stats named for a day, as ``(name, day)``."""
    return (
        select(
            literal_column("c.relname", Text).label("name"),
            func.to_date(
                func.substr(literal_column("c.relname"), len(PARTITION_PREFIX) + 1), "YYYYMMDD"
            ).label("day"),
        )
        .select_from(
            text(
                "pg_inherits i JOIN pg_class p ON p.oid = i.inhparent "
                "JOIN pg_class c ON c.oid = i.inhrelid "
                "JOIN pg_namespace n ON n.oid = p.relnamespace"
            )
        )
        .where(
            literal_column("n.nspname") == bindparam("schema_name", type_=Text),
            literal_column("p.relname") == "queue_stats",
            literal_column("c.relname").op("~")(f"^{PARTITION_PREFIX}[0-9]{{8}}$"),
        )
    )


def drop_partition(schema: str, name: str) -> TextClause:
    """DDL dropping one day partition of queue_stats (gone already: nothing)."""
    return text(f"DROP TABLE IF EXISTS {_quote(schema)}.{_quote(name)}")


@functools.cache
def delete_old_history(*, cursor: bool) -> Any:
    """On a plain (not partitioned) queue_stats: delete up to ``:batch`` rows
    captured more than ``:days`` days ago, oldest first, after ``(:after_on,
    :after_id)`` (``cursor``). Returns ``(walk_cursor_on, walk_cursor_id,
    deleted)``; the cursor is NULL once a batch comes back short."""
    s = QUEUE_STATS
    old = s.c.captured_on < now() - seconds(bindparam("days", type_=Integer) * 86_400)
    batch = select(s.c.captured_on, s.c.id).where(old)
    if cursor:
        after = tuple_(
            bindparam("after_on", type_=TIMESTAMP(timezone=True)),
            bindparam("after_id", type_=postgresql.UUID(as_uuid=True)),
        )
        batch = batch.where(tuple_(s.c.captured_on, s.c.id) > after)
    size = bindparam("batch", type_=Integer)
    picked = batch.order_by(s.c.captured_on, s.c.id).limit(size).cte("batch")
    removed = (
        delete(s)
        .where(tuple_(s.c.captured_on, s.c.id).in_(select(picked.c.captured_on, picked.c.id)))
        .returning(s.c.id)
        .cte("removed")
    )
    full = select(func.count()).select_from(picked).scalar_subquery() == size
    last = select(picked).order_by(picked.c.captured_on.desc(), picked.c.id.desc()).limit(1)
    last_sq = last.subquery("last")
    return select(
        case((full, select(last_sq.c.captured_on).scalar_subquery())).label("walk_cursor_on"),
        case((full, select(last_sq.c.id).scalar_subquery())).label("walk_cursor_id"),
        cast(select(func.count()).select_from(removed).scalar_subquery(), Integer).label("deleted"),
    )


__all__ = [
    "LATENCY_SLOTS",
    "THROUGHPUT_COLUMNS",
    "create_partition",
    "day_partitions",
    "delete_old_history",
    "drop_partition",
    "insert_history",
    "latency_slot",
    "partition_name",
    "partition_state",
    "persisted_elsewhere",
    "throughput",
    "throughput_values",
    "true_up",
]
