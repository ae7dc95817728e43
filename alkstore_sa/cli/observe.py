"""``alkstore warnings``, ``alkstore instances``, ``alkstore history`` (schema 46).

What supervision persisted and who is connected: the ``warning`` table, the
``instance`` registry and a queue's ``queue_stats`` history, written by our
workers and supervisors as by Node pg-boss 12.38 (the "Observe queues, warnings and workers" page).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
from typing import Any

from ..errors import shown
from ._common import BadInput, emit, leaf
from ._service import in_transaction

WARNING_COLUMNS = ("created_on", "type", "message")
INSTANCE_COLUMNS = (
    "id",
    "name",
    "host",
    "pid",
    "version",
    "live",
    "supervise",
    "workers",
    "heartbeat_on",
    "stopped_on",
)
HISTORY_COLUMNS = (
    "captured_on",
    "queued_count",
    "active_count",
    "deferred_count",
    "failed_count",
    "total_count",
    "created_delta",
    "completed_delta",
    "failed_delta",
    "delta_seconds",
)

_SPAN = re.compile(r"^(\d+)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def register(sub: Any) -> None:
    warnings = leaf(sub, "warnings", "persisted warnings, newest first (schema 46)")
    warnings.add_argument("--type", help="only this type (queue_backlog, index_bloat, ...)")
    warnings.add_argument("--since", metavar="WHEN", help="only newer: 30m, 24h, 7d or ISO-8601")
    warnings.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    warnings.add_argument("--offset", type=int, default=0, help="skip this many first")
    warnings.set_defaults(handler=_warnings)

    instances = leaf(sub, "instances", "Node and Python clients in the instance registry")
    instances.add_argument("--live", action="store_true", help="only live ones")
    instances.add_argument("--limit", type=int, default=1000, help="at most this many")
    instances.set_defaults(handler=_instances)

    history = leaf(sub, "history", "a queue's recorded statistics over time (schema 46)")
    history.add_argument("queue")
    history.add_argument("--since", metavar="WHEN", help="from: 30m, 24h, 7d or ISO-8601")
    history.add_argument("--until", metavar="WHEN", help="to: 30m, 24h, 7d (ago) or ISO-8601")
    history.add_argument("--bucket-seconds", type=int, help="one row per bucket this wide")
    history.add_argument("--max-data-points", type=int, help="buckets sized to fit this many")
    history.add_argument("--aggregate", choices=("max", "min", "avg"), default="max")
    history.add_argument("--limit", type=int, default=100, help="at most this many (default 100)")
    history.set_defaults(handler=_history)


def when(option: str, text: str | None) -> dt.datetime | None:
    """``30m``/``24h``/``7d`` (that long ago) or an ISO-8601 time with an offset."""
    if text is None:
        return None
    span = _SPAN.match(text.strip())
    if span:
        ago = int(span.group(1)) * _UNIT[span.group(2)]
        return dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ago)
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise BadInput(
            f"{option}: {shown(text)} is neither 30m/24h/7d nor an ISO-8601 time with offset"
        )
    return value


def _warnings(args: argparse.Namespace) -> int:
    since = when("--since", args.since)
    rows = in_transaction(
        args,
        lambda q: q.get_warnings(args.type, since=since, limit=args.limit, offset=args.offset),
    )
    emit(args, rows, columns=WARNING_COLUMNS)
    return 0


def _instances(args: argparse.Namespace) -> int:
    rows = in_transaction(args, lambda q: q.get_instances(limit=args.limit))
    if args.live:
        rows = [r for r in rows if r.live]
    if args.json:
        emit(args, rows)
    else:
        # One cell per instance for its workers: the queues it works.
        table = [
            {
                **{c: getattr(r, c) for c in INSTANCE_COLUMNS},
                "workers": ",".join(str(w.get("queue")) for w in r.workers) or None,
            }
            for r in rows
        ]
        emit(args, table, columns=INSTANCE_COLUMNS)
    return 0


def _history(args: argparse.Namespace) -> int:
    since, until = when("--since", args.since), when("--until", args.until)
    rows = in_transaction(
        args,
        lambda q: q.get_queue_stats_history(
            args.queue,
            from_=since,
            to=until,
            limit=args.limit,
            bucket_seconds=args.bucket_seconds,
            max_data_points=args.max_data_points,
            aggregate=args.aggregate,
        ),
    )
    emit(args, rows, columns=HISTORY_COLUMNS)
    return 0
