"""Exceptions raised by alkstore_sa.

Every exception the library raises on purpose derives from :class:`AlkstoreError`.
Database errors that are not ours to interpret (connection loss, permission
denied, ...) are SQLAlchemy's own and are not wrapped.
"""

from __future__ import annotations


class AlkstoreError(Exception):
    """Root of every exception raised on purpose by alkstore_sa."""


class InvalidOptionsError(AlkstoreError, ValueError):
    """An argument or option is invalid.

    Raised before any SQL is sent, so the caller's transaction is untouched.
    The message names the offending option.
    """

    def __init__(self, option: str, problem: str) -> None:
        self.option = option
        self.problem = problem
        super().__init__(f"invalid option {option!r}: {problem}")


class InvalidNameError(InvalidOptionsError):
    """A queue, schema or schedule name is not acceptable."""


class QueueNotFoundError(AlkstoreError, LookupError):
    """The named queue does not exist in this schema."""

    def __init__(self, queue: str, schema: str | None = None) -> None:
        self.queue = queue
        self.schema = schema
        where = f" in schema {schema!r}" if schema else ""
        super().__init__(f"queue {queue!r} does not exist{where}")


class QueueExistsError(AlkstoreError):
    """``create_queue(..., exist_ok=False)`` found the queue already there."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(f"queue {queue!r} already exists")


class SchemaNotInstalledError(AlkstoreError):
    """The queue schema has not been created (run the migrations first)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        super().__init__(
            f"the alkstore/pg-boss schema {schema!r} is not installed; "
            f"run `alkstore db upgrade --schema {schema}` or `alembic upgrade alkstore@head`"
        )


class SchemaVersionError(AlkstoreError):
    """The schema exists but at a pg-boss version this library does not speak."""

    def __init__(self, schema: str, found: int | None, expected: int) -> None:
        self.schema = schema
        self.found = found
        self.expected = expected
        super().__init__(
            f"schema {schema!r} is at pg-boss schema version {found}, "
            f"alkstore_sa requires version {expected}"
            + (
                "; pg-boss offers no upgrade path from versions below 25: migrate the jobs "
                "into a fresh schema"
                if found is not None and found < expected
                else ""
            )
        )


class JobLostError(AlkstoreError):
    """A worker tried to settle a job it no longer owns (fencing rejected it).

    This happens when a job outlived its expiry, was failed by the supervisor and
    possibly fetched again by another worker.
    """
