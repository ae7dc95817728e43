"""``alkstore queue create|ensure|update|list|show|stats|blocked-keys|subscriptions|delete``."""

from __future__ import annotations

import argparse
import datetime as dt
from dataclasses import asdict, replace
from typing import Any

from sqlalchemy import func, select

from .._humanize import duration, queue_note, queue_settings
from ..errors import QueueNotFoundError
from ..records import JobCounts, QueueInfo, QueueStats, ScheduleInfo
from ..service import QueueService
from ._common import BadInput, emit, leaf, log_to_stderr
from ._options import QUEUE_CREATE, QUEUE_UPDATE, add_options, given_options
from ._service import in_transaction

LIST_COLUMNS = (
    "name",
    "policy",
    "partition",
    "retry_limit",
    "dead_letter",
    "queued_count",
    "active_count",
    "total_count",
    "counted",
    "note",
)
"""The table of ``queue list``: ``counted`` says when the counts were counted (how
long ago the supervisor cached them, or ``now`` with ``--live``)."""

CACHED_NOTE = (
    "counts: cached counters, refreshed by a running supervisor (every 60 s by default), "
    "COUNTED says when; `alkstore queue list --live` counts the job table now"
)
LIVE_NOTE = "counts: live, counted in the job table now"

STATS_COLUMNS = ("name", "deferred_count", "queued_count", "active_count", "total_count")


def register(sub: Any) -> None:
    queue = sub.add_parser("queue", help="create, inspect and delete queues")
    actions = queue.add_subparsers(dest="action", metavar="ACTION", required=True)

    create = leaf(
        actions,
        "create",
        "create a queue (an existing one is left unchanged, with a warning if its options differ)",
    )
    create.add_argument("name")
    add_options(create, QUEUE_CREATE)
    create.add_argument(
        "--fail-if-exists", action="store_true", help="exit 1 if the queue already exists"
    )
    create.set_defaults(handler=_create)

    ensure = leaf(
        actions, "ensure", "create a queue, or change the options given to match, and print it"
    )
    ensure.add_argument("name")
    add_options(ensure, QUEUE_CREATE)
    ensure.set_defaults(handler=_ensure)

    update = leaf(actions, "update", "change a queue's options (not policy or partition)")
    update.add_argument("name")
    add_options(update, QUEUE_UPDATE)
    update.set_defaults(handler=_update)

    listing = leaf(
        actions,
        "list",
        "all queues with their job counts: the cached counters (and when they were "
        "counted), or live ones with --live",
    )
    listing.add_argument(
        "--live",
        action="store_true",
        help="count each queue's jobs in the job table now (one count per queue) instead "
        "of showing the counters the supervisor caches",
    )
    listing.set_defaults(handler=_list)

    show = leaf(actions, "show", "one queue: its settings in plain units, job counts, schedules")
    show.add_argument("name")
    show.set_defaults(handler=_show)

    stats = leaf(actions, "stats", "live job counts of one queue or of all")
    stats.add_argument("name", nargs="?")
    stats.set_defaults(handler=_stats)

    blocked = leaf(
        actions,
        "blocked-keys",
        "keys of a key_strict_fifo queue held by a failed job (schema 46)",
    )
    blocked.add_argument("name")
    blocked.add_argument(
        "--limit", type=int, default=1000, help="at most this many (default 1000, at most 100000)"
    )
    blocked.add_argument("--after", metavar="KEY", help="only keys after this one (next page)")
    blocked.set_defaults(handler=_blocked_keys)

    subscriptions = leaf(
        actions, "subscriptions", "events queues subscribe to (all, or of one queue)"
    )
    subscriptions.add_argument("name", nargs="?")
    subscriptions.add_argument("--event", help="only the subscriptions to this event")
    subscriptions.set_defaults(handler=_subscriptions)

    delete = leaf(actions, "delete", "delete a queue with its jobs and schedules")
    delete.add_argument("name")
    delete.set_defaults(handler=_delete)


def _create(args: argparse.Namespace) -> int:
    log_to_stderr()  # options an existing queue does not have: one warning line
    options = given_options(args, QUEUE_CREATE)
    info = in_transaction(
        args, lambda q: q.create_queue(args.name, exist_ok=not args.fail_if_exists, **options)
    )
    emit(args, info)
    return 0


