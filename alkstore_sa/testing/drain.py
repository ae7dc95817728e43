"""Run queued jobs synchronously with a worker's handlers (:func:`drain`, :func:`adrain`).

Re-exported by :mod:`alkstore_sa.testing`, where it is documented with the
other test helpers. Outcomes are decided exactly as the workers decide them.
The drain is written once (:func:`_draining`, a generator of steps, see
:mod:`alkstore_sa.steps`); :func:`drain` answers its steps with a ``Session`` and
:func:`adrain` with an ``AsyncSession``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession
from sqlalchemy.orm import Session

from .. import ops
from .._engine_cache import execution_options, make_context
from ..errors import InvalidOptionsError, shown
from ..models.enums import JobState
from ..names import DEFAULT_SCHEMA
from ..ops import driver
from ..records import Job
from ..steps import Invoke, Run, Steps, aanswering, adrive, answering, drive
from ..worker import AsyncWorker, HandlerSpec, Worker
from ..worker._attempt import Kind, prepare_output

Handlers = Worker | AsyncWorker | Mapping[str, Callable[..., Any] | HandlerSpec]


@dataclass(frozen=True)
class Drained:
    """What :func:`drain` did, with jobs and attempts counted apart.

    A job that fails twice and then completes is one job completed and two
    attempts failed: ``jobs_completed == 1``, ``attempts_failed == 2``,
    ``jobs_failed == 0``.

    :ivar completed: jobs completed (also :attr:`jobs_completed`). A job completes
        once, so this is also the attempts that completed.
    :ivar failed: attempts that failed (also :attr:`attempts_failed`), counting
        each retry of a job again; not the jobs that failed, which is
        :attr:`jobs_failed`. Kept under this name for compatibility.
    :ivar errors: ``(job, exception)`` for each failed attempt whose handler
        raised, in order (a result JSON cannot encode fails the attempt too, with
        no exception here).
    :ivar jobs_failed: jobs whose last attempt in the drain failed them for good:
        they are in state ``failed`` (and copied to the dead letter queue, if the
        queue has one).
    :ivar jobs_retrying: jobs whose last attempt in the drain failed with retries
        left and that wait in state ``retry`` for a retry not due yet (a retry due
        at once runs in the same drain).
    """

    completed: int = 0
    failed: int = 0
    errors: list[tuple[Job, BaseException]] = field(default_factory=list)
    jobs_failed: int = 0
    jobs_retrying: int = 0

    @property
    def jobs_completed(self) -> int:
        """Jobs completed: the same number as :attr:`completed`."""
        return self.completed

    @property
    def attempts_failed(self) -> int:
        """Attempts that failed, each retry counted: the same number as :attr:`failed`."""
        return self.failed


def handler_specs(handlers: Handlers, queue: str | None, *, want_async: bool) -> list[HandlerSpec]:
    if isinstance(handlers, Worker | AsyncWorker):
        specs = handlers.specs
    else:
        specs = {
            q: h if isinstance(h, HandlerSpec) else HandlerSpec(q, h) for q, h in handlers.items()
        }
    if queue is not None:
        if queue not in specs:
            raise InvalidOptionsError("queue", f"no handler for {shown(queue)}")
        specs = {queue: specs[queue]}
    for spec in specs.values():
        if spec.is_async != want_async:
            raise InvalidOptionsError(
                "handlers",
                f"{shown(spec.queue)} has an {'a' if spec.is_async else ''}sync handler; "
                f"use {'adrain' if spec.is_async else 'drain'}",
            )
    return list(specs.values())


Outcome = tuple[Kind, Any, BaseException | None]
"""How a handler ended: complete or fail, the output, and the error if it raised."""


class _Tally:
    def __init__(self, limit: int) -> None:
        self.limit, self.completed, self.failed = limit, 0, 0
        self.errors: list[tuple[Job, BaseException]] = []
        self.ended: dict[Any, JobState] = {}  # each failed job's state after its last fail

    def count(self, job: Job, outcome: Outcome | None, state: JobState | None = None) -> None:
        """One attempt of ``job`` ended: completed, or failed into ``state``."""
        if outcome is None or outcome[0] == "complete":
            self.completed += 1
            self.ended.pop(job.id, None)
        else:
            self.failed += 1
            if outcome[2] is not None:
                self.errors.append((job, outcome[2]))
            if state is None:
                self.ended.pop(job.id, None)  # not failed by this drain (fenced)
            else:
                self.ended[job.id] = state
        if self.completed + self.failed > self.limit:
            raise InvalidOptionsError(
                "max_jobs", f"more than {self.limit} attempts: do handlers keep sending jobs?"
            )

    def result(self) -> Drained:
        states = list(self.ended.values())
        return Drained(
            self.completed,
            self.failed,
            self.errors,
            jobs_failed=states.count(JobState.FAILED),
            jobs_retrying=states.count(JobState.RETRY),
        )


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

        result = drain(engine, worker)
        (result.jobs_completed, result.jobs_failed, result.attempts_failed)
        # -> (3, 0, 1)

    :raises InvalidOptionsError: for async handlers (use :func:`adrain`), or
        after ``max_jobs`` attempts (handlers that keep sending jobs).
    """
    plan = _Plan(handlers, queue, schema, want_async=False)
    engine = target.get_bind() if isinstance(target, Session) else target
    ctx, options = _context(plan.schema, engine)
    in_session = isinstance(target, Session)
    caller: Session | None = target if isinstance(target, Session) else None

    def run(step: Any) -> Any:
        on = step.session or caller  # the caller's transaction, if given
        if on is not None:
            return driver.run(on, step.op, options)
        with Session(engine) as session, session.begin():
            return driver.run(session, step.op, options)

    answer = answering(run)

    def in_transaction(spec: HandlerSpec, job: Job) -> None:
        # In the caller's transaction a savepoint lets a raising handler's writes
        # roll back alone; with an engine a transaction of its own does that.
        if isinstance(target, Session):
            with target.begin_nested():
                drive(_committing(ctx, spec, job, target), answer)
        else:
            with Session(target) as session, session.begin():
                drive(_committing(ctx, spec, job, session), answer)

    steps = _draining(
        ctx,
        plan,
        ignore_start_after=with_scheduled or in_session,
        max_jobs=max_jobs,
        in_transaction=in_transaction,
    )
    return drive(steps, answer)


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
    plan = _Plan(handlers, queue, schema, want_async=True)
    if isinstance(target, AsyncSession):
        engine = target.sync_session.get_bind()
    else:
        engine = target.sync_engine
    ctx, options = _context(plan.schema, engine)
    in_session = isinstance(target, AsyncSession)

    async def run(step: Any) -> Any:
        if step.session is not None:
            return await driver.arun(step.session, step.op, options)
        if isinstance(target, AsyncSession):
            return await driver.arun(target, step.op, options)  # the caller's transaction
        async with AsyncSession(target) as session, session.begin():
            return await driver.arun(session, step.op, options)

    answer = aanswering(run)

    async def in_transaction(spec: HandlerSpec, job: Job) -> None:
        if isinstance(target, AsyncSession):
            async with target.begin_nested():
                await adrive(_committing(ctx, spec, job, target), answer)
        else:
            async with AsyncSession(target) as session, session.begin():
                await adrive(_committing(ctx, spec, job, session), answer)

    steps = _draining(
        ctx,
        plan,
        ignore_start_after=with_scheduled or in_session,
        max_jobs=max_jobs,
        in_transaction=in_transaction,
    )
    return await adrive(steps, answer)


