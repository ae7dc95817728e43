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
from ..ops._core import may_be_schema_change
from ..records import FailResult, Settled
from ..steps import Steps, Wait
from . import _outcomes
from ._attempt import SETTLING, Attempt, Kind, Pending, cut, group, prepare_output
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
        """Settle finished attempts in batches; retry what could not be written.

        The first settlement waits ``flush_interval`` for others, so jobs finishing
        together are settled with one statement per queue. A repeated settlement is
        harmless (fencing), so what the database could not be reached for is retried,
        with backoff, until shutdown gives up; settlements finished meanwhile join the
        retry, so none waits behind another. What the database refuses for good is
        settled item by item (:meth:`_settling`).
        """
        backoff = Backoff()
        batch: list[Pending] = []
        while True:
            if not batch:
                while True:
                    self._inbox.event.clear()
                    if self._inbox or self._closing.is_set():
                        break
                    yield Wait(self._inbox.event, None)
                if not self._inbox:
                    return
                if not self._closing.is_set():
                    yield Wait(self._closing, self.flush_interval)
            batch.extend(self._inbox.take())
            error = yield from self._flushing(batch)
            if error is None:
                backoff.reset()
                continue
            if isinstance(error, SchemaVersionError):
                delay = self._refused(error)  # kept, and written once it is spoken
            else:
                delay = backoff.next()
                self._loop_error("settle", None, error, delay)
            if (yield Wait(self._give_up, delay)):
                log.error(
                    "gave up settling %d job(s) at shutdown; they stay active until "
                    "they expire and are then retried",
                    len(batch),
                    extra={"action": "settle_abandoned", "count": len(batch)},
                )
                batch = []

    def _flushing(self, batch: list[Pending]) -> Steps[BaseException | None]:
        """Settle ``batch``, one statement per queue and outcome; what was settled (or
        given up) leaves it. The first error that leaves something to retry, or None."""
        error: BaseException | None = None
        for (queue, kind), items in group(batch).items():
            failure = yield from self._settling(queue, kind, items, batch)
            if error is None:
                error = failure
        return error

    def _settling(
        self, queue: str, kind: Kind, items: list[Pending], batch: list[Pending]
    ) -> Steps[BaseException | None]:
        """Settle ``items`` with one statement; an error to retry them for, or None.

        A statement the database refuses for good (a value it will not store, a trigger
        or a constraint that refuses, a missing privilege: :func:`refused_for_good`) is
        run again item by item, and an item refused alone is failed with a small output
        saying why (:meth:`_substitute`); the other items are settled as usual.
        """
        refusal: BaseException | None = None
        try:
            result = yield from self._statement(queue, kind, items)
        except Exception as exc:
            if not refused_for_good(exc, items):
                return exc
            refusal = exc
        if refusal is None:
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
            return None
        if len(items) > 1:
            error: BaseException | None = None
            for p in items:
                failure = yield from self._settling(queue, kind, [p], batch)
                if error is None:
                    error = failure
            return error
        [p] = items
        batch[:] = [q for q in batch if q is not p]
        substitute = self._substitute(p, refusal)
        if substitute is None:
            return None
        batch.append(substitute)
        return (yield from self._settling(queue, "fail", [substitute], batch))

    def _statement(self, queue: str, kind: Kind, items: list[Pending]) -> Steps[Any]:
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
                autocommit=True,
            )
        return (yield from self._op(op, autocommit=True))

    def _substitute(self, p: Pending, refusal: BaseException) -> Pending | None:
        """The small failure that replaces ``p``, which the database refused for good;
        None (the job given up, to expire) when ``p`` was already such a failure."""
        job = p.attempt.job
        reason = refusal_text(refusal)
        extra = {
            "action": "settlement_refused",
            "worker": self.name,
            "queue": job.name,
            "job_id": str(job.id),
            "kind": p.kind,
            "error": reason,
        }
        if p.substitute:
            log.error(
                "the database refused to fail job %s of %r even with a small output (%s); "
                "it stays active until its lease runs out",
                job.id,
                job.name,
                reason,
                extra={**extra, "action": "settlement_given_up"},
            )
            self._lost(p.attempt, "could not be failed")
            return None
        log.warning(
            "the database refused to %s job %s of %r (%s); failing it alone with a small "
            "output, the worker's other settlements go on",
            p.kind,
            job.id,
            job.name,
            reason,
            extra=extra,
        )
        if p.kind == "complete":
            message = f"could not complete job {job.id}: the database refused it ({reason})"
        else:
            name, said = _outcomes.error_of(p.output)
            message = (
                f"could not fail job {job.id} with its error ({cut(f'{name}: {said}', 2048)}): "
                f"the database refused it ({reason})"
            )
        output = {"name": "SettlementRefused", "message": message}
        return Pending("fail", p.attempt, output, "refused", p.error, p.duration, substitute=True)

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


# SQLSTATE classes of errors that retrying the same statement cannot mend: a value the
# database will not store (22), a constraint or trigger that refuses it (23, P0, 38, 39),
# a missing privilege (42), a limit the value passes (54). Connection loss (08), a
# serialization failure or deadlock (40), a lack of resources (53), a lock (55), an
# administrator's cancel or shutdown (57) pass, and are retried.
_REFUSED_CLASSES = frozenset({"22", "23", "2F", "38", "39", "42", "44", "54", "P0"})


def refused_for_good(error: BaseException, items: Sequence[Pending]) -> bool:
    """Whether ``error``, met settling ``items``, would only come again.

    An error raised before any SQL (an output no statement can carry) is; a database
    error is when its SQLSTATE class says so (:data:`_REFUSED_CLASSES`). An error that a
    changed schema would raise (the version is read again, and the items retried in its
    statements) is the first time, and a refusal the second.
    """
    from sqlalchemy.exc import DBAPIError, SQLAlchemyError

    if isinstance(error, SchemaVersionError):
        return False
    if not isinstance(error, SQLAlchemyError):
        return True
    if not isinstance(error, DBAPIError):
        return False
    code = getattr(error.orig, "sqlstate", None)
    if not isinstance(code, str) or code[:2] not in _REFUSED_CLASSES:
        return False
    if may_be_schema_change(error) and not all(p.retried_change for p in items):
        for p in items:
            p.retried_change = True
        return False
    return True


def refusal_text(error: BaseException) -> str:
    """What the database (or the encoder) said, in one bounded line: the driver's
    message without SQLAlchemy's statement and parameters."""
    orig = getattr(error, "orig", None)
    said = str(orig if orig is not None else error).strip()
    line = said.splitlines()[0] if said else type(error).__name__
    return cut(line, 2048)