def _ensure(args: argparse.Namespace) -> int:
    options = given_options(args, QUEUE_CREATE)
    emit(args, in_transaction(args, lambda q: q.ensure_queue(args.name, **options)))
    return 0


def _update(args: argparse.Namespace) -> int:
    options = given_options(args, QUEUE_UPDATE)
    if not options:
        raise BadInput("nothing to update: give at least one option")
    emit(args, in_transaction(args, lambda q: q.update_queue(args.name, **options)))
    return 0


def _list(args: argparse.Namespace) -> int:
    def read(q: QueueService) -> tuple[list[QueueInfo], dt.datetime]:
        queues = q.get_queues()
        if args.live:
            queues = [_with_live_counts(info, q.get_queue_stats(info.name)) for info in queues]
        # The database's clock: the cached counters were stamped by it.
        now = q.session.execute(select(func.now())).scalar_one()
        return queues, now

    queues, now = in_transaction(args, read)
    if args.json:
        emit(args, queues)
        return 0
    rows = [
        {
            **asdict(info),
            "counted": "now" if args.live else _counted(info.monitor_on, now),
            "note": queue_note(info.name),
        }
        for info in queues
    ]
    emit(args, rows, columns=LIST_COLUMNS)
    if queues:
        print()
        print(LIVE_NOTE if args.live else CACHED_NOTE)
    return 0


def _with_live_counts(info: QueueInfo, live: QueueStats) -> QueueInfo:
    """``info`` with the counts of ``live`` in place of the cached counters."""
    return replace(
        info,
        deferred_count=live.deferred_count,
        queued_count=live.queued_count,
        active_count=live.active_count,
        total_count=live.total_count,
        singletons_active=live.singletons_active,
    )


def _counted(monitor_on: dt.datetime | None, now: dt.datetime) -> str:
    """How long ago the supervisor cached a queue's counters, or ``never``."""
    if monitor_on is None:
        return "never"
    return f"{duration(max(0.0, (now - monitor_on).total_seconds()))} ago"


def _show(args: argparse.Namespace) -> int:
    def read(q: QueueService) -> tuple[QueueInfo, JobCounts, list[ScheduleInfo]]:
        info = q.get_queue(args.name)
        if info is None:
            raise QueueNotFoundError(args.name, q.schema)
        (counts,) = q.count_jobs([args.name])
        return info, counts, q.get_schedules(args.name)

    info, counts, schedules = in_transaction(args, read)
    if args.json:
        emit(args, {"queue": info, "counts": counts, "schedules": schedules})
        return 0
    note = queue_note(info.name)
    print(f"queue {info.name}" + (f"  ({note})" if note else ""))
    settings = queue_settings(info)
    width = max(len(s.option) for s in settings)
    for s in settings:
        print(f"  {s.option:<{width}}  {s.value:<24}  {s.meaning}")
    print("jobs")
    ready = duration(counts.oldest_ready_seconds)
    states = "  ".join(f"{state} {n}" for state, n in counts.counts.items())
    print(f"  {states}  (oldest ready job waiting {ready})")
    print("schedules" + ("" if schedules else "  (none)"))
    for sched in schedules:
        zone = f" {sched.timezone}" if sched.timezone else ""
        print(f"  {sched.key or '(no key)'}  {sched.kind} {sched.cron!r}{zone}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    if args.name is None:
        rows = in_transaction(
            args, lambda q: [q.get_queue_stats(info.name) for info in q.get_queues()]
        )
        emit(args, rows, columns=STATS_COLUMNS)
    else:
        emit(args, in_transaction(args, lambda q: q.get_queue_stats(args.name)))
    return 0


def _blocked_keys(args: argparse.Namespace) -> int:
    keys = in_transaction(
        args, lambda q: q.get_blocked_keys(args.name, limit=args.limit, after=args.after)
    )
    emit(args, keys)
    return 0


def _subscriptions(args: argparse.Namespace) -> int:
    rows = in_transaction(args, lambda q: q.get_subscriptions(args.name, args.event))
    emit(args, rows, columns=("event", "name", "created_on"))
    return 0


def _delete(args: argparse.Namespace) -> int:
    def delete(q: QueueService) -> bool:
        if not q.delete_queue(args.name):
            raise QueueNotFoundError(args.name, q.schema)
        return True

    in_transaction(args, delete)
    emit(args, {"name": args.name, "status": "deleted"})
    return 0
