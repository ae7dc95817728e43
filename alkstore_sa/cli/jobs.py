"""``alkstore jobs list|get|attempts|retry|cancel|resume|delete|redrive``."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any

from .._humanize import duration, job_attempt, job_attempt_short
from ..errors import shown
from ..models.enums import JobState
from ..records import Job, Settled
from ..service import QueueService
from ._common import CommandError, emit, leaf
from ._service import JOB_COLUMNS, in_transaction

# action -> help; the handler picks the service method
_MOVES = {
    "retry": "give failed jobs one more attempt",
    "cancel": "cancel jobs that are not finished",
    "resume": "put cancelled jobs back in the queue",
    "delete": "delete jobs, whatever their state",
}


def register(sub: Any) -> None:
    jobs = sub.add_parser("jobs", help="inspect and move jobs")
    actions = jobs.add_subparsers(dest="action", metavar="ACTION", required=True)

    listing = leaf(actions, "list", "a queue's jobs, newest first")
    listing.add_argument("queue")
    listing.add_argument("--state", choices=[s.value for s in JobState])
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    listing.set_defaults(handler=_list)

    get = leaf(actions, "get", "one job with all its fields")
    get.add_argument("queue")
    get.add_argument("id")
    get.set_defaults(handler=_get)

    attempts = leaf(actions, "attempts", "a job's failed attempts, oldest first")
    attempts.add_argument("queue")
    attempts.add_argument("id")
    attempts.set_defaults(handler=_attempts)

    for action, help_text in _MOVES.items():
        move = leaf(actions, action, help_text)
        move.add_argument("queue")
        move.add_argument("ids", nargs="+", metavar="ID")
        move.set_defaults(handler=_move, move=action)

    redrive = leaf(actions, "redrive", "move dead-lettered jobs back into a queue")
    redrive.add_argument("dead_letter", metavar="DEAD_LETTER_QUEUE")
    redrive.add_argument(
        "--to",
        metavar="QUEUE",
        help="the queue to send them to (default, schema 46 only: each to the queue it failed in)",
    )
    redrive.add_argument("--id", dest="ids", action="append", metavar="ID", help="only these")
    redrive.add_argument("--limit", type=int, default=1000, help="at most this many (default 1000)")
    redrive.set_defaults(handler=_redrive)


LIST_COLUMNS = tuple(
    "attempt" if c == "retry_count" else c for c in JOB_COLUMNS if c != "retry_limit"
)
"""The table of ``jobs list``: the job columns, with pg-boss's ``retry_count`` and
``retry_limit`` read as one ``attempt`` ("2 of 3", as the worker's log and the
dashboard say it); ``--json`` keeps the raw fields."""


def _list(args: argparse.Namespace) -> int:
    jobs = in_transaction(
        args, lambda q: q.list_jobs(args.queue, state=args.state, limit=args.limit)
    )
    if args.json:
        emit(args, jobs)
    else:
        rows = [{**asdict(job), "attempt": job_attempt_short(job)} for job in jobs]
        emit(args, rows, columns=LIST_COLUMNS)
    return 0


def _get(args: argparse.Namespace) -> int:
    # An unknown queue is QueueNotFoundError from the service, not "no job".
    job = in_transaction(args, lambda q: q.get_job(args.queue, args.id))
    if job is None:
        raise CommandError(f"no job {args.id} in queue {shown(args.queue)}")
    emit(args, job if args.json else _with_attempt(job))
    return 0


def _with_attempt(job: Job) -> dict[str, object]:
    """``job``'s fields with an ``attempt`` line after ``state`` ("attempt 2 of 3");
    ``retry_count`` and ``retry_limit`` stay, as pg-boss names them."""
    fields: dict[str, object] = {}
    for key, value in asdict(job).items():
        fields[key] = value
        if key == "state":
            fields["attempt"] = job_attempt(job)
    return fields


ATTEMPT_COLUMNS = ("attempt", "cause", "failed_on", "took", "worker", "error")


def _attempts(args: argparse.Namespace) -> int:
    # An unknown queue is QueueNotFoundError from the service; a job without rows has none.
    found = in_transaction(args, lambda q: q.get_job_attempts(args.queue, args.id))
    if args.json:
        emit(args, found)
        return 0
    rows = [
        {
            "attempt": a.attempt,
            "cause": a.cause,
            "failed_on": a.failed_on,
            "took": None
            if a.started_on is None
            else duration((a.failed_on - a.started_on).total_seconds()),
            "worker": a.worker,
            "error": ": ".join(p for p in (a.error_type, a.message) if p) or None,
        }
        for a in found
    ]
    emit(args, rows, columns=ATTEMPT_COLUMNS)
    return 0


def _move(args: argparse.Namespace) -> int:
    def move(q: QueueService) -> Settled:
        if args.move == "delete":
            return q.delete_jobs(args.queue, args.ids)
        method = {"retry": q.retry, "cancel": q.cancel, "resume": q.resume}[args.move]
        return method(args.queue, args.ids)

    settled = in_transaction(args, move)
    emit(
        args,
        {
            "action": args.move,
            "requested": settled.requested,
            "affected": [str(i) for i in settled.affected],
        },
    )
    missed = settled.requested - settled.count
    if missed:
        raise CommandError(
            f"{missed} of {settled.requested} jobs not changed: unknown, or not in a state "
            f"that allows {args.move}"
        )
    return 0


def _redrive(args: argparse.Namespace) -> int:
    moved = in_transaction(
        args, lambda q: q.redrive(args.dead_letter, args.to, args.ids, limit=args.limit)
    )
    emit(args, {"from": args.dead_letter, "to": args.to, "ids": [str(i) for i in moved]})
    return 0
