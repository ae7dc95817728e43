"""Statements of the supervisor at schema 46 (as pg-boss 12.38's supervise pass does them).

What changed since 26, and why each statement looks as it does:

- The throttles are stamped with ``>=`` the interval (pg-boss 12.38 accepts an
  elapsed time equal to the interval), lock the queue rows in name order
  ``FOR NO KEY UPDATE SKIP LOCKED`` (two claimers never deadlock, and a row in
  another instance's pass is skipped), and the monitor claims
  ``queue.monitor_claim_on``: ``monitor_on`` is written only together with the
  counts, so it keeps meaning "when these counts were captured".
- The counters come from live jobs only (created, retry, active, failed), split
  as Node splits them: queued = blocked + deferred + ready, blocked jobs
  counted apart. ``retained_count``/``total_count`` follow pg-boss's watermark
  rules, ``ready_history`` keeps the newest 60 ready counts. The aggregate takes
  the ``queue-stats`` lock with *try* inside the statement; the loser writes no
  counts and hands its claims back.
- Retention walks one queue in batches of primary keys and reports what it
  kept, so that a full walk can set ``retained_count``; ``deletion_seconds = 0``
  keeps finished jobs. Dependency rows whose job is gone are cleaned the same way.

Time is ``COALESCE(:now, <schema>.job_now())``: production binds NULL and reads
pg-boss's clock function, tests bind a fake clock's time.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Delete,
    Float,
    Integer,
    Select,
    Text,
    Update,
    Uuid,
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
    null,
    or_,
    select,
    true,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TIMESTAMP
from sqlalchemy.sql.elements import Grouping

from ...models.enums import JobState
from ..common import locks
from ..common.base import any_name, now_param, seconds, state_text
from ..common.reading import infinite
from . import job_now
from . import stats as stats_sql
from .tables import INSTANCE, JOB, JOB_DEPENDENCY, QUEUE, VERSION, WARNING

DELTA_LAG_SECONDS = 10
"""How far behind ``now`` the retained watermark moves: a completion stamped just
before a pass but committed after it is still ahead of the watermark (pg-boss's
``DELTA_LAG``)."""

READY_HISTORY_SIZE = 60
"""Ready counts kept newest first in ``queue.ready_history`` (one per counted pass)."""

WALK_BATCH = 10_000
"""Primary keys one retention or dependency batch covers, as pg-boss."""

INSTANCE_RETENTION_DAYS = 7
INSTANCE_DEAD_KEPT = 1_000
INSTANCE_QUIET_BEATS = 3

_MAX_UUID = "ffffffff-ffff-ffff-ffff-ffffffffffff"
_LIVE = ("created", "retry", "active", "failed")
_RETAINED = ("completed", "cancelled")


def now() -> ColumnElement[Any]:
    """``COALESCE(:now, <schema>.job_now())``."""
    return now_param(job_now())


def _names() -> Any:
    # ``unnest(:names) AS n(name)``: the column named in SQL. Without the column list,
    # ``n.name`` would read as ``name(n)``, a cast to the 63-byte type ``name``, which
    # cuts longer queue names short.
    names = func.unnest(bindparam("names", type_=ARRAY(Text)))
    return names.table_valued("name").render_derived(name="n")


def throttle_due(column_: ColumnElement[Any]) -> ColumnElement[bool]:
    # pg-boss's throttle: never stamped counts as stamped a week ago, and an
    # elapsed time equal to the interval is due (12.38 compares with >=). A stamp
    # at +/-infinity (another client may write one) is due now, and the claim
    # overwrites it with a finite time: PostgreSQL cannot subtract an infinite
    # timestamp, and would fail the turn on every pass. CASE evaluates the
    # subtraction only for a finite stamp; a finite stamp is compared exactly as
    # pg-boss compares it.
    t = now()
    since = func.coalesce(column_, t - literal_column("interval '1 week'"))
    elapsed = func.extract("epoch", t - since) >= bindparam("interval", type_=Float)
    return case((infinite(since), true()), else_=elapsed)


def _state_in(col: ColumnElement[Any], states: tuple[str, ...]) -> ColumnElement[bool]:
    # Literals, repeated verbatim, so the planner matches the partial index
    # job_i14 (live states) as pg-boss's own predicate does.
    return col.in_([literal_column(f"'{s}'") for s in states])


def _locked_names(extra: ColumnElement[bool] | None = None, *, skip_locked: bool) -> Any:
    # Queue rows in name order, FOR NO KEY UPDATE: the lock a plain update of
    # these columns takes, without blocking the key-share lock a job insert
    # takes on its queue row. Name order keeps two multi-row writers deadlock-free.
    stmt = select(QUEUE.c.name).where(QUEUE.c.name == any_name())
    if extra is not None:
        stmt = stmt.where(extra)
    return stmt.order_by(QUEUE.c.name).with_for_update(key_share=True, skip_locked=skip_locked)


@functools.cache
def claim_monitor(*, skip_locked: bool = True) -> Update:
    """Take the monitor turn of the queues ``:names`` whose ``monitor_claim_on``
    (or, never claimed, ``monitor_on``) is ``:interval`` seconds old; without
    ``skip_locked`` a queue row another pass holds is waited for, not skipped
    (:func:`alkstore_sa.backends.queue_claims_skip_locked`).

    Returns ``(name, refresh_stats)``; ``refresh_stats`` is false while
    ``version.monitor_backoff_on`` is in the future: the pass then skips the
    aggregate but still runs expiry, as Node does.
    """
    due = (
        _locked_names(
            throttle_due(func.coalesce(QUEUE.c.monitor_claim_on, QUEUE.c.monitor_on)),
            skip_locked=skip_locked,
        )
    ).cte("due")
    backoff = ~exists().where(VERSION.c.monitor_backoff_on > now())
    return (
        QUEUE.update()
        .where(QUEUE.c.name == due.c.name)
        .values(monitor_claim_on=now())
        .returning(QUEUE.c.name, backoff.label("refresh_stats"))
    )


@functools.cache
def claim_maintain(*, skip_locked: bool = True) -> Update:
    """Take the maintenance turn of the queues ``:names`` (``maintain_on``);
    returns ``(name, claimed_on)``, one stamp for every queue claimed
    (``skip_locked`` as :func:`claim_monitor` has it)."""
    due = _locked_names(throttle_due(QUEUE.c.maintain_on), skip_locked=skip_locked).cte("due")
    return (
        QUEUE.update()
        .where(QUEUE.c.name == due.c.name)
        .values(maintain_on=now())
        .returning(QUEUE.c.name, QUEUE.c.maintain_on.label("claimed_on"))
    )


@functools.cache
def release_maintain(*, skip_locked: bool = True) -> Update:
    """Hand back the maintenance turn of ``:names`` claimed at ``:claimed_on`` and
    not finished, so they are due again on the next pass (a claim another
    instance made since keeps its stamp)."""
    stamp = bindparam("claimed_on", type_=TIMESTAMP(timezone=True))
    mine = _locked_names(QUEUE.c.maintain_on == stamp, skip_locked=skip_locked).subquery("r")
    return QUEUE.update().where(QUEUE.c.name == mine.c.name).values(maintain_on=null())


@functools.cache
def cache_stats(*, throughput: bool = False, advisory: bool = True) -> Update:
    """Count the queues ``:names`` and write the counters, as pg-boss's monitor.

    One statement. It first tries the ``queue-stats`` advisory lock (the key
    Node uses); the loser scans nothing, writes no counts and sets its claims'
    ``monitor_claim_on`` back to NULL so the queues are due again at once. The
    winner writes, per queue: ``blocked_count``, ``deferred_count`` and
    ``ready_count`` (queued jobs split three ways, so they add up to
    ``queued_count``), ``active_count``, ``failed_count``, ``singletons_active``,
    the retained watermark and ``total_count``, ``ready_history`` and
    ``monitor_on``. With ``throughput`` (a pass that persists queue-stats
    history, see :mod:`alkstore_sa.sql.v46.stats`) it also counts the window
    since ``delta_on``: the deltas, ``delta_seconds``/``delta_on``, the wait and
    run histograms and ``ready_oldest_seconds`` (``:reset_seconds`` is the
    longest window counted; an older ``delta_on`` starts afresh).

    Returns ``(name, queued_count, warning_queued, pin_seconds, true_up)`` for
    the queues written, none when the lock was lost. ``pin_seconds`` is how long
    the transaction has held its snapshot, the monitor backoff's measure;
    ``true_up`` (always false without ``throughput``) says the recorded windows
    of the last hour hold fewer jobs than a recount finds.
    """
    lock = locks.try_lock_cte(locks.QUEUE_STATS, advisory=advisory)
    got = select(lock.c.got).scalar_subquery()

    released = (
        QUEUE.update()
        .where(QUEUE.c.name == _locked_names(~got, skip_locked=False).subquery("r").c.name)
        .values(monitor_claim_on=null())
        .cte("released")
    )

    t = now()
    end = t - literal_column(f"interval '{DELTA_LAG_SECONDS} seconds'")
    j = JOB.alias("j")
    queued = j.c.state < state_text(JobState.ACTIVE)
    live = (
        select(
            j.c.name,
            func.count().filter(queued & j.c.blocked).label("blocked"),
            func.count().filter(queued & ~j.c.blocked & (j.c.start_after > t)).label("deferred"),
            func.count().filter(queued & ~j.c.blocked & (j.c.start_after <= t)).label("ready"),
            func.count().filter(queued).label("queued"),
            func.count().filter(j.c.state == state_text(JobState.ACTIVE)).label("active"),
            func.count().filter(j.c.state == state_text(JobState.FAILED)).label("failed"),
            func.count().label("live"),
        )
        .where(j.c.name == any_name(), _state_in(j.c.state, _LIVE))
        .group_by(j.c.name)
        .subquery("live")
    )
    n = _names()
    qr = QUEUE.alias("qr")
    done = JOB.alias("d")
    finished = _state_in(done.c.state, _RETAINED)
    since = (
        select(
            qr.c.retained_on.label("retained_from"),
            select(func.count())
            .where(
                done.c.name == qr.c.name,
                done.c.completed_on > qr.c.retained_on,
                done.c.completed_on <= end,
                finished,
            )
            .scalar_subquery()
            .label("retained_since"),
            select(func.count())
            .where(
                done.c.name == qr.c.name,
                done.c.completed_on > func.greatest(qr.c.retained_on, end),
                done.c.completed_on <= t,
                finished,
            )
            .scalar_subquery()
            .label("retained_recent"),
        )
        .where(qr.c.name == n.c.name)
        .lateral("since")
    )
    s = JOB.alias("s")
    singletons = (
        select(s.c.name, func.array_agg(s.c.singleton_key).label("keys"))
        .where(
            s.c.name == any_name(),
            s.c.state == state_text(JobState.ACTIVE),
            s.c.policy.in_(("singleton", "stately")),
        )
        .group_by(s.c.name)
        .subquery("singletons")
    )
    joined = (
        n.outerjoin(live, live.c.name == n.c.name)
        .outerjoin(since, true())
        .outerjoin(singletons, singletons.c.name == n.c.name)
    )
    counted_cols: list[Any] = []
    if throughput:
        tp = stats_sql.throughput(n.c.name, end)
        joined = joined.outerjoin(tp, true())
        counted_cols = [tp.c[k] for k in stats_sql.THROUGHPUT_COLUMNS]
    stats = (
        select(
            n.c.name,
            live.c.blocked,
            live.c.deferred,
            live.c.ready,
            live.c.queued,
            live.c.active,
            live.c.failed,
            live.c.live,
            since.c.retained_from,
            since.c.retained_since,
            since.c.retained_recent,
            singletons.c["keys"],
            *counted_cols,
        )
        .select_from(joined)
        .where(got)
        .cte("stats")
    )
    # The queue rows are locked in name order only after the aggregate has run
    # (the count over stats), so no queue row stays locked through the job scan.
    rows = _locked_names(
        got & (select(func.count()).select_from(stats).scalar_subquery() >= 0),
        skip_locked=False,
    ).subquery("q")
    src = (
        select(
            rows.c.name,
            func.coalesce(stats.c.blocked, 0).label("blocked"),
            func.coalesce(stats.c.deferred, 0).label("deferred"),
            func.coalesce(stats.c.ready, 0).label("ready"),
            func.coalesce(stats.c.queued, 0).label("queued"),
            func.coalesce(stats.c.active, 0).label("active"),
            func.coalesce(stats.c.failed, 0).label("failed"),
            func.coalesce(stats.c.live, 0).label("live"),
            stats.c.retained_from,
            func.coalesce(stats.c.retained_since, 0).label("retained_since"),
            func.coalesce(stats.c.retained_recent, 0).label("retained_recent"),
            stats.c["keys"],
            *[stats.c[k] for k in (stats_sql.THROUGHPUT_COLUMNS if throughput else ())],
        )
        .select_from(rows.outerjoin(stats, stats.c.name == rows.c.name))
        .subquery("src")
    )

    # pg-boss's watermark: the jobs finished since retained_on are added only
    # if retained_on is still the one they were counted from (a maintenance
    # walk that moved it meanwhile has counted them already). A queue no walk
    # has counted yet (retained_count NULL) keeps the larger of its old total
    # and its live jobs.
    counted = QUEUE.c.retained_on.is_not_distinct_from(src.c.retained_from)
    retained = case(
        (counted, QUEUE.c.retained_count + src.c.retained_since), else_=QUEUE.c.retained_count
    )
    pin = cast(func.extract("epoch", func.clock_timestamp() - func.transaction_timestamp()), Float)
    # Newest first: prepend this pass's ready count and keep the first 60.
    prepended = func.array_prepend(
        cast(src.c.ready, Integer),
        func.coalesce(QUEUE.c.ready_history, literal_column("'{}'::integer[]")),
    )
    history = type_coerce(Grouping(prepended), ARRAY(Integer))[1:READY_HISTORY_SIZE]
    extra = stats_sql.throughput_values(src, end) if throughput else {}
    true_up = func.coalesce(src.c.true_up, false()) if throughput else false()
    stmt = (
        QUEUE.update()
        .where(QUEUE.c.name == src.c.name)
        .values(
            deferred_count=src.c.deferred,
            blocked_count=src.c.blocked,
            queued_count=src.c.queued,
            ready_count=src.c.ready,
            active_count=src.c.active,
            failed_count=src.c.failed,
            retained_count=retained,
            retained_on=case(
                (
                    counted & QUEUE.c.retained_on.is_not(None),
                    func.greatest(QUEUE.c.retained_on, end),
                ),
                else_=QUEUE.c.retained_on,
            ),
            total_count=case(
                (
                    QUEUE.c.retained_count.is_(None),
                    func.greatest(QUEUE.c.total_count, src.c.live),
                ),
                (counted, src.c.live + retained + src.c.retained_recent),
                else_=QUEUE.c.total_count,
            ),
            singletons_active=src.c["keys"],
            monitor_on=t,
            ready_history=history,
            **extra,
        )
        .returning(
            QUEUE.c.name,
            QUEUE.c.queued_count,
            QUEUE.c.warning_queued,
            pin.label("pin_seconds"),
            true_up.label("true_up"),
        )
    )
    # Without advisory locks every pass wins, and there is no claim to hand back:
    # the statement then changes the queue table once, as pg-boss's does there.
    return stmt.add_cte(lock, released) if advisory else stmt.add_cte(lock)


@functools.cache
def set_monitor_backoff() -> Update:
    """Defer the next aggregates when a pass pinned the horizon for ``:elapsed``
    seconds, more than a tenth of ``autovacuum_naptime`` (pg-boss's rule).

    The deadline only moves outward: ``GREATEST(existing, now + LEAST(GREATEST(2 *
    naptime, LEAST(elapsed, 600)), 3600))``. Returns a row only when it engaged:
    ``(naptime_seconds, backoff_seconds, backoff_until)``.
    """
    elapsed = bindparam("elapsed", type_=Float)
    naptime = literal_column(
        "EXTRACT(EPOCH FROM current_setting('autovacuum_naptime')::interval)::float8", Float
    )
    backoff = func.least(func.greatest(2 * naptime, func.least(elapsed, 600)), 3600)
    t = now()
    return (
        VERSION.update()
        .where(elapsed > 0.1 * naptime)
        .values(
            monitor_backoff_on=func.greatest(
                func.coalesce(VERSION.c.monitor_backoff_on, t),
                t + func.make_interval(0, 0, 0, 0, 0, 0, backoff),
            )
        )
        .returning(
            naptime.label("naptime_seconds"),
            cast(func.extract("epoch", VERSION.c.monitor_backoff_on - t), Float).label(
                "backoff_seconds"
            ),
            VERSION.c.monitor_backoff_on.label("backoff_until"),
        )
    )


def _walk_range(col: Any, name_col: Any, *, cursor: bool, edge: CTE) -> ColumnElement[bool]:
    after = bindparam("after", type_=Uuid())
    clauses = [name_col == bindparam("qname", type_=Text)]
    if cursor:
        clauses.append(col > after)
    clauses.append(
        col <= func.coalesce(select(edge.c.id).scalar_subquery(), cast(_MAX_UUID, Uuid()))
    )
    return and_(*clauses)


def _edge(col: Any, name_col: Any, *, cursor: bool) -> CTE:
    # The last key of this batch: batch-1 keys past the cursor, from the
    # primary key index alone. NULL when fewer are left: the walk's last batch.
    stmt = select(col.label("id")).where(name_col == bindparam("qname", type_=Text))
    if cursor:
        stmt = stmt.where(col > bindparam("after", type_=Uuid()))
    return stmt.order_by(col).offset(bindparam("batch", type_=Integer) - 1).limit(1).cte("edge")


@functools.cache
def delete_batch(*, cursor: bool) -> Select[Any]:
    """One batch of the retention walk of queue ``:qname``: the next ``:batch``
    primary keys after ``:after`` (``cursor``), deleting those whose time is up.

    Up means pg-boss's rule: finished ``deletion_seconds`` after ``completed_on``
    (never when ``deletion_seconds`` is 0: keep), or queued past ``keep_until``.
    Returns one row: ``walk_cursor`` (the batch's last key, NULL when the queue
    is done), ``deleted``, ``deleted_retained`` (deleted jobs that
    ``retained_count`` held) and ``retained`` (completed and cancelled jobs kept
    that finished by ``:retained_before``; the delete's snapshot still sees the
    deleted ones, so they are taken off).
    """
    t = now()
    edge = _edge(JOB.c.id, JOB.c.name, cursor=cursor)
    expired = or_(
        (JOB.c.deletion_seconds > 0) & (JOB.c.completed_on + seconds(JOB.c.deletion_seconds) < t),
        (JOB.c.state < state_text(JobState.ACTIVE)) & (JOB.c.keep_until < t),
    )
    removed = (
        delete(JOB)
        .where(_walk_range(JOB.c.id, JOB.c.name, cursor=cursor, edge=edge), expired)
        .returning(JOB.c.state, JOB.c.completed_on)
        .cte("removed")
    )
    before = bindparam("retained_before", type_=TIMESTAMP(timezone=True))
    held_on = (
        select(QUEUE.c.retained_on)
        .where(QUEUE.c.name == bindparam("qname", type_=Text))
        .scalar_subquery()
    )

    def count_removed(*where: ColumnElement[bool]) -> Any:
        return select(func.count()).select_from(removed).where(*where).scalar_subquery()

    k = JOB.alias("k")
    kept_edge = _walk_range(k.c.id, k.c.name, cursor=cursor, edge=edge)
    kept = (
        select(func.count())
        .where(kept_edge, _state_in(k.c.state, _RETAINED), k.c.completed_on <= before)
        .scalar_subquery()
    )
    return select(
        select(edge.c.id).scalar_subquery().label("walk_cursor"),
        cast(count_removed(), Integer).label("deleted"),
        cast(
            count_removed(_state_in(removed.c.state, _RETAINED), removed.c.completed_on <= held_on),
            Integer,
        ).label("deleted_retained"),
        cast(
            kept
            - count_removed(
                _state_in(removed.c.state, _RETAINED), removed.c.completed_on <= before
            ),
            Integer,
        ).label("retained"),
    )


@functools.cache
def set_retained_count() -> Update:
    """After a full retention walk of ``:qname``: ``retained_count = :retained``,
    ``retained_on = :retained_before``, and ``total_count`` = the live jobs as last
    counted + retained + the completed/cancelled jobs finished since then."""
    before = bindparam("retained_before", type_=TIMESTAMP(timezone=True))
    retained = bindparam("retained", type_=Integer)
    j = JOB.alias("j")
    recent = (
        select(cast(func.count(), Integer))
        .where(
            j.c.name == bindparam("qname", type_=Text),
            j.c.completed_on > before,
            j.c.completed_on <= now(),
            _state_in(j.c.state, _RETAINED),
        )
        .scalar_subquery()
    )
    return (
        QUEUE.update()
        .where(QUEUE.c.name == bindparam("qname", type_=Text))
        .values(
            retained_count=retained,
            retained_on=before,
            total_count=QUEUE.c.queued_count
            + QUEUE.c.active_count
            + QUEUE.c.failed_count
            + retained
            + recent,
        )
    )


@functools.cache
def reduce_retained_count() -> Update:
    """After an interrupted walk: take what it deleted off the counts
    (``:deleted_retained`` off a non-NULL ``retained_count``, ``:deleted`` off
    ``total_count``), never below zero."""
    return (
        QUEUE.update()
        .where(QUEUE.c.name == bindparam("qname", type_=Text))
        .values(
            retained_count=case(
                (QUEUE.c.retained_count.is_(None), null()),
                else_=func.greatest(
                    QUEUE.c.retained_count - bindparam("deleted_retained", type_=Integer), 0
                ),
            ),
            total_count=func.greatest(QUEUE.c.total_count - bindparam("deleted", type_=Integer), 0),
        )
    )


@functools.cache
def cleanup_dependencies(side: str, *, cursor: bool) -> Select[Any]:
    """One batch of the dependency cleanup of queue ``:qname`` on ``side``
    (``"child"`` or ``"parent"``): delete the ``job_dependency`` rows among the
    next ``:batch`` keys whose job no longer exists. Returns ``(walk_cursor, deleted)``."""
    if side not in ("child", "parent"):
        raise ValueError(side)
    d = JOB_DEPENDENCY
    key, name = d.c[f"{side}_id"], d.c[f"{side}_name"]
    edge = _edge(key, name, cursor=cursor)
    j = JOB.alias("j")
    # One primary-key probe per dependency row of the batch: the job is looked up
    # by (name, id) alone. Bounding the job side by the batch's key range too (as
    # Node's statement does) deletes the same rows, but on tables never analyzed
    # the planner takes the range for one row and scans all of it for every
    # dependency row (a nested loop over the whole batch: minutes per pass for
    # 10,000-child flows). OFFSET 0 keeps the NOT EXISTS a per-row subplan, so no
    # estimate can turn it into a join over the queue's jobs (bench/README.md,
    # "Flows").
    live: Select[Any] = (
        select(literal_column("1"))
        .select_from(j)
        .where(j.c.name == bindparam("qname", type_=Text), j.c.id == key)
        .offset(literal_column("0"))
    )
    removed = (
        delete(d)
        .where(_walk_range(key, name, cursor=cursor, edge=edge), ~exists(live))
        .returning(literal_column("1").label("one"))
        .cte("removed")
    )
    return select(
        select(edge.c.id).scalar_subquery().label("walk_cursor"),
        cast(select(func.count()).select_from(removed).scalar_subquery(), Integer).label("deleted"),
    )


# ------------------------------------------------------------------ many queues at once
#
# The maintenance of a chunk of queues in a few statements instead of a walk per queue
# (ops/duties46.py says how they are used): the keys each queue holds, capped at one
# batch; then, for queues that fit in one batch together, the retention batch of all of
# them, their retained counts, and the dependency cleanup, each one statement. A queue
# with a batch or more of keys is walked alone, as above. The rows each statement deletes
# and the counts it writes are those of the walk of one batch per queue.


def _capped(where: ColumnElement[bool], table: Any, outer: Any) -> Any:
    # How many rows match, counting at most :batch of them (a LIMIT under the count).
    rows: Select[Any] = select(literal_column("1")).select_from(table).where(where)
    first = rows.correlate(outer).limit(bindparam("batch", type_=Integer)).subquery("first")
    return select(cast(func.count(), Integer)).select_from(first).scalar_subquery()


@functools.cache
def maintenance_sizes() -> Select[Any]:
    """The pass's clock and, per queue of ``:names`` (in name order), the keys it holds in
    the job table and in ``job_dependency`` by child and by parent, each counted up to
    ``:batch``: ``(name, now, jobs, children, parents)``. A count below ``:batch`` means
    one batch covers the queue (its walk's first batch would find no edge); read from
    the primary-key indexes, at most ``:batch`` entries each."""
    n = _names()
    j = JOB.alias("j")
    d = JOB_DEPENDENCY
    return select(
        n.c.name,
        now().label("now"),
        _capped(j.c.name == n.c.name, j, n).label("jobs"),
        _capped(d.c.child_name == n.c.name, d, n).label("children"),
        _capped(d.c.parent_name == n.c.name, d, n).label("parents"),
    ).order_by(n.c.name)


def _expired(job: Any) -> ColumnElement[bool]:
    # pg-boss's retention rule (as delete_batch's).
    t = now()
    return or_(
        (job.c.deletion_seconds > 0) & (job.c.completed_on + seconds(job.c.deletion_seconds) < t),
        (job.c.state < state_text(JobState.ACTIVE)) & (job.c.keep_until < t),
    )


@functools.cache
def delete_queues() -> Select[Any]:
    """The whole retention walk of every queue of ``:names`` in one statement, for queues
    that hold fewer keys than a batch together (:func:`maintenance_sizes`): what
    :func:`delete_batch` does for the last batch of one queue, for each of them.

    Returns one row per queue, in name order: ``(name, deleted, deleted_retained,
    retained)`` as :func:`delete_batch` counts them (``retained``: completed and
    cancelled jobs kept that finished by ``:retained_before``).
    """
    removed = (
        delete(JOB)
        .where(JOB.c.name == any_name(), _expired(JOB))
        .returning(JOB.c.name, JOB.c.state, JOB.c.completed_on)
        .cte("removed")
    )
    before = bindparam("retained_before", type_=TIMESTAMP(timezone=True))
    q = QUEUE.alias("q")
    retained = _state_in(removed.c.state, _RETAINED)
    gone = (
        select(
            removed.c.name,
            func.count().label("deleted"),
            func.count()
            .filter(retained & (removed.c.completed_on <= q.c.retained_on))
            .label("held"),
            func.count().filter(retained & (removed.c.completed_on <= before)).label("before"),
        )
        .select_from(removed.outerjoin(q, q.c.name == removed.c.name))
        .group_by(removed.c.name)
        .subquery("gone")
    )
    k = JOB.alias("k")
    # The statement's snapshot still sees the rows it deletes: they are taken off below.
    kept = (
        select(k.c.name, func.count().label("kept"))
        .where(
            k.c.name == any_name(),
            _state_in(k.c.state, _RETAINED),
            k.c.completed_on <= before,
        )
        .group_by(k.c.name)
        .subquery("kept")
    )
    n = _names()
    zero: ColumnElement[Any] = literal_column("0")
    return (
        select(
            n.c.name,
            cast(func.coalesce(gone.c.deleted, zero), Integer).label("deleted"),
            cast(func.coalesce(gone.c.held, zero), Integer).label("deleted_retained"),
            cast(
                func.coalesce(kept.c.kept, zero) - func.coalesce(gone.c.before, zero), Integer
            ).label("retained"),
        )
        .select_from(
            n.outerjoin(gone, gone.c.name == n.c.name).outerjoin(kept, kept.c.name == n.c.name)
        )
        .order_by(n.c.name)
    )


@functools.cache
def set_retained_counts() -> Update:
    """:func:`set_retained_count` for many queues at once: queue ``:names[i]`` gets
    ``retained_count = :retained[i]``; all get ``retained_on = :retained_before``. The
    queue rows are locked in name order first, as every multi-row writer of them does."""
    before = bindparam("retained_before", type_=TIMESTAMP(timezone=True))
    given = (
        func.unnest(
            bindparam("names", type_=ARRAY(Text)), bindparam("retained", type_=ARRAY(Integer))
        )
        .table_valued("name", "retained")
        .render_derived(name="v")
    )
    rows = _locked_names(skip_locked=False).subquery("l")
    j = JOB.alias("j")
    recent = (
        select(cast(func.count(), Integer))
        .where(
            j.c.name == QUEUE.c.name,
            j.c.completed_on > before,
            j.c.completed_on <= now(),
            _state_in(j.c.state, _RETAINED),
        )
        .scalar_subquery()
    )
    counted = type_coerce(given.c.retained, Integer)
    return (
        QUEUE.update()
        .where(QUEUE.c.name == rows.c.name, given.c.name == rows.c.name)
        .values(
            retained_count=counted,
            retained_on=before,
            total_count=QUEUE.c.queued_count
            + QUEUE.c.active_count
            + QUEUE.c.failed_count
            + counted
            + recent,
        )
    )


@functools.cache
def cleanup_queues(side: str) -> Select[Any]:
    """:func:`cleanup_dependencies` for every queue of ``:names`` at once (queues that
    hold fewer dependency keys than a batch together): the ``job_dependency`` rows whose
    job on ``side`` is gone. Returns ``deleted``."""
    if side not in ("child", "parent"):
        raise ValueError(side)
    d = JOB_DEPENDENCY
    key, name = d.c[f"{side}_id"], d.c[f"{side}_name"]
    j = JOB.alias("j")
    # A primary-key probe per row, kept a per-row subplan (see cleanup_dependencies).
    live: Select[Any] = (
        select(literal_column("1"))
        .select_from(j)
        .where(j.c.name == name, j.c.id == key)
        .offset(literal_column("0"))
    )
    removed = (
        delete(d)
        .where(name == any_name(), ~exists(live))
        .returning(literal_column("1").label("one"))
        .cte("removed")
    )
    return select(
        cast(select(func.count()).select_from(removed).scalar_subquery(), Integer).label("deleted")
    )


@functools.cache
def database_time() -> Select[Any]:
    """The pass's clock, ``COALESCE(:now, job_now())``."""
    return select(now().label("now"))


@functools.cache
def insert_warning() -> Any:
    """A row in ``warning`` (``:type``, ``:message``, ``:data`` as JSON text)."""
    return insert(WARNING).values(
        type=bindparam("type", type_=Text),
        message=bindparam("message", type_=Text),
        data=cast(bindparam("data", type_=Text), JSONB),
        created_on=now(),
    )


@functools.cache
def delete_old_warnings() -> Delete:
    """Warnings older than ``:days`` days (pg-boss's warning retention)."""
    return delete(WARNING).where(
        WARNING.c.created_on < now() - seconds(bindparam("days", type_=Integer) * 86_400)
    )


@functools.cache
def delete_old_instances() -> Delete:
    """Registered instances whose heartbeat has not moved for 7 days."""
    return delete(INSTANCE).where(
        INSTANCE.c.heartbeat_on
        < now() - literal_column(f"interval '{INSTANCE_RETENTION_DAYS} days'")
    )


@functools.cache
def trim_dead_instances() -> Delete:
    """Keep only the newest 1,000 dead instance rows (stopped, or quiet for three
    heartbeats); rows another session holds are skipped, not waited for."""
    i = INSTANCE.alias("i")
    dead = or_(
        i.c.stopped_on.is_not(None),
        # In bigint: heartbeat_seconds near the top of an integer (a row another
        # client wrote) does not overflow the product.
        i.c.heartbeat_on
        < now() - seconds(cast(i.c.heartbeat_seconds, BigInteger) * INSTANCE_QUIET_BEATS),
    )
    ranked = (
        select(
            i.c.id,
            func.row_number().over(order_by=(i.c.started_on.desc(), i.c.id.desc())).label("n"),
        )
        .where(dead)
        .subquery("ranked")
    )
    victims = (
        select(INSTANCE.c.id)
        .where(INSTANCE.c.id.in_(select(ranked.c.id).where(ranked.c.n > INSTANCE_DEAD_KEPT)))
        .with_for_update(skip_locked=True)
    )
    return delete(INSTANCE).where(INSTANCE.c.id.in_(victims))


__all__ = [
    "DELTA_LAG_SECONDS",
    "READY_HISTORY_SIZE",
    "WALK_BATCH",
    "cache_stats",
    "claim_maintain",
    "claim_monitor",
    "cleanup_dependencies",
    "cleanup_queues",
    "database_time",
    "delete_batch",
    "delete_old_instances",
    "delete_old_warnings",
    "delete_queues",
    "insert_warning",
    "maintenance_sizes",
    "reduce_retained_count",
    "release_maintain",
    "set_monitor_backoff",
    "set_retained_count",
    "set_retained_counts",
    "trim_dead_instances",
]
