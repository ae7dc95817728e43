"""Observability at schema 46 (the "Observe queues, warnings and workers" page): queue-stats history
read back, optionally in time buckets; persisted warnings; the instance registry.

Each read refuses a schema below 46 with :class:`~alkstore_sa.SchemaFeatureError`;
the registry's writes (a worker registering, beating, stopping) are no-ops there.

Bucketing follows pg-boss 12.38's ``getQueueStats`` with ``bucketSeconds`` or
``maxDataPoints``: buckets are aligned to the Unix epoch; the gauges of the rows
captured in a bucket are collapsed by ``aggregate`` (max, min or rounded mean);
the counters are bucketed by their own ``delta_on`` (the end of the window they
count) and summed, as are the histograms slot by slot; a bucket holding counters
but no capture is folded into the newest bucket with a capture at or before it
(or the first one, if none precedes it), so every bucket returned has gauges
behind it. Newest first, at most ``limit`` buckets (``max_data_points`` at most
in auto mode).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidOptionsError, shown
from ..names import queue_ref
from ..options import check_int, check_text, in_utc
from ..records import (
    Instance,
    PersistedWarning,
    QueueStatsPercentile,
    QueueStatsSnapshot,
    read_record,
)
from ..sql.v46 import observe as sql
from ..sql.v46 import supervision as sup_sql
from ..sql.v46.stats import LATENCY_SLOTS
from ._core import Call, Context, Op
from .queues import require_queue

LIMIT_MAX = 100_000
"""The most rows a history, warning or instance read returns (pg-boss's bound)."""

LATENCY_MIN_SECONDS = 0.01
"""The upper edge of a histogram's first slot."""

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_AGGREGATES = ("max", "min", "avg")
_GAUGES = (
    "deferred_count",
    "queued_count",
    "ready_count",
    "active_count",
    "failed_count",
    "total_count",
)


# ------------------------------------------------------------------ percentiles


def percentile(bins: Sequence[int] | None, p: float) -> float | None:
    """Seconds under which ``p`` percent (1 to 100) of a histogram's jobs fall,
    interpolated within their slot; ``None`` for no or an empty histogram.

    A percentile in the first slot is only known to be under 10 ms, and one in
    the last only past its lower edge: those edges are returned. A histogram
    another client wrote past the 48 slots counts the slots from the 48th on in
    the last, and a negative count as 0: the answer is always a finite number.
    """
    if not bins:
        return None
    counts = [max(n, 0) for n in bins]
    if len(counts) > LATENCY_SLOTS:
        counts[LATENCY_SLOTS - 1 :] = [sum(counts[LATENCY_SLOTS - 1 :])]
    n = sum(counts)
    if n == 0:
        return None
    target = p / 100 * n
    k, seen = 0, 0
    while k < len(counts) - 1 and not (counts[k] > 0 and seen + counts[k] >= target):
        seen += counts[k]
        k += 1
    if k == 0:
        return LATENCY_MIN_SECONDS
    low = LATENCY_MIN_SECONDS * math.sqrt(2) ** (k - 1)
    if k == len(counts) - 1:
        return low
    return float(low * math.sqrt(2) ** ((target - seen) / counts[k]))


def _percentiles(value: object) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | bytes) or not isinstance(value, Sequence) or not value:
        raise InvalidOptionsError(
            "percentiles", "must be a non-empty list of percents from 1 to 100, such as [50, 95]"
        )
    seen: list[float] = []
    for p in value:
        if isinstance(p, bool) or not isinstance(p, int | float) or not 1 <= p <= 100:
            raise InvalidOptionsError(
                "percentiles", f"{shown(p)} is not a percent from 1 to 100, such as 95"
            )
        if p not in seen:
            seen.append(p)
    return tuple(seen)


# ------------------------------------------------------------------ history


def _time(option: str, value: object) -> dt.datetime | None:
    return None if value is None else in_utc(option, value)


def _bins(value: Any) -> tuple[tuple[int, ...] | None, str | None]:
    """A histogram column as stored, and what is wrong with it (``None``: nothing).

    A slot stored as NULL (no job landed there) reads as 0. An int[] column may hold
    what no writer of pg-boss's writes: more slots, negative counts (kept as stored,
    see :func:`percentile`), more dimensions (unreadable: ``None``)."""
    if value is None:
        return None, None
    if any(isinstance(n, list) for n in value):
        return None, "is an array of more than one dimension, not a histogram"
    out = tuple(0 if n is None else int(n) for n in value)
    if len(out) > LATENCY_SLOTS:
        return out, (
            f"holds {len(out)} slots, past the {LATENCY_SLOTS} of a histogram: its "
            f"percentiles count the slots from the {LATENCY_SLOTS}th on in the last"
        )
    if any(n < 0 for n in out):
        return out, "holds negative counts: its percentiles count them as 0"
    return out, None


