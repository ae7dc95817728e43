"""Run queued jobs synchronously with a worker's handlers (:func:`drain`, :func:`adrain`).

Re-exported by :mod:`alkstore_sa.testing`, where it is documented with the
other test helpers. Outcomes are decided exactly as the workers decide them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from ..errors import InvalidOptionsError
from ..names import DEFAULT_SCHEMA
from ..records import Job
from ..service import QueueService
from ..service_async import AsyncQueueService
from ._attempt import Kind, prepare_output
from .aio import AsyncWorker
from .config import HandlerSpec
from .threaded import Worker

Handlers = Worker | AsyncWorker | Mapping[str, Callable[..., Any] | HandlerSpec]


@dataclass(frozen=True)
class Drained:
    """What :func:`drain` did: attempts that completed and attempts that failed.

    ``errors`` holds ``(job, exception)`` for each failed attempt, in order.
    """

    completed: int = 0
    failed: int = 0
    errors: list[tuple[Job, BaseException]] = field(default_factory=list)


def handler_specs(handlers: Handlers, queue: str | None, *, want_async: bool) -> list[HandlerSpec]:
    if isinstance(handlers, Worker | AsyncWorker):
        specs = handlers.specs
    else:
        specs = {
            q: h if isinstance(h, HandlerSpec) else HandlerSpec(q, h) for q, h in handlers.items()
        }
    if queue is not None:
        if queue not in specs:
            raise InvalidOptionsError("queue", f"no handler for {queue!r}")
        specs = {queue: specs[queue]}
    for spec in specs.values():
        if spec.is_async != want_async:
            raise InvalidOptionsError(
                "handlers",
                f"{spec.queue!r} has an {'a' if spec.is_async else ''}sync handler; "
                f"use {'adrain' if spec.is_async else 'drain'}",
            )
    return list(specs.values())


Outcome = tuple[Kind, Any, BaseException | None]
"""How a handler ended: complete or fail, the output, and the error if it raised."""


class _Tally:
    def __init__(self, limit: int) -> None:
        self.limit, self.completed, self.failed = limit, 0, 0
        self.errors: list[tuple[Job, BaseException]] = []

    def count(self, job: Job, outcome: Outcome | None) -> None:
        if outcome is None or outcome[0] == "complete":
            self.completed += 1
        else:
            self.failed += 1
            if outcome[2] is not None:
                self.errors.append((job, outcome[2]))
        if self.completed + self.failed > self.limit:
            raise InvalidOptionsError(
                "max_jobs", f"more than {self.limit} attempts: do handlers keep sending jobs?"
            )

    def result(self) -> Drained:
        return Drained(self.completed, self.failed, self.errors)


def drain(
    target: Engine | Session,
    handlers: Handlers,
    queue: str | None = None,
    *,
    schema: str | None = None,
    with_scheduled: bool = False,
    max_jobs: int = 10_000,
) -> Drained:
    """Run queued jobs with ``handlers`` until none are due; return the counts.

    Handlers come from a :class:`~alkstore_sa.Worker` (its schema is used) or a
    mapping ``{queue: fn}``; ``queue`` limits the drain to one queue. Jobs sent
    by handlers are drained too. A raising handler fails its job as the worker
    would (retry, then ``failed`` and the dead letter queue); a retry that is
    due at once runs again in the same drain.

    With an :class:`~sqlalchemy.engine.Engine`, each step commits on its own.
    With a :class:`~sqlalchemy.orm.Session`, everything happens in its
    transaction (transactional handlers in a savepoint); the database clock
    stands still inside a transaction, so jobs run whatever their
    ``start_after``, as with ``with_scheduled=True``.

    Example::

        drain(engine, worker).completed
        # -> 3

    :raises InvalidOptionsError: for async handlers (use :func:`adrain`), or
        after ``max_jobs`` attempts (handlers that keep sending jobs).
    """
    specs = handler_specs(handlers, queue, want_async=False)
    if schema is None:
        schema = str(getattr(handlers, "schema", DEFAULT_SCHEMA))
    ignore = with_scheduled or isinstance(target, Session)
    tally = _Tally(max_jobs)
    progressed = True
    while progressed:
        progressed = False
        for spec in specs:
            with _step(target) as session:
                jobs = QueueService(session, schema=schema).fetch(
                    spec.queue, 100, ignore_start_after=ignore
                )
            for job in jobs:
                progressed = True
                outcome = _run(target, schema, spec, job)
                if outcome is not None:
                    with _step(target) as session:
                        _settle(QueueService(session, schema=schema), job, *outcome)
                tally.count(job, outcome)
    return tally.result()


@contextmanager
def _step(target: Engine | Session) -> Iterator[Session]:
    if isinstance(target, Session):
        yield target  # the caller's transaction: never committed here
        return
    with Session(target) as session, session.begin():
        yield session


def _run(target: Engine | Session, schema: str, spec: HandlerSpec, job: Job) -> Outcome | None:
    """Run one handler; ``None`` if it completed inside its own transaction."""
    if not spec.transactional:
        try:
            return (*prepare_output("complete", spec.fn(job)), None)
        except Exception as exc:
            return "fail", exc, exc
    try:
        with _step(target) as outer, _nested(outer, target):
            kind, output = prepare_output("complete", spec.fn(job, outer))
            if kind == "fail":
                raise _Refused(output)
            QueueService(outer, schema=schema).complete_many(job.name, [(job, output)])
        return None
    except _Refused as refused:
        return "fail", refused.output, None
    except Exception as exc:
        return "fail", exc, exc


def _nested(session: Session, target: Engine | Session) -> Any:
    # In the caller's transaction a savepoint lets a raising handler's writes
    # roll back alone; with an engine the step's own transaction does that.
    return session.begin_nested() if isinstance(target, Session) else nullcontext()


def _settle(svc: Any, job: Job, kind: Kind, output: Any, error: BaseException | None) -> Any:
    if kind == "complete":
        return svc.complete_many(job.name, [(job, output)])
    return svc.fail_many(job.name, [(job, output)])


class _Refused(Exception):
    def __init__(self, output: Any) -> None:
        self.output = output


async def adrain(
    target: AsyncEngine | AsyncSession,
    handlers: Handlers,
    queue: str | None = None,
    *,
    schema: str | None = None,
    with_scheduled: bool = False,
    max_jobs: int = 10_000,
) -> Drained:
    """:func:`drain` for async handlers (an :class:`~alkstore_sa.AsyncWorker`), with an
    :class:`~sqlalchemy.ext.asyncio.AsyncEngine` or ``AsyncSession``.

    Example::

        (await adrain(async_engine, worker)).completed
        # -> 3
    """
    specs = handler_specs(handlers, queue, want_async=True)
    if schema is None:
        schema = str(getattr(handlers, "schema", DEFAULT_SCHEMA))
    ignore = with_scheduled or isinstance(target, AsyncSession)
    tally = _Tally(max_jobs)
    progressed = True
    while progressed:
        progressed = False
        for spec in specs:
            async with _astep(target) as session:
                jobs = await AsyncQueueService(session, schema=schema).fetch(
                    spec.queue, 100, ignore_start_after=ignore
                )
            for job in jobs:
                progressed = True
                outcome = await _arun(target, schema, spec, job)
                if outcome is not None:
                    async with _astep(target) as session:
                        await _settle(AsyncQueueService(session, schema=schema), job, *outcome)
                tally.count(job, outcome)
    return tally.result()


@asynccontextmanager
async def _astep(target: AsyncEngine | AsyncSession) -> AsyncIterator[AsyncSession]:
    if isinstance(target, AsyncSession):
        yield target
        return
    async with AsyncSession(target) as session, session.begin():
        yield session


async def _arun(
    target: AsyncEngine | AsyncSession, schema: str, spec: HandlerSpec, job: Job
) -> Outcome | None:
    if not spec.transactional:
        try:
            return (*prepare_output("complete", await spec.fn(job)), None)
        except Exception as exc:
            return "fail", exc, exc
    try:
        async with _astep(target) as outer, _anested(outer, target):
            kind, output = prepare_output("complete", await spec.fn(job, outer))
            if kind == "fail":
                raise _Refused(output)
            svc = AsyncQueueService(outer, schema=schema)
            await svc.complete_many(job.name, [(job, output)])
        return None
    except _Refused as refused:
        return "fail", refused.output, None
    except Exception as exc:
        return "fail", exc, exc


def _anested(session: AsyncSession, target: AsyncEngine | AsyncSession) -> Any:
    return session.begin_nested() if isinstance(target, AsyncSession) else nullcontext()
