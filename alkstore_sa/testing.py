"""Helpers for testing code that enqueues and works jobs (in the spirit of Oban.Testing).

Three tools, all for your own test suite:

- :func:`assert_enqueued` / :func:`refute_enqueued` look for queued jobs, inside
  your test's transaction if you pass its session::

      def test_signup_sends_a_welcome_email(session):
          signup(session, "ada@example.com")
          assert_enqueued(session, "emails", data={"to": "ada@example.com"})

- :func:`drain` runs the queued jobs with your worker's handlers, synchronously,
  until none are left, and returns counts (:func:`adrain` for async handlers)::

      result = drain(engine, worker)
      assert result.completed == 3 and result.failed == 0

- :class:`InlineQueueService` stands in for :class:`~alkstore_sa.QueueService`
  where no database is wanted: ``send`` runs the handler at once.

All of them take ``schema=`` when the queue schema is not ``pgboss`` (a
:class:`~alkstore_sa.QueueService` argument brings its own).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from . import options as opt
from .errors import InvalidOptionsError
from .models.enums import JobState
from .names import DEFAULT_SCHEMA, validate_queue
from .records import Job
from .service import QueueService
from .worker import HandlerSpec, Worker
from .worker._attempt import prepare_output
from .worker.drain import Drained, adrain, drain, handler_specs

__all__ = [
    "Drained",
    "InlineQueueService",
    "adrain",
    "assert_enqueued",
    "drain",
    "enqueued",
    "refute_enqueued",
]

_ANY: Any = object()

Target = Session | QueueService | Engine


# ---------------------------------------------------------------- assertions


def _service(target: Target, schema: str) -> tuple[QueueService, Session | None]:
    if isinstance(target, QueueService):
        return target, None
    if isinstance(target, Session):
        return QueueService(target, schema=schema), None
    if isinstance(target, Engine):
        session = Session(target)
        return QueueService(session, schema=schema), session
    raise InvalidOptionsError("target", f"expected a Session, QueueService or Engine: {target!r}")


def _matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and actual[k] == v for k, v in expected.items()
        )
    return bool(expected == actual)


def enqueued(
    target: Target, queue: str, *, data: Any = _ANY, schema: str = DEFAULT_SCHEMA
) -> list[Job]:
    """The queued (``created`` or ``retry``) jobs of ``queue`` matching ``data``, oldest first.

    ``data`` given as a mapping matches jobs whose data has at least those keys
    with those values; any other value must equal the job's data.
    """
    svc, own = _service(target, schema)
    try:
        jobs = [
            job
            for state in ("created", "retry")
            for job in svc.list_jobs(queue, state, limit=10_000)
        ]
    finally:
        if own is not None:
            own.close()
    jobs.sort(key=lambda j: (j.created_on, j.id))
    return [j for j in jobs if data is _ANY or _matches(data, j.data)]


def assert_enqueued(
    target: Target,
    queue: str,
    *,
    data: Any = _ANY,
    count: int | None = None,
    schema: str = DEFAULT_SCHEMA,
) -> list[Job]:
    """Assert that ``queue`` holds a matching queued job (exactly ``count`` if given).

    Passing the session of the code under test sees its uncommitted jobs.
    Returns the matching jobs.

    Example::

        assert_enqueued(session, "emails", data={"to": "ada@example.com"}, count=1)
    """
    jobs = enqueued(target, queue, data=data, schema=schema)
    what = "" if data is _ANY else f" with data matching {data!r}"
    if count is None and not jobs:
        raise AssertionError(f"no job queued in {queue!r}{what}{_seen(target, queue, schema)}")
    if count is not None and len(jobs) != count:
        raise AssertionError(
            f"expected {count} job(s) queued in {queue!r}{what}, found {len(jobs)}"
            + _seen(target, queue, schema)
        )
    return jobs


def refute_enqueued(
    target: Target, queue: str, *, data: Any = _ANY, schema: str = DEFAULT_SCHEMA
) -> None:
    """Assert that ``queue`` holds no matching queued job.

    Example::

        refute_enqueued(session, "emails")
    """
    jobs = enqueued(target, queue, data=data, schema=schema)
    if jobs:
        what = "" if data is _ANY else f" with data matching {data!r}"
        raise AssertionError(
            f"expected no job queued in {queue!r}{what}, found {len(jobs)}: "
            + ", ".join(repr(j.data) for j in jobs[:5])
        )


def _seen(target: Target, queue: str, schema: str) -> str:
    data = [j.data for j in enqueued(target, queue, schema=schema)][:5]
    return f"; queued there: {data!r}" if data else "; the queue is empty"


# ---------------------------------------------------------------- inline mode


class InlineQueueService:
    """A stand-in for :class:`~alkstore_sa.QueueService` whose ``send`` runs the
    handler at once, with no database: for unit tests of code that enqueues.

    Example::

        jobs = InlineQueueService({"emails": send_email})
        signup(jobs, "ada@example.com")        # calls jobs.send("emails", {...})
        [job.output for job in jobs.performed]
        # -> [{'value': 'sent'}]

    Options are validated as ``send`` would, then ignored: the handler runs once,
    now, whatever ``start_after``, and is not retried. ``performed`` lists every
    job as it ended (``completed`` or ``failed``, with its output).

    :param handlers: a :class:`~alkstore_sa.Worker` or ``{queue: fn}`` (sync).
    :param session: passed to transactional handlers.
    :param raise_errors: re-raise a handler's exception after recording the job
        as failed (the default: a test should see the error).
    :raises InvalidOptionsError: from ``send`` for a queue without a handler, a
        bad option or data JSON cannot encode.
    """

    def __init__(
        self,
        handlers: Worker | Mapping[str, Callable[..., Any] | HandlerSpec],
        *,
        session: Session | None = None,
        raise_errors: bool = True,
    ) -> None:
        self._specs = {s.queue: s for s in handler_specs(handlers, None, want_async=False)}
        self.session = session
        self.raise_errors = raise_errors
        self.performed: list[Job] = []

    def send(self, name: str, data: Any = None, **options: Any) -> uuid.UUID:
        """Run ``name``'s handler on a job made of ``data`` and ``options``; return its id."""
        validate_queue(name)
        spec = self._specs.get(name)
        if spec is None:
            raise InvalidOptionsError("name", f"no inline handler for queue {name!r}")
        checked = opt.send_options(options)
        opt.encode_json("data", data)
        job = _inline_job(name, data, checked)
        try:
            result = spec.fn(job, self.session) if spec.transactional else spec.fn(job)
        except Exception as exc:
            self.performed.append(_ended(job, JobState.FAILED, opt.error_output(exc)))
            if self.raise_errors:
                raise
            return job.id
        kind, output = prepare_output("complete", result)
        state = JobState.COMPLETED if kind == "complete" else JobState.FAILED
        self.performed.append(_ended(job, state, output))
        return job.id

    def send_many(self, name: str, jobs: Iterable[Mapping[str, Any]]) -> list[uuid.UUID]:
        """:meth:`send` for each ``{"data": ..., **options}`` item, in order."""
        out = []
        for item in jobs:
            options = dict(item)
            out.append(self.send(name, options.pop("data", None), **options))
        return out

    def send_after(self, name: str, data: Any, start_after: Any, **options: Any) -> uuid.UUID:
        """:meth:`send`; the delay is validated, then ignored."""
        opt.start_after(start_after)
        return self.send(name, data, **options)


# The send options stored as they are in a job column; the other columns describe
# where the job is in its life (start_after too: an inline job runs now).
_STORED = tuple(o for o in opt.OPTIONS if o.send and o.public and o.job_column)


def _inline_job(name: str, data: Any, checked: Mapping[str, Any]) -> Job:
    """The job ``send`` would store, from checked options over pg-boss's defaults
    (inline mode has no queue whose values a job could take)."""
    now = dt.datetime.now(dt.UTC)
    values = {**opt.INLINE_DEFAULTS, **checked}
    fields = {str(o.job_column): values[o.name] for o in _STORED}
    fields["id"] = values["id"] or uuid.uuid4()
    return Job(
        name=name,
        data=data,
        state=JobState.ACTIVE,
        retry_count=0,
        singleton_on=None,
        start_after=now,
        created_on=now,
        started_on=now,
        completed_on=None,
        keep_until=now + dt.timedelta(seconds=values["retention_seconds"]),
        output=None,
        policy=None,
        **fields,
    )


def _ended(job: Job, state: JobState, output: Any) -> Job:
    return dataclasses.replace(
        job, state=state, output=output, completed_on=dt.datetime.now(dt.UTC)
    )
