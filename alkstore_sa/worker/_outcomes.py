"""The log record of a settled attempt: what happened to the job and what happens next.

A failed attempt is a WARNING that names the queue, the job, the attempt, the error and
the next step (a retry and when, or failed for good and where its copy went); the last
one carries the handler's traceback. A completion is a DEBUG record, built only when
DEBUG is on. The fields are in ``extra`` for JSON formatters (the "Logging" page).
"""

from __future__ import annotations

import logging
from typing import Any

from .._humanize import attempt_of, attempts_allowed, attempts_made
from .._humanize import duration as human_duration
from ..limits import LONGEST_RETRY_DELAY
from ..models.enums import JobState
from ._attempt import Attempt, Pending

log = logging.getLogger("alkstore_sa.worker")

RETRY, FAILED, DEAD_LETTER = "retry", "failed", "dead_letter"
"""Values of the ``next`` field of a ``job_failed`` record."""


def error_of(output: Any) -> tuple[str, str]:
    """The error's type name and first line of message, from the stored output."""
    if isinstance(output, dict):
        name, message = output.get("name"), output.get("message")
        text = str(message).strip() if message is not None else ""
        return str(name or "Error"), text.splitlines()[0] if text else ""
    return "Error", str(output)


def _next_step(
    p: Pending, state: JobState | None, *, copied: bool
) -> tuple[str, float | None, str]:
    """``(next, retry_delay, words)`` for a failed attempt that became ``state``.

    ``retry_delay`` is the delay the fail statement applied when it is known here: the
    queue's ``retry_delay`` without backoff. With backoff the statement adds its own
    random share, so the words give the configured delay the backoff starts from.
    """
    job = p.attempt.job
    if state == JobState.RETRY:
        if job.retry_backoff:
            return RETRY, None, f"retry with backoff from {human_duration(job.retry_delay)}"
        delay = float(min(job.retry_delay, LONGEST_RETRY_DELAY))
        return RETRY, delay, f"retry in {human_duration(delay)}"
    if job.dead_letter is not None:
        if copied:
            return DEAD_LETTER, None, f"failed for good, copied to {job.dead_letter!r}"
        return FAILED, None, f"failed for good (dead letter queue {job.dead_letter!r} not found)"
    return FAILED, None, "failed for good"


def failed(p: Pending, state: JobState | None, worker: str, *, copied: bool) -> None:
    """Log one failed attempt at WARNING (with the traceback when it was the last)."""
    job = p.attempt.job
    error_type, message = error_of(p.output)
    step, delay, words = _next_step(p, state, copied=copied)
    attempt = attempts_made(job)  # the fetched row: the attempt that ran
    extra: dict[str, Any] = {
        "action": "job_failed",
        "worker": worker,
        "queue": job.name,
        "job_id": str(job.id),
        "attempt": attempt,
        "retry_limit": job.retry_limit,
        "reason": p.reason,
        "error_type": error_type,
        "error": message,
        "next": step,
        "retry_delay": delay,
        "dead_letter": job.dead_letter,
        "duration_ms": None if p.duration is None else round(p.duration * 1000, 3),
        "state": None if state is None else state.value,
    }
    exc = p.error
    log.warning(
        "job %s of %r failed (%s): %s: %s; %s",
        job.id,
        job.name,
        attempt_of(attempt, attempts_allowed(job)),
        error_type,
        message,
        words,
        exc_info=(type(exc), exc, exc.__traceback__) if exc is not None and step != RETRY else None,
        extra=extra,
    )


def completed(attempt: Attempt, worker: str, seconds: float | None) -> None:
    """Log one completion at DEBUG; the caller checked that DEBUG is on."""
    job = attempt.job
    log.debug(
        "job %s of %r completed (%s) in %s",
        job.id,
        job.name,
        attempt_of(attempts_made(job), attempts_allowed(job)),
        human_duration(seconds),
        extra={
            "action": "job_completed",
            "worker": worker,
            "queue": job.name,
            "job_id": str(job.id),
            "attempt": attempts_made(job),
            "retry_limit": job.retry_limit,
            "duration_ms": None if seconds is None else round(seconds * 1000, 3),
        },
    )