def _read_row(row: Mapping[Any, Any]) -> dict[str, Any]:
    """A row of ``stats_history`` (through ``readable_columns``) as values that never
    raise downstream: times in Python's range, histograms checked (see :func:`_bins`);
    what could not be read as stored is in ``unreadable``."""
    values, problems = read_record(row, ())
    for name in ("wait_bins", "run_bins"):
        values[name], problem = _bins(values[name])
        if problem is not None:
            problems[name] = problem
    values["unreadable"] = problems
    return values


def _snapshot(
    name: str, row: Mapping[str, Any], ps: tuple[float, ...] | None
) -> QueueStatsSnapshot:
    """A snapshot of ``row`` (a row of :func:`_read_row`, or a merged bucket)."""
    wait, run = row["wait_bins"], row["run_bins"]
    return QueueStatsSnapshot(
        name=name,
        **{g: int(row[g] or 0) for g in _GAUGES},
        created_delta=row["created_delta"],
        completed_delta=row["completed_delta"],
        failed_delta=row["failed_delta"],
        delta_seconds=row["delta_seconds"],
        delta_on=row["delta_on"],
        wait_bins=wait,
        run_bins=run,
        ready_oldest_seconds=row["ready_oldest_seconds"],
        captured_on=row["captured_on"],
        percentiles=None
        if ps is None
        else tuple(QueueStatsPercentile(p, percentile(wait, p), percentile(run, p)) for p in ps),
        unreadable=dict(row["unreadable"]),
    )


def _bucket(at: dt.datetime, width: int) -> dt.datetime:
    since = (at - _EPOCH).total_seconds()
    try:
        return _EPOCH + dt.timedelta(seconds=math.floor(since / width) * width)
    except OverflowError:
        # A start before year 1 (a time near Python's edge, a huge width): the time
        # itself stands in for its bucket's start.
        return at


def _collapse(values: list[int], aggregate: str) -> int:
    if aggregate == "max":
        return max(values)
    if aggregate == "min":
        return min(values)
    # PostgreSQL's round(): halves away from zero.
    mean = sum(values) / len(values)
    return math.floor(mean + 0.5)


