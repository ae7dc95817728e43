"""One queue's place in a worker: its handler slots, its buffer of jobs claimed
ahead, and the runners that take jobs from that buffer (the "Architecture" page).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

from ..records import Job
from ._attempt import Attempt
from .config import AHEAD_SECONDS, HandlerSpec

INLINE_SECONDS = 0.001
"""A runtime whose hand-off to another thread costs more than a fast handler
(``Worker``: waking a pool thread costs about half a millisecond) runs a queue's
jobs on one runner, one after the other, while the queue's handlers take less
than this on average."""

OVERDUE_FACTOR = 4.0
"""A running job is past its expected time once it has run this many times the
queue's average run time (and at least :data:`~.config.AHEAD_SECONDS`): while one
is, the queue claims nothing ahead, since the buffer would wait behind it."""

GIVE_BACK_FRACTION = 0.5
"""A buffered job that has waited this fraction of its lease (or, schema 46, of its
heartbeat, if shorter) is given back to its queue, never started: past it, the
lease could run out before the job's first renewal, supervision return it and
another worker run it. A job found so late when a runner would take it is not
started either; it goes back too."""

INLINE_OVERDUE = 0.05
"""On such a queue, a job that has run for longer than this lets one more runner
take the buffered jobs (checked when a claim lands and by the keeper, every
:data:`~alkstore_sa.worker._leases.TICK`)."""


class QueueState:
    """One queue's bookkeeping: jobs in hand (running or buffered), the buffer, the
    runners, and whether the queue has a backlog.

    ``in_flight`` counts every claimed job not yet finished, given back or abandoned:
    the ones in ``buffer`` (claimed, not started) and the ones running. A runner
    is a handler thread or task that takes the next buffered job when its own
    finishes, so a busy queue hands off once per runner, not once per job.
    """

    def __init__(self, spec: HandlerSpec, wake: Any) -> None:
        self.spec = spec
        self.wake = wake
        self.in_flight = 0
        self.backlog = False
        self.lock = threading.Lock()
        self.runner: Any = None  # the fetch loop's thread or task
        self.buffer: deque[Attempt] = deque()  # claimed, waiting for a runner
        self.late: list[Attempt] = []  # out of the buffer, unstarted: to be given back
        self.executing: set[Attempt] = set()  # handed to a runner
        self.runners = 0
        self.ahead_allowed = False  # the queue's policy lets jobs be claimed ahead
        self.run_seconds: float | None = None  # moving average of the handlers' run time
        # local_group_concurrency: the group of each of our claimed jobs that has one.
        self.grouped: dict[Any, str] = {}
        # The queue did not exist at a claim: since when, and when that was last said
        # at WARNING (monotonic seconds; see Fetching._queue_missing).
        self.missing_since: float | None = None
        self.missing_said = 0.0

    # ------------------------------------------------------------ groups

    def group_counts(self) -> dict[str, int] | None:
        """Our claimed jobs per group, for a ``local_group_concurrency`` claim (else None)."""
        if self.spec.local_group_concurrency is None:
            return None
        with self.lock:
            counts: dict[str, int] = {}
            for group in self.grouped.values():
                counts[group] = counts.get(group, 0) + 1
            return counts

    def group_started(self, job: Job) -> None:
        if self.spec.local_group_concurrency is not None and job.group_id is not None:
            with self.lock:
                self.grouped[job.id] = job.group_id

    def group_ended(self, job: Job) -> None:
        """The job's handler returned (or will never run): its group place is free.
        A handler abandoned on a thread keeps its place until it returns."""
        if self.grouped:
            with self.lock:
                self.grouped.pop(job.id, None)

    # ------------------------------------------------------------ claiming

    def ran(self, seconds: float) -> None:
        """A handler of the queue ran for ``seconds`` (not abandoned)."""
        with self.lock:
            avg = self.run_seconds
            self.run_seconds = seconds if avg is None else avg + 0.2 * (seconds - avg)

    def runs_inline(self) -> bool:
        """Whether the queue's jobs are cheaper to run one after the other on one
        runner than to hand to several."""
        avg = self.run_seconds
        return avg is not None and avg < INLINE_SECONDS

    def ahead(self, now: float | None = None) -> int:
        """Jobs to hold claimed beyond the handler slots now: ``prefetch``, but no
        more than the handlers will start within :data:`AHEAD_SECONDS` at their
        average run time (none before a handler has run, when the policy does
        not allow it, or while a running job is past its expected time: see
        :data:`OVERDUE_FACTOR`)."""
        most, avg = self.spec.ahead, self.run_seconds
        if not most or not self.ahead_allowed or avg is None:
            return 0
        expected = max(AHEAD_SECONDS, OVERDUE_FACTOR * avg)
        now = time.monotonic() if now is None else now
        if any(a.running_for(now) > expected for a in self.executing):
            return 0
        if avg * most <= AHEAD_SECONDS * self.spec.concurrency:
            return most
        return int(AHEAD_SECONDS * self.spec.concurrency / avg)

    def _free(self) -> tuple[int, int]:
        capacity = self.spec.concurrency + self.ahead()
        return capacity - self.in_flight, capacity

    def want(self) -> int:
        """Jobs to claim now (0: wait for free places)."""
        with self.lock:
            free, capacity = self._free()
            if free < self.spec.fetch_threshold(capacity, backlog=self.backlog):
                return 0
        return min(self.spec.fetch_size, free)

    def claimed(self, attempts: list[Attempt], wanted: int) -> None:
        """A claim of ``wanted`` brought ``attempts``: into the buffer."""
        with self.lock:
            self.in_flight += len(attempts)
            self.backlog = len(attempts) == wanted
            self.buffer.extend(attempts)

    # ------------------------------------------------------------ runners

    def _allowed(self, now: float, *, inline: bool) -> int:
        if not inline:
            return self.spec.concurrency
        overdue = sum(1 for a in self.executing if a.running_for(now) > INLINE_OVERDUE)
        return min(self.spec.concurrency, 1 + overdue)

    def _start(self, now: float) -> Attempt:
        attempt = self.buffer.popleft()
        attempt.start(now)
        self.executing.add(attempt)
        return attempt

    def _set_aside_late(self, now: float) -> None:
        """Move the buffered jobs that waited too long (:data:`GIVE_BACK_FRACTION`)
        out of the buffer, to be given back. Under the lock."""
        if not self.buffer:
            return
        keep: deque[Attempt] = deque()
        for attempt in self.buffer:
            (self.late if late(attempt, now) else keep).append(attempt)
        if len(keep) != len(self.buffer):
            self.in_flight -= len(self.buffer) - len(keep)
            self.buffer = keep

    def new_runner(self, now: float, *, inline: bool) -> Attempt | None:
        """The first job of a new runner, if a buffered job may start on one now."""
        with self.lock:
            self._set_aside_late(now)
            if not self.buffer or self.runners >= self._allowed(now, inline=inline):
                return None
            self.runners += 1
            return self._start(now)

    def next_job(self, now: float, *, inline: bool, stopping: bool) -> Attempt | None:
        """A runner finished its job: its next one, or None (the runner ends)."""
        with self.lock:
            self._set_aside_late(now)
            if self.buffer and not stopping and self.runners <= self._allowed(now, inline=inline):
                return self._start(now)
            self.runners -= 1
            return None

    def take_late(self, now: float) -> list[Attempt]:
        """The buffered jobs that waited too long to be started safely: out of the
        buffer, to be given back (see :data:`GIVE_BACK_FRACTION`)."""
        with self.lock:
            self._set_aside_late(now)
            taken, self.late = self.late, []
            return taken

    def ended(self, attempt: Attempt) -> bool:
        """``attempt``'s handler returned; whether the fetch loop should claim now."""
        with self.lock:
            self.executing.discard(attempt)
            self.in_flight -= 1
            if not self.backlog:
                return False
            free, capacity = self._free()
            return free >= self.spec.fetch_threshold(capacity, backlog=True)

    def dropped(self, attempt: Attempt) -> None:
        """``attempt`` was abandoned: out of the buffer, or off its runner (which
        stays with the handler until it returns, then retires)."""
        with self.lock:
            if attempt in self.executing:
                self.executing.discard(attempt)
                self.runners -= 1
            elif attempt in self.buffer:
                self.buffer.remove(attempt)
            else:
                return
            self.in_flight -= 1

    def take_buffer(self) -> list[Attempt]:
        """Empty the buffer (at shutdown, to give its jobs back)."""
        with self.lock:
            taken = list(self.buffer)
            self.buffer.clear()
            self.in_flight -= len(taken)
            taken.extend(self.late)
            self.late = []
            return taken


def late(attempt: Attempt, now: float) -> bool:
    """Whether a buffered ``attempt`` has waited too long to be started: its lease
    (or heartbeat, if shorter) may run out before its first renewal."""
    window = attempt.lease_seconds
    heartbeat = getattr(attempt.job, "heartbeat_seconds", None)
    if heartbeat:
        window = min(window, float(heartbeat))
    if not math.isfinite(window):
        return False
    return now - attempt.lease_start >= window * GIVE_BACK_FRACTION
