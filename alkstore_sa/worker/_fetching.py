"""The fetch loops: one per queue, claiming jobs as slots free up and handing them
to handlers, or running a fast queue's jobs on the loop itself (the "Architecture" page).
"""

from __future__ import annotations

from typing import Any, TypeVar

from .. import ops
from ..errors import SchemaVersionError
from ..ops import working
from ..records import Job
from ..steps import Steps, Wait
from ._attempt import RUNNING, Attempt
from ._backoff import Backoff
from ._core import monotonic
from ._queue_state import QueueState
from ._running import Running
from .config import HandlerSpec, spec_group_limits

B = TypeVar("B")

INLINE_OVERDUE = 0.05
"""A job run on the fetch thread for longer than this is left to that thread as a
handler thread: a new fetch loop takes over the queue and the batch's other jobs
are handed off (checked by the keeper, every :data:`~alkstore_sa.worker._leases.TICK`)."""


class Fetching(Running[B]):
    """Each queue's fetch loop and claim."""

    def _fetching(self, state: QueueState, generation: int) -> Steps[None]:
        """The queue's fetch loop (number ``generation``); it ends at shutdown, or when
        a job it ran itself ran long and another loop took over (see _detaching)."""
        spec, backoff = state.spec, Backoff()
        while not self._stopping.is_set() and state.generation == generation:
            want = state.want()
            if not want:
                yield Wait(state.wake, spec.poll_interval)
                state.wake.clear()
                continue
            state.wake.clear()
            fetched_at = monotonic()
            try:
                jobs = yield from self._claiming(spec, want, state.group_counts())
            except SchemaVersionError as exc:
                # The schema is (now) at a version this release does not speak:
                # claim nothing and look again later (no crash loop; queued jobs
                # stay for a client that speaks it).
                yield Wait(self._stopping, self._refused(exc))
                continue
            except Exception as exc:
                delay = backoff.next()
                self._loop_error("fetch", spec.queue, exc, delay)
                yield Wait(self._stopping, delay)
                continue
            backoff.reset()
            self._refusals.clear()
            self._count(spec.queue, "claims")
            state.claimed(len(jobs), want)
            if jobs and self._metrics is not None:
                self._metrics.claimed(spec.queue, jobs)
            for job in jobs:
                state.group_started(job)
            attempts = [self._begin(spec, job, fetched_at) for job in jobs]
            if attempts and self._inline_jobs and state.runs_inline():
                yield from self._inline(state, attempts, generation)
                if state.generation != generation:
                    return  # one ran long: a new loop took over (see _detaching)
            else:
                for attempt in attempts:
                    self._start_job(state, attempt)
            if len(jobs) < want:
                yield Wait(state.wake, spec.poll_interval)

    def _claiming(
        self, spec: HandlerSpec, want: int, group_counts: dict[str, int] | None = None
    ) -> Steps[list[Job]]:
        """One claim: in autocommit (one round trip) unless the queue's policy
        locks keys, or its ``group_concurrency`` groups, which needs a transaction
        (as does a first, uncached claim). ``group_counts``: our running jobs per
        group, for a ``local_group_concurrency``."""
        groups = spec_group_limits(spec)
        options: dict[str, Any] = {}
        if groups is not None:
            options = {"group_concurrency": groups, "group_counts": group_counts}
        global_groups = groups is not None and group_counts is None
        autocommit = working.claims_in_autocommit(self._ctx, spec.queue, group_locks=global_groups)
        while True:
            claim = ops.fetch(
                self._ctx,
                spec.queue,
                want,
                priority=spec.priority,
                ignore_start_after=False,
                autocommit=autocommit,
                **options,
            )
            try:
                return (yield from self._op(claim, autocommit=autocommit))
            except working.NeedsTransaction:
                if not autocommit:
                    raise
                autocommit = False  # again, in a transaction of its own

    def _inline(self, state: QueueState, attempts: list[Attempt], generation: int) -> Steps[None]:
        """Run ``attempts`` on the fetch loop itself, one after the other (saves the
        hand-offs), until one runs long and the keeper hands the rest off."""
        with state.lock:
            state.pending.extend(attempts)
        while True:
            with state.lock:
                if state.generation != generation or not state.pending:
                    return
                if self._stopping.is_set():
                    # Shutdown waits for this loop: the rest run on pool threads.
                    rest = list(state.pending)
                    state.pending.clear()
                    break
                attempt = state.pending.popleft()
                attempt.inline = True
                state.inline, state.inline_since = attempt, monotonic()
            try:
                if attempt.status == RUNNING:  # not abandoned while it waited
                    yield from self._executing(state, attempt)
                else:
                    state.group_ended(attempt.job)
            finally:
                with state.lock:
                    if state.inline is attempt:
                        state.inline = None
        for attempt in rest:
            if attempt.status == RUNNING:
                attempt.inline = False
                self._start_job(state, attempt)

    def _detaching(self, state: QueueState, now: float) -> None:
        """The job the fetch loop runs itself has run past :data:`INLINE_OVERDUE`:
        leave that thread to it, start a new fetch loop, hand the rest off."""
        with state.lock:
            if state.inline is None or now - state.inline_since < INLINE_OVERDUE:
                return
            state.inline = None
            state.generation += 1
            generation = state.generation
            rest = list(state.pending)
            state.pending.clear()
        if not self._stopping.is_set():
            state.runner = self._spawn(
                self._fetching(state, generation), f"alkstore-fetch-{state.spec.queue}"
            )
        for attempt in rest:
            if attempt.status == RUNNING:
                attempt.inline = False
                self._start_job(state, attempt)
