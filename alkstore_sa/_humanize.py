"""Values as people read them: durations in units, a queue's settings with what
each one means. The CLI (``alkstore queue show``) and the dashboard's queue page
show settings through :func:`queue_settings`, so both say the same thing; the
docs' glossary uses the same words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .names import SEND_IT_QUEUE

if TYPE_CHECKING:
    from .records import QueueInfo

_UNITS = (("day", 86_400), ("h", 3_600), ("min", 60), ("s", 1))


def duration(seconds: float | None) -> str:
    """``seconds`` in at most two units, largest first: ``"45 s"``, ``"4 min"``,
    ``"1 h 30 min"``, ``"14 days"``, ``"2 days 3 h"``; ``"-"`` for ``None``.
    Fractions under a second are shown as milliseconds; the rest is cut, not
    rounded up."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return "-" + duration(-seconds)
    if 0 < seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    whole = int(seconds)
    if whole == 0:
        return "0 s"
    first = next(i for i, (_, size) in enumerate(_UNITS) if whole >= size)
    parts: list[str] = []
    for unit, size in _UNITS[first : first + 2]:
        count, whole = divmod(whole, size)
        if count:
            parts.append(f"{count} {unit}" + ("s" if unit == "day" and count != 1 else ""))
    return " ".join(parts)


@dataclass(frozen=True, slots=True)
class Setting:
    """One queue setting for display: its option name, its value in human
    units and a sentence saying what it does."""

    option: str
    value: str
    meaning: str


def queue_settings(queue: QueueInfo) -> list[Setting]:
    """``queue``'s settings in the order an operator asks about them."""
    policy = getattr(queue.policy, "value", queue.policy)
    delay_max = queue.retry_delay_max
    out = [
        Setting("policy", str(policy), "how jobs of this queue may overlap"),
        Setting(
            "retry_limit",
            f"{queue.retry_limit} retries ({queue.retry_limit + 1} attempts)",
            "attempts after the first before a job fails for good",
        ),
        Setting(
            "retry_delay",
            duration(queue.retry_delay),
            "wait before a failed job is tried again",
        ),
        Setting(
            "retry_backoff",
            "exponential, with jitter" if queue.retry_backoff else "off (fixed delay)",
            "whether the retry delay grows with each attempt",
        ),
        Setting(
            "retry_delay_max",
            "none" if delay_max is None else duration(delay_max),
            "the longest a backed-off retry waits",
        ),
        Setting(
            "expire_seconds",
            duration(queue.expire_seconds),
            "how long an active job may run before it counts as failed",
        ),
        Setting(
            "retention_seconds",
            duration(queue.retention_seconds),
            "how long a job may wait unclaimed before it is deleted",
        ),
        Setting(
            "deletion_seconds",
            duration(queue.deletion_seconds),
            "how long a finished job is kept before it is deleted",
        ),
        Setting(
            "dead_letter",
            queue.dead_letter or "none",
            "the queue a job is copied to when it fails for good",
        ),
        Setting(
            "warning_queued",
            "off" if not queue.warning_queued else f"{queue.warning_queued} jobs",
            "backlog above which the monitor warns",
        ),
    ]
    if queue.heartbeat_seconds is not None:
        out.append(
            Setting(
                "heartbeat_seconds",
                duration(queue.heartbeat_seconds),
                "longest silence before an active job is failed (schema 46)",
            )
        )
    return out


def queue_note(name: str) -> str | None:
    """A line saying what a queue the library (or pg-boss) made for itself is,
    for listings; ``None`` for an application's queue."""
    if name == SEND_IT_QUEUE:
        return (
            "internal: cron files each due schedule here, and supervision sends "
            "the job into its target queue (see the glossary)"
        )
    if name.startswith("__pgboss__"):
        return "internal to pg-boss"
    return None
