"""The fetch loops: one per queue, claiming jobs as handler slots and buffer places
free up, and the runners that take them from the buffer (the "Architecture" page).
"""

from __future__ import annotations

import logging
import shlex
import uuid
from typing import Any, TypeVar

from .. import ops
from .._humanize import duration as human_duration
from ..errors import QueueNotFoundError, SchemaVersionError
from ..names import DEFAULT_SCHEMA
from ..ops import working
from ..records import Job
from ..steps import Steps, Wait
from ._attempt import ABANDONED, Attempt
from ._backoff import Backoff
from ._core import monotonic
from ._queue_state import QueueState
from ._running import Running
from .config import HandlerSpec, spec_group_limits

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")

MISSING_QUEUE_REPEAT_SECONDS = 300.0
"""How often a fetch loop whose queue does not exist says so again at WARNING."""


def create_command(queue: str, schema: str) -> str:
    """The ``alkstore`` command that creates ``queue`` in ``schema``."""
    where = "" if schema == DEFAULT_SCHEMA else f" --schema {shlex.quote(schema)}"
    return f"alkstore queue create {shlex.quote(queue)}{where}"


def create_call(queue: str, schema: str) -> str:
    """The Python call that creates ``queue`` in ``schema``."""
    where = "" if schema == DEFAULT_SCHEMA else f", schema={schema!r}"
    return f"QueueService(session{where}).create_queue({queue!r})"


