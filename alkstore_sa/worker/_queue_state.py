"""One queue's place in a worker: its slots, its backlog, its fetch loop and the
jobs that loop runs itself.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

from ..records import Job
from ._attempt import Attempt
from .config import HandlerSpec

INLINE_SECONDS = 0.001
"""A runtime that hands jobs to other threads (``Worker``) runs the jobs it claimed
on its fetch thread instead, one after the other, while the queue's handlers take
less than this on average: waking a pool thread costs about half a millisecond."""


class QueueState:
    """One queue's slots: how many of its jobs run, and whether it has a backlog."""

    def __init__(self, spec: HandlerSpec, wake: Any) -> None:
        self.spec = spec
        self.wake = wake
        self.in_flight = 0
        self.backlog = False
        self.lock = threading.Lock()
        self.runner: Any = None  # the fetch loop's thread or task
        self.generation = 0  # which fetch loop is the queue's (see WorkerBase._detaching)
        self.inline: Attempt | None = None  # the job its fetch loop runs itself, if any
        self.inline_since = 0.0
        self.pending: deque[Attempt] = deque()  # claimed, to run on the fetch loop next
        self.run_seconds: float | None = None  # moving average of the handlers' run time
        # local_group_concurrency: the group of each of our running jobs that has one.
        self.grouped: dict[Any, str] = {}

    def group_counts(self) -> dict[str, int] | None:
        """Our running jobs per group, for a ``local_group_concurrency`` claim (else None)."""
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

    def ran(self, seconds: float) -> None:
        """A handler of the queue ran for ``seconds`` (not abandoned)."""
        with self.lock:
            avg = self.run_seconds
            self.run_seconds = seconds if avg is None else avg + 0.2 * (seconds - avg)

    def runs_inline(self) -> bool:
        """Whether claimed jobs are cheaper to run on the fetch loop than to hand off."""
        avg = self.run_seconds
        return avg is not None and avg < INLINE_SECONDS

    def want(self) -> int:
        """Jobs to claim now (0: wait for free slots)."""
        with self.lock:
            free = self.spec.concurrency - self.in_flight
            if free < self.spec.fetch_threshold(backlog=self.backlog):
                return 0
        return min(self.spec.fetch_size, free)

    def claimed(self, got: int, wanted: int) -> None:
        with self.lock:
            self.in_flight += got
            self.backlog = got == wanted

    def free(self) -> bool:
        """Give a slot back; whether the loop should look for more jobs at once."""
        with self.lock:
            self.in_flight -= 1
            return self.backlog
