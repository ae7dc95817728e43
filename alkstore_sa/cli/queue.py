"""``alkstore queue create|ensure|update|list|show|stats|blocked-keys|subscriptions|delete``."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from .._humanize import duration, queue_note, queue_settings
from ..errors import QueueNotFoundError
from ..records import JobCounts, QueueInfo, ScheduleInfo
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
    "note",
)
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

    leaf(actions, "list", "all queues with their cached counters").set_defaults(handler=_list)

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
    queues = in_transaction(args, lambda q: q.get_queues())
    if args.json:
        emit(args, queues)
    else:
        rows = [{**asdict(info), "note": queue_note(info.name)} for info in queues]
        emit(args, rows, columns=LIST_COLUMNS)
    return 0


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