class Fetching(Running[B]):
    """Each queue's fetch loop and claim."""

    def _fetching(self, state: QueueState) -> Steps[None]:
        """The queue's fetch loop: claim into the buffer while it has room, start
        runners for what it claimed; it ends at shutdown."""
        spec, backoff = state.spec, Backoff()
        groups = spec_group_limits(spec)
        while not self._stopping.is_set():
            # The policy cache may change under a running worker: looked at every time.
            state.ahead_allowed = working.claims_ahead(self._ctx, spec.queue, groups)
            want = state.want()
            if not want:
                yield Wait(state.wake, spec.poll_interval)
                state.wake.clear()
                continue
            state.wake.clear()
            fetched_at = monotonic()
            try:
                jobs = yield from self._claiming(spec, want, state.group_counts())
            except QueueNotFoundError as exc:
                delay = backoff.next()
                self._queue_missing(state, exc, delay)
                yield Wait(self._stopping, delay)
                continue
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
            if state.missing_since is not None:
                self._queue_found(state)
            self._count(spec.queue, "claims")
            if jobs and self._metrics is not None:
                self._metrics.claimed(spec.queue, jobs)
            for job in jobs:
                state.group_started(job)
            state.claimed(self._begin(spec, jobs, fetched_at), want)
            self._dispatch(state)
            if len(jobs) < want:
                yield Wait(state.wake, spec.poll_interval)

    def _queue_missing(self, state: QueueState, exc: QueueNotFoundError, delay: float) -> None:
        """A claim found no queue: say how to create it, at WARNING once and then every
        :data:`MISSING_QUEUE_REPEAT_SECONDS` while it is missing (DEBUG between), and
        report it to ``on_error`` as often."""
        now = monotonic()
        queue = state.spec.queue
        first = state.missing_since is None
        if first:
            state.missing_since = now
        elif now - state.missing_said < MISSING_QUEUE_REPEAT_SECONDS:
            log.debug(
                "queue %r still does not exist; looking again in %.1f s",
                queue,
                delay,
                extra={"action": "queue_missing", "worker": self.name, "queue": queue},
            )
            return
        state.missing_said = now
        log.warning(
            "worker %s: queue %r does not exist in schema %r%s, so its handler gets no jobs; "
            "create it with `%s` or %s; the worker looks again every few seconds "
            "and repeats this every %s while it is missing",
            self.name,
            queue,
            self.schema,
            "" if first else f" (for {human_duration(now - (state.missing_since or now))})",
            create_command(queue, self.schema),
            create_call(queue, self.schema),
            human_duration(MISSING_QUEUE_REPEAT_SECONDS),
            extra={
                "action": "queue_missing",
                "worker": self.name,
                "queue": queue,
                "schema": self.schema,
                "delay": delay,
            },
        )
        self._report(exc, None)

    def _queue_found(self, state: QueueState) -> None:
        """A queue said missing answered a claim: say so once."""
        queue, since = state.spec.queue, state.missing_since
        state.missing_since = None
        log.info(
            "worker %s: queue %r exists now (missing for %s); fetching its jobs",
            self.name,
            queue,
            human_duration(monotonic() - (since or 0.0)),
            extra={"action": "queue_found", "worker": self.name, "queue": queue},
        )

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
                liveness=self._liveness_of(spec),
                claimer=self._claimer(),
                **options,
            )
            try:
                return (yield from self._op(claim, autocommit=autocommit))
            except working.NeedsTransaction:
                if not autocommit:
                    raise
                autocommit = False  # again, in a transaction of its own

    def _claimer(self) -> tuple[uuid.UUID, int] | None:
        """Schema 26: who our claims say holds the job, and the seconds after the
        keeper's last renewal that it counts as gone (``liveness_seconds``; ``None``:
        claims record nothing). The claim ignores it at 46 (heartbeats)."""
        if self.liveness_seconds is None:
            return None
        return self._claimer_id, self.liveness_seconds

    def _liveness_of(self, spec: HandlerSpec) -> int | None:
        """The heartbeat a claim of ``spec``'s queue gives a job without one (schema 46;
        the claim ignores it at 26): ``liveness_seconds``, except for a transactional
        handler on a backend that runs none on a job with a heartbeat."""
        if spec.transactional and self._ctx.backend.has("noTransactionalHeartbeat"):
            return None
        return self.liveness_seconds

    def _dispatch(self, state: QueueState) -> None:
        """Start runners for buffered jobs while the queue may have more runners:
        ``concurrency`` of them, or one for a queue of fast handlers on a runtime
        that runs them inline, plus one per job of it that runs long."""
        inline = self._inline_jobs and state.runs_inline()
        while (attempt := state.new_runner(monotonic(), inline=inline)) is not None:
            self._start_runner(state, attempt)

    def _handling(self, state: QueueState, attempt: Attempt) -> Steps[bool]:
        """A runner: ``attempt``, then the buffered jobs that follow it, until the
        buffer is empty, the queue wants fewer runners or the worker stops.
        ``True`` when a job was abandoned under it (its thread may retire)."""
        while True:
            if (yield from self._executing(state, attempt)):
                return True
            inline = self._inline_jobs and state.runs_inline()
            following = state.next_job(monotonic(), inline=inline, stopping=self._stopping.is_set())
            if following is None:
                return False
            following.handle = attempt.handle
            attempt = following

    def _giving_back(self) -> Steps[None]:
        """At a graceful stop, once the fetch loops have ended: the buffered jobs
        go back to their queues, no attempt counted. Should that fail, they stay
        active and expire as a crashed worker's jobs do."""
        for state in self._queues.values():
            yield from self._give_back(state, state.take_buffer(), "at shutdown")

    def _give_back(self, state: QueueState, taken: list[Attempt], why: str) -> Steps[None]:
        """Buffered jobs ``taken`` out of ``state``'s buffer, never started: back to
        their queue, no attempt counted, fenced on their claim. One no longer ours
        (expired, cancelled, deleted meanwhile) is counted lost, never run."""
        attempts = [a for a in taken if a.take(ABANDONED)]
        if not attempts:
            return
        for attempt in attempts:
            self._forget(attempt)
            state.group_ended(attempt.job)
        queue = state.spec.queue
        try:
            given = yield from self._op(
                ops.give_back(self._ctx, queue, [a.settlement() for a in attempts]),
                autocommit=True,
            )
        except Exception as exc:
            self._loop_error("give_back", queue, exc, 0.0)
            return
        back = set(given)
        for attempt in attempts:
            if attempt.job.id not in back:
                self._lost(attempt, "was no longer active when given back unstarted")
        log.debug(
            "gave %d buffered job(s) of %r back to the queue %s",
            len(back),
            queue,
            why,
            extra={
                "action": "jobs_given_back",
                "worker": self.name,
                "queue": queue,
                "count": len(back),
            },
        )
