"""``alkstore maintain [--loop] [--queue Q ...]``: run the supervisor from the shell.

One pass by default (what is due: on a fresh process, everything whose
cluster-wide turn has come), or ``--loop`` to keep supervising until interrupted
(Ctrl-C or SIGTERM). Prints what each pass did; with ``--json`` as one JSON
document per pass.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from ..supervision import Supervisor
from ._common import CommandError, emit, engine_from, leaf, log_to_stderr, schema_of

_TUNING = (
    ("supervise_interval", float, "how often this process tries the supervise turn (60)"),
    ("monitor_interval", float, "per queue: counters, warnings and expiry, cluster-wide (60)"),
    ("maintenance_interval", float, "per queue: deletion of old jobs, cluster-wide (86400)"),
    ("cron_monitor_interval", float, "how often due schedules are filed into send-it (30)"),
    ("cron_worker_interval", float, "how often send-it jobs become their queues' jobs (5)"),
    ("clock_monitor_interval", float, "how often the database clock's skew is measured (600)"),
    ("flow_interval", float, "schema 46: how often flow children are released (5)"),
    ("bam_interval", float, "schema 46: how often queued index builds are run (60)"),
    ("reindex_interval", float, "schema 46: how often bloated job indexes are rebuilt (86400)"),
    ("warning_queue_size", int, "queued jobs above which a queue is warned about (10000)"),
    ("delete_batch_size", int, "jobs deleted per statement (10000)"),
    ("expire_batch_size", int, "jobs expired per statement (1000)"),
    ("queue_stats_retention_days", int, "with --persist-queue-stats: days kept (7)"),
    ("warning_retention_days", int, "with --persist-warnings: days kept (365)"),
)
"""The supervisor's settings as options: name, type, help (with pg-boss's default)."""


def register(sub: Any) -> None:
    # "supervise" is the name the library uses for this pass (QueueService.supervise,
    # Supervisor); "maintain" is kept as the command's first name.
    parser = leaf(
        sub,
        "maintain",
        "expire stalled jobs, delete old ones, count, fire cron",
        aliases=["supervise"],
    )
    parser.add_argument("--loop", action="store_true", help="keep supervising until interrupted")
    parser.add_argument(
        "--queue",
        action="append",
        dest="queues",
        metavar="Q",
        help="only this queue's counters, expiry and deletion (repeatable; default all)",
    )
    parser.add_argument(
        "--force", action="store_true", help="ignore the cluster-wide throttles (first pass)"
    )
    parser.add_argument("--no-cron", action="store_true", help="leave cron schedules alone")
    parser.add_argument(
        "--no-supervise", action="store_true", help="only cron: no counters, expiry or deletion"
    )
    parser.add_argument(
        "--persist-queue-stats",
        action="store_true",
        help="write queue-stats history and prune it (schema 46; pg-boss's persistQueueStats)",
    )
    parser.add_argument(
        "--persist-warnings",
        action="store_true",
        help="write warnings to the warning table (schema 46; pg-boss's persistWarnings)",
    )
    for turn, what in (
        ("flows", "release flow children"),
        ("bam", "run the index builds queued in bam"),
        ("reindex", "rebuild bloated job indexes"),
    ):
        parser.add_argument(f"--no-{turn}", action="store_true", help=f"schema 46: do not {what}")
    for name, kind, what in _TUNING:
        unit = "days" if name.endswith("_days") else "seconds" if kind is float else "count"
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=kind, metavar=unit.upper(), help=what
        )
    parser.set_defaults(handler=_maintain)


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "supervise": not args.no_supervise,
        "schedule": not args.no_cron,
        "queues": args.queues,
        "flows": not args.no_flows,
        "bam": not args.no_bam,
        "reindex": not args.no_reindex,
    }
    if args.persist_queue_stats:
        settings["persist_queue_stats"] = True
    if args.persist_warnings:
        settings["persist_warnings"] = True
    for name, *_ in _TUNING:
        value = getattr(args, name)
        if value is not None:
            settings[name] = value
    return settings


def _maintain(args: argparse.Namespace) -> int:
    schema = schema_of(args)
    log_to_stderr()
    with engine_from(args) as engine:
        supervisor = Supervisor(engine, schema=schema, backend=args.backend, **_settings(args))
        stop = threading.Event()
        # Installed before the first pass: a SIGTERM that arrives while it runs
        # must end the loop cleanly, not kill the process.
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            report = supervisor.run_once(force=args.force)
            emit(args, report)
            if not args.loop:
                if report.errors:
                    # Each error reads "<step>: <reason>"; the reasons were logged as they happened.
                    steps = ", ".join(e.partition(": ")[0] for e in report.errors)
                    raise CommandError(f"supervision failed in: {steps} (logged above)")
                return 0
            while not stop.wait(max(supervisor.next_due_in(), 0.05)):
                report = supervisor.run_once()
                if not report.idle:
                    emit(args, report)
        finally:
            signal.signal(signal.SIGTERM, previous)
    return 0
