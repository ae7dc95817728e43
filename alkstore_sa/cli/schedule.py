"""``alkstore schedule add|remove|list``: cron and recurrence-rule schedules that send jobs."""

from __future__ import annotations

import argparse
from typing import Any

from ..errors import shown
from ..rrule import is_rrule
from ..service import QueueService
from ._common import CommandError, emit, leaf, parse_json
from ._options import SCHEDULE, add_options, given_options
from ._service import in_transaction

LIST_COLUMNS = ("name", "key", "kind", "cron", "timezone", "data", "updated_on")


def register(sub: Any) -> None:
    schedule = sub.add_parser("schedule", help="cron and recurrence-rule schedules")
    actions = schedule.add_subparsers(dest="action", metavar="ACTION", required=True)

    add = leaf(actions, "add", "add or replace the schedule (QUEUE, --key)")
    add.add_argument("queue")
    add.add_argument(
        "cron",
        nargs="?",
        help="5 fields, or 6 with seconds first, or an RFC 5545 rule (schema 46); quote it",
    )
    add.add_argument(
        "--rrule",
        metavar="RULE",
        help="an RFC 5545 recurrence rule instead of CRON, e.g. 'FREQ=DAILY;BYHOUR=9' (schema 46)",
    )
    add.add_argument("--data", metavar="JSON", help="data of every job sent (default null)")
    add.add_argument("--key", default="", help="tells several schedules of a queue apart")
    add.add_argument("--tz", default="UTC", help="IANA time zone of the schedule (default UTC)")
    add_options(add, SCHEDULE)
    add.set_defaults(handler=_add)

    remove = leaf(actions, "remove", "remove a schedule")
    remove.add_argument("queue")
    remove.add_argument("--key", default="")
    remove.set_defaults(handler=_remove)

    listing = leaf(actions, "list", "stored schedules")
    listing.add_argument("queue", nargs="?")
    listing.add_argument("--key")
    listing.set_defaults(handler=_list)


def _add(args: argparse.Namespace) -> int:
    if (args.cron is None) == (args.rrule is None):
        raise CommandError("give either CRON or --rrule RULE")
    if args.rrule is not None and not is_rrule(args.rrule):
        raise CommandError(f"--rrule {shown(args.rrule)} is not an RFC 5545 rule (no FREQ= part)")
    expression = args.cron if args.rrule is None else args.rrule
    data = parse_json("--data", args.data)
    options = given_options(args, SCHEDULE)
    in_transaction(
        args,
        lambda q: q.schedule(args.queue, expression, data, key=args.key, tz=args.tz, **options),
    )
    kind = "rrule" if is_rrule(expression) else "cron"
    added = {"name": args.queue, "key": args.key, "kind": kind, "cron": expression}
    emit(args, {**added, "status": "scheduled"})
    return 0


def _remove(args: argparse.Namespace) -> int:
    def remove(q: QueueService) -> bool:
        return q.unschedule(args.queue, args.key)

    if not in_transaction(args, remove):
        raise CommandError(f"no schedule {shown(args.key)} on queue {shown(args.queue)}")
    emit(args, {"name": args.queue, "key": args.key, "status": "removed"})
    return 0


def _list(args: argparse.Namespace) -> int:
    rows = in_transaction(args, lambda q: q.get_schedules(args.queue, args.key))
    emit(args, rows, columns=LIST_COLUMNS)
    return 0
