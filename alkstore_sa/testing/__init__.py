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

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from ..errors import InvalidOptionsError, shown
from ..names import DEFAULT_SCHEMA
from ..records import Job
from ..service import QueueService
from .drain import Drained, adrain, drain
from .inline import InlineQueueService

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
    raise InvalidOptionsError(
        "target", f"expected a Session, QueueService or Engine: {shown(target)}"
    )


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
    what = "" if data is _ANY else f" with data matching {shown(data)}"
    if count is None and not jobs:
        raise AssertionError(f"no job queued in {shown(queue)}{what}{_seen(target, queue, schema)}")
    if count is not None and len(jobs) != count:
        raise AssertionError(
            f"expected {count} job(s) queued in {shown(queue)}{what}, found {len(jobs)}"
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
        what = "" if data is _ANY else f" with data matching {shown(data)}"
        raise AssertionError(
            f"expected no job queued in {shown(queue)}{what}, found {len(jobs)}: "
            + ", ".join(repr(j.data) for j in jobs[:5])
        )


def _seen(target: Target, queue: str, schema: str) -> str:
    data = [j.data for j in enqueued(target, queue, schema=schema)][:5]
    return f"; queued there: {shown(data)}" if data else "; the queue is empty"
