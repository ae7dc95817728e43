"""``alkstore flow send|show``: send a flow from a JSON file, show a flow job's
parents and children (schema 46)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..errors import FlowConflictError
from ..records import Job, JobDependency
from ..service import QueueService
from ._common import BadInput, CommandError, emit, leaf, print_table
from ._service import in_transaction
from .send import NOT_SENT

RELATED_COLUMNS = ("name", "id", "state")
"""Columns of the parents and children tables of ``flow show``."""


def register(sub: Any) -> None:
    flow = sub.add_parser("flow", help="send a flow of jobs, show a flow job's dependencies")
    actions = flow.add_subparsers(dest="action", metavar="ACTION", required=True)

    send = leaf(actions, "send", "send jobs that depend on one another, from a JSON file")
    send.add_argument(
        "file",
        metavar="FILE",
        help="a JSON list of flow jobs (ref, name, data, options, depends_on); - reads stdin",
    )
    send.set_defaults(handler=_send)

    show = leaf(actions, "show", "a flow job with its parents and children, and their states")
    show.add_argument("queue")
    show.add_argument("id")
    show.add_argument(
        "--limit",
        type=int,
        default=1000,
        help="at most this many parents, and as many children (default 1000)",
    )
    show.set_defaults(handler=_show)


def _read_jobs(path: str) -> Any:
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except OSError as exc:
        raise BadInput(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        jobs = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(jobs, list):
        raise BadInput(f"{path} must hold a JSON list of flow jobs, not a {type(jobs).__name__}")
    return jobs


def _send(args: argparse.Namespace) -> int:
    jobs = _read_jobs(args.file)
    try:
        ids = in_transaction(args, lambda q: q.flow(jobs))
    except FlowConflictError as exc:
        raise CommandError(str(exc), NOT_SENT) from None
    emit(args, {ref: str(job_id) for ref, job_id in ids.items()})
    return 0


def _related(rows: list[JobDependency]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "id": str(r.id), "state": None if r.state is None else r.state.value}
        for r in rows
    ]


def _show(args: argparse.Namespace) -> int:
    def read(q: QueueService) -> tuple[Job | None, list[JobDependency], list[JobDependency]]:
        # An unknown queue is QueueNotFoundError from get_job, not "no job".
        job = q.get_job(args.queue, args.id)
        if job is None:
            return None, [], []
        parents = q.get_dependencies(args.queue, job.id, limit=args.limit)
        children = q.get_dependents(args.queue, job.id, limit=args.limit)
        return job, parents, children

    job, parents, children = in_transaction(args, read)
    if job is None:
        raise CommandError(f"no job {args.id} in queue {args.queue!r}")
    shown = {"name": job.name, "id": str(job.id), "state": job.state.value}
    if args.json:
        emit(args, {"job": shown, "parents": _related(parents), "children": _related(children)})
        return 0
    emit(args, shown)
    for title, rows in (("parents", parents), ("children", children)):
        print(f"\n{title} ({len(rows)})")
        print_table(_related(rows), RELATED_COLUMNS)
    return 0
