"""What the queue, send, jobs and schedule commands share: a service in one transaction,
and the option groups that map onto :class:`~alkstore_sa.QueueService` keyword arguments."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.orm import Session

from ..models.enums import QueuePolicy
from ..service import QueueService
from ._common import engine_from, schema_of

T = TypeVar("T")

JOB_COLUMNS = (
    "id",
    "state",
    "priority",
    "retry_count",
    "retry_limit",
    "singleton_key",
    "created_on",
    "start_after",
    "completed_on",
)
"""Columns of the job tables printed by ``jobs list`` (``--json`` prints every field)."""


def in_transaction(args: argparse.Namespace, work: Callable[[QueueService], T]) -> T:
    """Run ``work(service)`` in one transaction, committed if it returns.

    Whatever it raises rolls the transaction back and reaches ``main``, which
    reports it.
    """
    schema = schema_of(args)
    with engine_from(args) as engine, Session(engine) as session, session.begin():
        return work(QueueService(session, schema=schema))


def _integer(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    return value


# Option name on the command line -> keyword of the service, with argparse settings.
OptionGroup = dict[str, tuple[str, dict[str, Any]]]

_RETRY_AND_RETENTION: OptionGroup = {
    "--retry-limit": (
        "retry_limit",
        {"type": _integer, "metavar": "N", "help": "attempts after the first"},
    ),
    "--retry-delay": (
        "retry_delay",
        {"type": _integer, "metavar": "SECONDS", "help": "seconds between attempts"},
    ),
    "--retry-backoff": (
        "retry_backoff",
        {"action": argparse.BooleanOptionalAction, "help": "grow the delay on each retry"},
    ),
    "--retry-delay-max": (
        "retry_delay_max",
        {"type": _integer, "metavar": "SECONDS", "help": "cap of the backoff"},
    ),
    "--expire-seconds": (
        "expire_seconds",
        {"type": _integer, "metavar": "SECONDS", "help": "lease of an active job"},
    ),
    "--retention-seconds": (
        "retention_seconds",
        {"type": _integer, "metavar": "SECONDS", "help": "how long a queued job may wait"},
    ),
    "--deletion-seconds": (
        "deletion_seconds",
        {"type": _integer, "metavar": "SECONDS", "help": "how long a finished job is kept"},
    ),
}

_QUEUE_ONLY: OptionGroup = {
    "--dead-letter": ("dead_letter", {"metavar": "QUEUE", "help": "queue for failed jobs"}),
    "--warning-queued": (
        "warning_queued",
        {"type": _integer, "metavar": "N", "help": "queued jobs that raise a warning (0 = global)"},
    ),
}

_SEND_ONLY: OptionGroup = {
    "--id": ("id", {"metavar": "UUID", "help": "the job's id (default: generated)"}),
    "--priority": (
        "priority",
        {"type": _integer, "metavar": "N", "help": "higher runs first (default 0)"},
    ),
    "--start-after": (
        "start_after",
        {"metavar": "WHEN", "help": "seconds from now, or an ISO-8601 time with offset"},
    ),
    "--singleton-key": ("singleton_key", {"metavar": "KEY", "help": "policy/throttle key"}),
    "--singleton-seconds": (
        "singleton_seconds",
        {
            "type": _integer,
            "metavar": "SECONDS",
            "help": "throttle: one job per key per slot of this length",
        },
    ),
}


def _add(parser: argparse.ArgumentParser, group: OptionGroup) -> None:
    for flag, (dest, settings) in group.items():
        parser.add_argument(flag, dest=f"opt_{dest}", default=None, **settings)


def _collect(args: argparse.Namespace, *groups: OptionGroup) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for group in groups:
        for dest, _ in group.values():
            value = getattr(args, f"opt_{dest}", None)
            if value is not None:
                found[dest] = value
    return found


def add_queue_options(parser: argparse.ArgumentParser, *, create: bool) -> None:
    """Options of ``create_queue`` (``update_queue`` when ``create`` is false)."""
    if create:
        parser.add_argument(
            "--policy",
            dest="opt_policy",
            choices=[p.value for p in QueuePolicy],
            default=None,
            help="how jobs sharing a singleton key are limited (default standard)",
        )
        parser.add_argument(
            "--partition",
            dest="opt_partition",
            action="store_true",
            default=None,
            help="give the queue its own partition table",
        )
    _add(parser, _QUEUE_ONLY)
    _add(parser, _RETRY_AND_RETENTION)


def queue_options(args: argparse.Namespace) -> dict[str, Any]:
    """The queue options given on the command line, as service keywords."""
    found = _collect(args, _QUEUE_ONLY, _RETRY_AND_RETENTION)
    for dest in ("policy", "partition"):
        value = getattr(args, f"opt_{dest}", None)
        if value is not None:
            found[dest] = value
    return found


def add_send_options(parser: argparse.ArgumentParser, *, with_id: bool = True) -> None:
    """Per-job options of ``send`` (each overrides the queue's value).

    A schedule sends many jobs, so it takes everything but ``--id``.
    """
    _add(parser, {k: v for k, v in _SEND_ONLY.items() if with_id or k != "--id"})
    _add(parser, _RETRY_AND_RETENTION)


def send_options(args: argparse.Namespace) -> dict[str, Any]:
    """The send options given on the command line, as service keywords."""
    return _collect(args, _SEND_ONLY, _RETRY_AND_RETENTION)