class _Plan:
    def __init__(
        self, handlers: Handlers, queue: str | None, schema: str | None, *, want_async: bool
    ) -> None:
        self.specs = handler_specs(handlers, queue, want_async=want_async)
        self.schema = str(getattr(handlers, "schema", DEFAULT_SCHEMA)) if schema is None else schema


def _context(schema: str, engine: Any) -> tuple[ops.Context, dict[str, Any]]:
    ctx, _ = make_context(schema, notify=True, engine=engine)
    return ctx, execution_options(ctx.schema)


def _draining(
    ctx: ops.Context,
    plan: _Plan,
    *,
    ignore_start_after: bool,
    max_jobs: int,
    in_transaction: Callable[[HandlerSpec, Job], Any],
) -> Steps[Drained]:
    yield Run(ops.check_schema(ctx))  # before any statement on the jobs, as the services
    tally = _Tally(max_jobs)
    progressed = True
    while progressed:
        progressed = False
        for spec in plan.specs:
            jobs = yield Run(
                ops.fetch(
                    ctx, spec.queue, 100, priority=True, ignore_start_after=ignore_start_after
                )
            )
            for job in jobs:
                progressed = True
                outcome = yield from _attempt(spec, job, in_transaction)
                state: JobState | None = None
                if outcome is not None:
                    kind, output, _ = outcome
                    if kind == "complete":
                        yield Run(ops.complete_many(ctx, job.name, [(job, output)]))
                    else:
                        failed = yield Run(ops.fail_many(ctx, job.name, [(job, output)]))
                        state = failed.states.get(job.id)
                tally.count(job, outcome, state)
    return tally.result()


def _attempt(
    spec: HandlerSpec, job: Job, in_transaction: Callable[[HandlerSpec, Job], Any]
) -> Steps[Outcome | None]:
    """Run one handler; ``None`` if it completed inside its own transaction."""
    try:
        if spec.transactional:
            yield Invoke(in_transaction, (spec, job))
            return None
        return (*prepare_output("complete", (yield Invoke(spec.fn, (job,)))), None)
    except _Refused as refused:
        return "fail", refused.output, None
    except Exception as exc:
        return "fail", exc, exc


def _committing(ctx: ops.Context, spec: HandlerSpec, job: Job, session: Any) -> Steps[None]:
    kind, output = prepare_output("complete", (yield Invoke(spec.fn, (job, session))))
    if kind == "fail":
        raise _Refused(output)
    yield Run(ops.complete_many(ctx, job.name, [(job, output)]), session)


class _Refused(Exception):
    def __init__(self, output: Any) -> None:
        self.output = output
