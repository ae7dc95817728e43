"""Values as people read them: durations in units, a queue's settings with what
each one means, how far a job is through its attempts. The CLI (``alkstore queue
show``, ``alkstore jobs``), the dashboard and the worker's log say these through
the functions here, so all say the same thing; the docs' glossary uses the same
words.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .names import SEND_IT_QUEUE

if TYPE_CHECKING:
    from .records import Job, QueueInfo

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


def attempts_made(job: Job) -> int:
    """The attempts ``job`` has had, the running one included: 0 before its first
    start, else ``retry_count + 1``.

    pg-boss raises ``retry_count`` when it claims a job that ran before, not when an
    attempt fails, so while a job is active ``retry_count + 1`` is the attempt that
    runs, and once it failed (``retry`` or ``failed``) or completed it is the last
    attempt made. A job that never started (``started_on`` unset) has had none.
    """
    return 0 if job.started_on is None else job.retry_count + 1


def attempts_allowed(job: Job) -> int:
    """The attempts ``job`` may have in all: its first and ``retry_limit`` retries."""
    return job.retry_limit + 1


def attempt_of(attempt: int, allowed: int) -> str:
    """``"attempt 2 of 3"``: the one wording of an attempt number, in the worker's
    log, the CLI and the dashboard (``attempt`` counts from 1)."""
    return f"attempt {attempt} of {allowed}"


def job_attempt(job: Job) -> str:
    """Where ``job`` is in its attempts, for a person: ``"attempt 2 of 3"``; a job
    waiting for a retry adds which attempt is next (``"attempt 1 of 3 failed,
    attempt 2 next"``), one that never started says so (``"no attempt yet, 3
    allowed"``). :func:`job_attempt_short` is the same in a table cell."""
    made, allowed = attempts_made(job), attempts_allowed(job)
    if made == 0:
        return f"no attempt yet, {allowed} allowed"
    text = attempt_of(made, allowed)
    if _state(job) == "retry":
        return f"{text} failed, attempt {made + 1} next"
    return text


def job_attempt_short(job: Job) -> str:
    """``"2 of 3"``: attempts made (the running one included) of attempts allowed,
    for a table column headed "attempt"."""
    return f"{attempts_made(job)} of {attempts_allowed(job)}"


def _state(job: Job) -> str:
    return str(getattr(job.state, "value", job.state))


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
