"""Settlement: finished attempts written back in batches, one statement per queue
and outcome, retried until shutdown gives up (the "Architecture" page).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Sequence
from typing import Any, TypeVar

from .. import ops
from ..errors import SchemaVersionError
from ..models.enums import JobState
from ..records import FailResult, Settled
from ..steps import Steps, Wait
from . import _outcomes
from ._attempt import SETTLING, Attempt, Kind, Pending, group, prepare_output
from ._backoff import Backoff
from ._core import WorkerCore, monotonic
from .config import spec_group_limits

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")


class Settling(WorkerCore[B]):
    """The completer loop and what a finished handler becomes."""

    def _finished(
        self, attempt: Attempt, kind: Kind, value: Any, *, taken: bool = False
    ) -> Pending | None:
        """The handler returned (``complete``) or raised (``fail``).

        ``taken``: the caller already moved the attempt to ``settling``.
        """
        if not taken and not attempt.take(SETTLING):
            log.debug(
                "handler of abandoned job %s returned; result ignored",
                attempt.job.id,
                extra=self._extra("job_result_ignored", attempt),
            )
            return None
        self._forget(attempt)
        error = value if kind == "fail" and isinstance(value, BaseException) else None
        if error is not None:
            self._report(error, attempt.job)
        kind, output = prepare_output(kind, value)
        ran = None if attempt.started is None else monotonic() - attempt.started
        reason = "completed" if kind == "complete" else "failed"
        return Pending(kind, attempt, output, reason, error, ran)

    def _completing(self) -> Steps[None]:
        """Settle finished attempts in batches; retry a failed batch with backoff.

        The first settlement waits ``flush_interval`` for others, so jobs finishing
        together are settled with one statement per queue. A repeated settlement is
        harmless (fencing), so a batch is retried until shutdown gives up.
        """
        backoff = Backoff()
        while True:
            while True:
                self._inbox.event.clear()
                if self._inbox or self._closing.is_set():
                    break
                yield Wait(self._inbox.event, None)
            if not self._inbox:
                return
            if not self._closing.is_set():
                yield Wait(self._closing, self.flush_interval)
            batch = self._inbox.take()
            while batch:
                try:
                    yield from self._flushing(batch)
                    backoff.reset()
                except Exception as exc:
                    if isinstance(exc, SchemaVersionError):
                        delay = self._refused(exc)  # kept, and written once it is spoken
                    else:
                        delay = backoff.next()
                        self._loop_error("settle", None, exc, delay)
                    if (yield Wait(self._give_up, delay)):
                        log.error(
                            "gave up settling %d job(s) at shutdown; they stay active until "
                            "they expire and are then retried",
                            len(batch),
                            extra={"action": "settle_abandoned", "count": len(batch)},
                        )
                        break

    def _flushing(self, batch: list[Pending]) -> Steps[None]:
        for (queue, kind), items in group(batch).items():
            settlements = [p.attempt.settlement(p.output) for p in items]
            if kind == "complete":
                op: ops.Op[Any] = ops.complete_many(self._ctx, queue, settlements)
            else:
                op = ops.fail_many(
                    self._ctx,
                    queue,
                    settlements,
                    # The attempt history's "which worker" (when the schema keeps one).
                    worker=f"{self.name}@{socket.gethostname()}:{os.getpid()}",
                    worker_id=self._registration.id,
                )
            result = yield from self._op(op, autocommit=True)
            # Written: never write these again, even if a later group fails.
            done = set(map(id, items))
            batch[:] = [p for p in batch if id(p) not in done]
            self._settled(items, result)
            if kind == "fail" and "retry" in result.states.values():
                self.wake(queue)  # a retry without delay is due at once
            elif any(p.attempt.job.group_id is not None for p in items) and spec_group_limits(
                items[0].attempt.spec
            ):
                self.wake(queue)  # places of limited groups are free now

    def _settled(self, pendings: Sequence[Pending], result: Settled | FailResult) -> None:
        """Count and log what one complete/fail statement did."""
        if isinstance(result, FailResult):
            states = result.states
            affected = set(states)
            # dead_lettered counts the copies of the whole statement: every job of it
            # that failed for good with a dead letter queue was copied when they match.
            owed = sum(
                1
                for p in pendings
                if p.attempt.job.dead_letter is not None
                and states.get(p.attempt.job.id) == JobState.FAILED
            )
            copied = owed > 0 and result.dead_lettered >= owed
        else:
            states = {}
            affected = set(result.affected)
            copied = False
        debug = log.isEnabledFor(logging.DEBUG)
        done: dict[tuple[str, str], int] = {}
        for p in pendings:
            job, attempt = p.attempt.job, p.attempt
            if job.id not in affected:
                verb = "completed" if p.kind == "complete" else "failed"
                self._lost(attempt, f"could not be {verb}")
                continue
            counted = (job.name, "completed" if p.kind == "complete" else "failed")
            done[counted] = done.get(counted, 0) + 1
            if p.kind != "complete":
                if self._metrics is not None:
                    self._metrics.failed(job.name, states.get(job.id) == JobState.RETRY)
                _outcomes.failed(p, states.get(job.id), self.name, copied=copied)
            elif debug:
                _outcomes.completed(attempt, self.name, p.duration)
        for (queue, outcome), n in done.items():
            self._count(queue, outcome, n)
            if self._metrics is not None and outcome == "completed":
                self._metrics.completed(queue, n)
