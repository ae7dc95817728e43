"""Running one job's handler: plainly, or in a transaction with the job's completion
(the "Architecture" page).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .. import ops, tracing
from ..errors import InvalidOptionsError
from ..steps import Invoke, Steps
from . import _outcomes
from ._attempt import ABANDONED, SETTLING, Attempt, Pending
from ._core import monotonic
from ._queue_state import QueueState
from ._settling import Settling
from .config import spec_group_limits

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")


class _Lost(Exception):
    """A transactional handler's job was taken away: roll its writes back."""


class Running(Settling[B]):
    """A handler's run, and what it hands to settlement."""

    def _executing(self, state: QueueState, attempt: Attempt) -> Steps[bool]:
        """Run one job's handler; ``True`` when it was abandoned (its thread may retire)."""
        if attempt.status == ABANDONED:
            state.group_ended(attempt.job)
            return True  # abandoned as its runner took it: nothing to run
        try:
            started = monotonic()
            if attempt.spec.transactional:
                pending = yield from self._transactional(attempt)
            else:
                try:
                    result = yield Invoke(self._traced(attempt), (attempt.job,))
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    pending = self._finished(attempt, "fail", exc)
                else:
                    pending = self._finished(attempt, "complete", result)
            if attempt.status != ABANDONED:
                seconds = monotonic() - started
                state.ran(seconds)
                if self._metrics is not None:
                    self._metrics.ran(attempt.job.name, seconds)
            if pending is not None:
                self._inbox.put(pending)
        finally:
            state.group_ended(attempt.job)
            # An abandoned attempt gave its slot back when it was abandoned.
            abandoned = attempt.status == ABANDONED
            if not abandoned and state.ended(attempt):
                state.wake.set()
            elif (
                not abandoned
                and attempt.job.group_id is not None
                and spec_group_limits(attempt.spec)
            ):
                # A place of a limited group freed up: a claim may take its next job.
                state.wake.set()
        return abandoned

    def _traced(self, attempt: Attempt) -> Callable[..., Any]:
        """The handler, run in the job's ``process`` span (:mod:`alkstore_sa.tracing`)."""
        job = attempt.job
        return tracing.processing(
            attempt.spec.fn, job.name, job.id, job.retry_count, job.trace_context, self._ctx.schema
        )

    def _transactional(self, attempt: Attempt) -> Steps[Pending | None]:
        if attempt.job.heartbeat_seconds and self._ctx.backend.has("noTransactionalHeartbeat"):
            # Before the transaction begins, so the job takes the ordinary failure path
            # (as pg-boss does on such a backend, where the heartbeat's write and the
            # handler's transaction would conflict on the job's row).
            refused = InvalidOptionsError(
                "transactional",
                f"backend {str(self._ctx.backend)!r} runs no transactional handler on a "
                f"job with a heartbeat (noTransactionalHeartbeat): job {attempt.job.id} has "
                f"heartbeat_seconds {attempt.job.heartbeat_seconds}",
            )
            return self._finished(attempt, "fail", refused)
        try:
            yield Invoke(self._in_transaction, (attempt,))
        except _Lost:
            if attempt.status == SETTLING:
                self._lost(attempt, "could not be completed (handler writes rolled back)")
            return None
        except GeneratorExit:
            raise
        except BaseException as exc:
            # The handler's writes (and the completion, if it ran) rolled back
            # together: fail the job so that it runs again.
            return self._finished(attempt, "fail", exc, taken=attempt.status == SETTLING)
        self._count(attempt.job.name, "completed")
        if self._metrics is not None:
            self._metrics.completed(attempt.job.name)
        if log.isEnabledFor(logging.DEBUG):
            ran = None if attempt.started is None else monotonic() - attempt.started
            _outcomes.completed(attempt, self.name, ran)
        return None

    def _in_transaction(self, attempt: Attempt) -> Any:
        """Open a session and a transaction, and run :meth:`_committing` in it."""
        raise NotImplementedError

    def _committing(self, attempt: Attempt, session: Any) -> Steps[None]:
        """The handler and the job's completion, in the handler's transaction."""
        job = attempt.job
        result = yield Invoke(self._traced(attempt), (job, session))
        if not attempt.take(SETTLING):
            raise _Lost  # abandoned meanwhile: its fail wins, roll back
        self._forget(attempt)
        done = yield from self._op(
            ops.complete_many(self._ctx, job.name, [attempt.settlement(result)]), session
        )
        if not done.affected:
            raise _Lost
