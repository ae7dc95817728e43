"""Inline mode: a stand-in for ``QueueService`` whose ``send`` runs the handler at once."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy.orm import Session

from .. import options as opt
from ..errors import InvalidOptionsError, shown
from ..models.enums import JobState
from ..names import queue_ref
from ..records import Job
from ..worker import HandlerSpec, Worker
from ..worker._attempt import prepare_output
from .drain import handler_specs


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
        queue_ref(name)
        spec = self._specs.get(name)
        if spec is None:
            raise InvalidOptionsError("name", f"no inline handler for queue {shown(name)}")
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