def _sum(values: list[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _slot_sums(histograms: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """The histograms (of :func:`_bins`) summed slot by slot."""
    out = [0] * max((len(h) for h in histograms), default=0)
    for h in histograms:
        for i, n in enumerate(h):
            out[i] += n
    return tuple(out)


@dataclass(slots=True)
class _Bucket:
    gauges: list[Mapping[str, Any]] = field(default_factory=list)
    counters: list[Mapping[str, Any]] = field(default_factory=list)


def _width(
    extent: Any,
    lo: dt.datetime | None,
    hi: dt.datetime | None,
    max_data_points: int,
) -> int:
    # Auto: the span of the captures, narrowed by from/to, over the points wanted.
    first, last = extent.first, extent.last
    if first is None or last is None:
        return 1
    lo = first if lo is None else max(lo, first)
    hi = last if hi is None else min(hi, last)
    span = (hi - lo).total_seconds()
    return max(1, math.ceil(span / max(max_data_points, 1)))


def _bucketed(
    name: str,
    rows: Sequence[Mapping[str, Any]],
    lo: dt.datetime | None,
    hi: dt.datetime | None,
    width: int,
    aggregate: str,
    ps: tuple[float, ...] | None,
) -> list[QueueStatsSnapshot]:
    def inside(at: dt.datetime) -> bool:
        return (lo is None or at >= lo) and (hi is None or at <= hi)

    buckets: dict[dt.datetime, _Bucket] = {}
    for row in rows:
        if inside(row["captured_on"]):
            buckets.setdefault(_bucket(row["captured_on"], width), _Bucket()).gauges.append(row)
    with_gauges = sorted(buckets)
    if not with_gauges:
        return []
    for row in rows:
        on = row["delta_on"]
        if on is None or not inside(on):
            continue
        key = _bucket(on, width)
        if key not in buckets:
            before = [b for b in with_gauges if b <= key]
            key = before[-1] if before else with_gauges[0]
        buckets[key].counters.append(row)
    out = []
    for key in sorted(buckets, reverse=True):
        b = buckets[key]
        measured = [r for r in b.counters if r["wait_bins"] is not None]
        wait = run = None
        if measured:
            wait = _slot_sums([r["wait_bins"] for r in measured])
            run = _slot_sums([r["run_bins"] or () for r in b.counters])
        deltas = [r["delta_on"] for r in b.counters]
        oldest = [r["ready_oldest_seconds"] for r in b.counters]
        problems: dict[str, str] = {}
        for r in (*b.gauges, *b.counters):
            for key_, why in r["unreadable"].items():
                problems.setdefault(key_, why)
        merged: dict[str, Any] = {
            **{g: _collapse([int(r[g]) for r in b.gauges], aggregate) for g in _GAUGES},
            "created_delta": _sum([r["created_delta"] for r in b.counters]),
            "completed_delta": _sum([r["completed_delta"] for r in b.counters]),
            "failed_delta": _sum([r["failed_delta"] for r in b.counters]),
            "delta_seconds": _sum([r["delta_seconds"] for r in b.counters]),
            "delta_on": max(deltas) if deltas else None,
            "wait_bins": wait,
            "run_bins": run,
            "ready_oldest_seconds": max((o for o in oldest if o is not None), default=None),
            "captured_on": key,
            "unreadable": problems,
        }
        out.append(_snapshot(name, merged, ps))
    return out


def get_queue_stats_history(
    ctx: Context, name: str, options: Mapping[str, object]
) -> Op[list[QueueStatsSnapshot]]:
    """The queue's recorded snapshots (or buckets), newest first (see the module);
    ``options`` as ``QueueService.get_queue_stats_history`` takes them."""
    queue_ref(name)
    from_, to, limit = options["from_"], options["to"], options["limit"]
    bucket_seconds, max_data_points = options["bucket_seconds"], options["max_data_points"]
    aggregate, percentiles = options["aggregate"], options["percentiles"]
    lo, hi = _time("from_", from_), _time("to", to)
    check_int("limit", limit, minimum=1, maximum=LIMIT_MAX)
    assert isinstance(limit, int)
    ps = _percentiles(percentiles)
    bucketed = bucket_seconds is not None or max_data_points is not None
    if bucketed:
        if aggregate not in _AGGREGATES:
            raise InvalidOptionsError(
                "aggregate", f"must be 'max', 'min' or 'avg', not {shown(aggregate)}"
            )
        if bucket_seconds is not None:
            check_int("bucket_seconds", bucket_seconds, minimum=1)
        else:
            check_int("max_data_points", max_data_points, minimum=1)
    ctx.require("queue-stats history")
    yield from require_queue(ctx, name)
    params = {"qname": name, "from_on": lo, "to_on": hi, "limit": limit}
    result = yield Call(sql.stats_history(for_buckets=bucketed), params)
    rows = [_read_row(r) for r in result.mappings().all()]
    if not bucketed:
        return [_snapshot(name, r, ps) for r in rows]
    assert isinstance(bucket_seconds, int | None) and isinstance(max_data_points, int | None)
    if bucket_seconds is not None:
        width, cap = bucket_seconds, limit
    else:
        assert max_data_points is not None
        extent = (yield Call(sql.stats_extent(), {"qname": name})).one()
        width, cap = _width(extent, lo, hi, max_data_points), min(limit, max_data_points)
    assert isinstance(aggregate, str)
    return _bucketed(name, rows, lo, hi, width, aggregate, ps)[:cap]


# ------------------------------------------------------------------ completions

COMPLETION_QUEUES_MAX = 1000
COMPLETION_BUCKETS_MAX = 1000


def count_completions(
    ctx: Context, names: object, since: object, bucket_seconds: object
) -> Op[dict[str, list[int]]]:
    """Completed jobs per queue of ``names`` and per bucket since ``since``, oldest
    bucket first, read from the job table (``QueueService.count_completions``)."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise InvalidOptionsError("names", f"must be a list of queue names, not {shown(names)}")
    wanted = [queue_ref(n, "names") for n in names]
    if len(wanted) > COMPLETION_QUEUES_MAX:
        raise InvalidOptionsError("names", f"at most {COMPLETION_QUEUES_MAX} queues at a time")
    start = in_utc("since", since)
    check_int("bucket_seconds", bucket_seconds, minimum=1, maximum=86_400)
    assert isinstance(bucket_seconds, int)
    span = (dt.datetime.now(dt.UTC) - start).total_seconds()
    if span <= 0:
        raise InvalidOptionsError("since", f"must be in the past, not {shown(since)}")
    count = math.ceil(span / bucket_seconds)
    if count > 1 and span - (count - 1) * bucket_seconds < 1.0:
        count -= 1  # a last bucket of under a second (the call's own delay) joins the one before
    if count > COMPLETION_BUCKETS_MAX:
        raise InvalidOptionsError(
            "bucket_seconds",
            f"{bucket_seconds} s since {start.isoformat()} makes {count} buckets; "
            f"at most {COMPLETION_BUCKETS_MAX}: widen them",
        )
    ctx.require("completion counts")
    out = {name: [0] * count for name in wanted}
    if not wanted:
        return out
    params = {"names": wanted, "since": start, "bucket": bucket_seconds}
    for row in (yield Call(sql.completions(), params)).all():
        if row.bucket >= 0:
            out[row.name][min(row.bucket, count - 1)] += int(row.n)
    return out


# ------------------------------------------------------------------ warnings


def get_warnings(
    ctx: Context, type: object, since: object, limit: object, offset: object
) -> Op[list[PersistedWarning]]:
    """Persisted warnings, newest first."""
    if type is not None and (not isinstance(type, str) or not type):
        raise InvalidOptionsError(
            "type", f"must be a warning type such as 'queue_backlog', not {shown(type)}"
        )
    if type is not None:
        check_text("type", type)
    when = _time("since", since)
    check_int("limit", limit, minimum=1, maximum=LIMIT_MAX)
    check_int("offset", offset, minimum=0)
    ctx.require("the warning table")
    params = {"type": type, "since": when, "limit": limit, "offset": offset}
    rows = (yield Call(sql.get_warnings(), params)).mappings().all()
    return [PersistedWarning.from_row(r) for r in rows]


def persist_warning(ctx: Context, kind: str, message: str, data: object) -> Op[None]:
    """Write a warning row (Node's ``persistWarnings``); nothing below 46."""
    if ctx.has("the warning table"):
        params = {"type": kind, "message": message, "data": json.dumps(data, default=str)}
        yield Call(sup_sql.insert_warning(), params)


# ------------------------------------------------------------------ instances


def get_instances(ctx: Context, limit: object, after: object) -> Op[list[Instance]]:
    """Registered instances, oldest start first; ``after`` continues a page."""
    check_int("limit", limit, minimum=1, maximum=LIMIT_MAX)
    ref: uuid.UUID | None = None
    if after is not None:
        try:
            ref = after if isinstance(after, uuid.UUID) else uuid.UUID(str(after))
        except ValueError:
            raise InvalidOptionsError(
                "after", f"must be an instance id, not {shown(after)}"
            ) from None
    ctx.require("the instance registry")
    params: dict[str, Any] = {"limit": limit}
    if ref is not None:
        params["after"] = ref
    rows = (yield Call(sql.get_instances(after=ref is not None), params)).mappings().all()
    if ref is not None and not rows:
        found = (yield Call(sql.instance_exists(), {"id": ref})).first()
        if found is None:
            raise InvalidOptionsError("after", f"instance {ref} is no longer registered")
    return [Instance.from_row(r) for r in rows]


def _count_crashes(values: Mapping[str, Any], process_start: dt.datetime) -> Call:
    who = {f"instance_{k}": values[k] for k in ("id", "name", "host", "pid")}
    return Call(sql.count_crash_restarts(), {**who, "process_start": process_start})


def register_instance(
    ctx: Context, values: Mapping[str, Any], process_start: dt.datetime
) -> Op[dt.datetime | None]:
    """Register (or re-register) an instance; its ``started_on``, ``None`` below 46.
    Its crash restarts are counted, then the same name's (host's, unnamed) older
    dead rows past the newest 20 are pruned."""
    if not ctx.has("the instance registry"):
        return None
    started: dt.datetime = (yield Call(sql.register_instance(), dict(values))).scalar_one()
    yield _count_crashes(values, process_start)
    who = {"id": values["id"], "name": values["name"], "host": values["host"]}
    yield Call(sql.prune_instance_lives(), who)
    return started


def heartbeat_instance(
    ctx: Context,
    values: Mapping[str, Any],
    started_on: dt.datetime | None,
    process_start: dt.datetime,
) -> Op[dt.datetime | None]:
    """Refresh an instance's row (registering it if it was never registered, e.g.
    a schema upgraded to 46 since the worker started); its ``started_on``. The crash
    restarts are counted again: an earlier life that still read live at the last
    count may have gone quiet since (pg-boss recounts when it would)."""
    if not ctx.has("the instance registry"):
        return None
    if started_on is None:
        return (yield from register_instance(ctx, values, process_start))
    yield Call(sql.heartbeat_instance(), {**values, "started_on": started_on})
    yield _count_crashes(values, process_start)
    return started_on


def stop_instance(ctx: Context, instance_id: uuid.UUID) -> Op[None]:
    """Mark an instance stopped (nothing below 46)."""
    if ctx.has("the instance registry"):
        yield Call(sql.stop_instance(), {"instance_id": instance_id})


__all__ = [
    "COMPLETION_BUCKETS_MAX",
    "COMPLETION_QUEUES_MAX",
    "LIMIT_MAX",
    "count_completions",
    "get_instances",
    "get_queue_stats_history",
    "get_warnings",
    "heartbeat_instance",
    "percentile",
    "persist_warning",
    "register_instance",
    "stop_instance",
]
