"""Exceptions raised by alkstore_sa.

Every exception the library raises on purpose derives from :class:`AlkstoreError`.
Database errors that are not ours to interpret (connection loss, permission
denied, ...) are SQLAlchemy's own and are not wrapped.
"""

from __future__ import annotations

import reprlib
from collections.abc import Collection, Sequence

from .schema_versions import NEWEST_KNOWN_SCHEMA_VERSION

_SHOWN = reprlib.Repr()
_SHOWN.maxstring = _SHOWN.maxother = 120
_SHOWN.maxlevel = 4
_SHOWN.maxlist = _SHOWN.maxtuple = _SHOWN.maxset = _SHOWN.maxfrozenset = 8
_SHOWN.maxdict = _SHOWN.maxdeque = _SHOWN.maxarray = 8


def shown(value: object) -> str:
    """``repr(value)`` for a message, bounded: at most about 120 characters of a
    string, 8 items and 4 levels of a container, whatever the caller passed (a
    value nested 2,000 deep would make ``repr`` itself fail; one of 100,000
    characters would make a log line of them)."""
    try:
        return _SHOWN.repr(value)
    except Exception:  # a __repr__ of the caller's own that fails
        return f"<{type(value).__name__}>"


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
        super().__init__(f"invalid option {shown(option)}: {problem}")


class InvalidNameError(InvalidOptionsError):
    """A queue, schema or schedule name is not acceptable."""


class QueueNotFoundError(AlkstoreError, LookupError):
    """The named queue does not exist in this schema."""

    def __init__(self, queue: str, schema: str | None = None) -> None:
        self.queue = queue
        self.schema = schema
        where = f" in schema {shown(schema)}" if schema else ""
        super().__init__(f"queue {shown(queue)} does not exist{where}")


class UnknownPolicyError(AlkstoreError):
    """The queue's row holds a policy this release does not know.

    Another client (a newer pg-boss, a SQL console) wrote it. Nothing is sent to or
    claimed from such a queue, since what its policy promises is unknown; every other
    queue goes on. :attr:`policy` is the raw text of the row."""

    def __init__(self, queue: str, policy: str) -> None:
        self.queue = queue
        self.policy = policy
        super().__init__(
            f"queue {shown(queue)} has policy {shown(policy)}, which this release does not know: "
            "it neither sends to nor claims from it"
        )


class QueueExistsError(AlkstoreError):
    """``create_queue(..., exist_ok=False)`` found the queue already there."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        super().__init__(f"queue {shown(queue)} already exists")


class SchemaNotInstalledError(AlkstoreError):
    """The queue schema has not been created (run the migrations first)."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        super().__init__(
            f"the alkstore/pg-boss schema {shown(schema)} is not installed; "
            f"run `alkstore db upgrade --schema {schema}` or `alembic upgrade alkstore@head`"
        )


class SchemaVersionError(AlkstoreError):
    """The schema exists but at a pg-boss version this library does not speak.

    The message names the version found and what to do about it; nothing has been
    changed in the database.
    """

    def __init__(
        self,
        schema: str,
        found: int | None,
        expected: int,
        *,
        spoken: Collection[int] | None = None,
    ) -> None:
        self.schema = schema
        self.found = found
        self.expected = expected
        if spoken is None or found is None or found < min(spoken):
            message = _advice(schema, found, expected)
        else:
            message = _runtime_advice(schema, found, sorted(spoken))
        super().__init__(message)


def _runtime_advice(schema: str, found: int, spoken: list[int]) -> str:
    """One line for a runtime (service, worker, supervisor) refusing ``found``."""
    newest = NEWEST_KNOWN_SCHEMA_VERSION
    head = f"schema {shown(schema)} is at pg-boss schema version {found}, "
    speaks = f"alkstore_sa speaks {' and '.join(map(str, spoken))}"
    if found > newest:
        return (
            head + f"newer than this alkstore_sa knows (up to {newest}); upgrade alkstore_sa "
            f"({speaks})"
        )
    if found < newest:
        # Between two spoken versions a runtime would be half-working: some
        # statements of the older version still run, others fail. Refused whole.
        return (
            head + f"which no alkstore_sa runtime speaks ({speaks}): run `alkstore db upgrade "
            f"--schema-version {newest} --schema {schema}`, or let Node pg-boss 12.38 migrate it"
        )
    return (
        head + f"which this alkstore_sa release does not speak yet ({speaks}): keep Node "
        f"pg-boss 11.1.x-12.5.x and alkstore_sa on a schema at {spoken[0]}, or use another schema"
    )


class SchemaVersionChangedError(AlkstoreError):
    """The schema moved to another pg-boss version under this process.

    Another client (Node pg-boss 12.38 started with ``migrate: true``, or ``alkstore
    db upgrade``) migrated the schema while a transaction ran statements of the old
    version, and one of them failed: the transaction is aborted. Roll it back and
    run it again; the next transaction speaks the new version (or refuses it with a
    :class:`SchemaVersionError` if this release does not speak it).
    """

    def __init__(self, schema: str, before: int, after: int | None) -> None:
        self.schema = schema
        self.before = before
        self.after = after
        now = "no version" if after is None else f"version {after}"
        super().__init__(
            f"schema {shown(schema)} moved from pg-boss schema version {before} to {now} under "
            "this process (another client migrated it) and this transaction's statement "
            "failed on it: roll the transaction back and retry it; the next transaction "
            "uses the new version"
        )


def _advice(schema: str, found: int | None, expected: int) -> str:
    head = f"schema {shown(schema)} "
    if found is None:
        return (
            head + f"has a pg-boss version table but no version row, so its schema version "
            f"is unknown (alkstore_sa needs {expected}); if it really holds a "
            f"pg-boss 11.1/12.0-12.5 schema, insert the row ({expected}) and retry, "
            "otherwise choose another schema"
        )
    if found == expected - 1:
        return (
            head + f"is at pg-boss schema version {found} (pg-boss 11.0.x), alkstore_sa needs "
            f"{expected}; start Node pg-boss 11.1.x once against it (it migrates "
            f"{found} to {expected}) and run the upgrade again"
        )
    if found < expected:
        return (
            head + f"is at pg-boss schema version {found} (pg-boss 10.x or older), alkstore_sa "
            f"needs {expected} and pg-boss offers no upgrade path from it: drain or "
            "move its jobs and install into a fresh schema"
        )
    return (
        head + f"is at pg-boss schema version {found}, newer than the version "
        f"{expected} alkstore_sa speaks (pg-boss 12.6 or later migrated it); use "
        "another schema for alkstore_sa, or keep Node pg-boss at 11.1.x-12.5.x on this one"
    )


class JobLostError(AlkstoreError):
    """A worker tried to settle a job it no longer owns (fencing rejected it).

    This happens when a job outlived its expiry, was failed by the supervisor and
    possibly fetched again by another worker.
    """


FIRST_REVISION_ADVICE = (
    "start your application's own branch with `alembic revision --head base "
    '--branch-label myapp --version-path migrations/versions -m "..."` and build '
    'later revisions on it with `alembic revision --head myapp@head -m "..."` '
    "(see the 'Wire the migrations into your Alembic environment' page)"
)


class ForeignRevisionError(AlkstoreError):
    """An application's Alembic revision is in, or bound for, alkstore_sa's versions folder.

    alkstore_sa's folder holds only its own revisions (their ids start with
    ``alkstore_``): whatever else sits there would run on every database that
    ``alkstore db upgrade`` touches. Raised before any migration runs; the message
    names the file(s) and how to start your own branch. :attr:`paths` lists the files.
    """

    def __init__(self, problem: str, paths: tuple[str, ...] = ()) -> None:
        self.paths = paths
        super().__init__(f"{problem}; {FIRST_REVISION_ADVICE}")


class SchemaHealthError(AlkstoreError):
    """The schema's catalog is not what its pg-boss version row says it should be.

    :attr:`problems` lists each difference on its own (``missing column queue.x``,
    ``invalid index job_common_i13 on job_common: ...``); ``alkstore db check`` prints
    them all. Raised before anything is written.
    """

    def __init__(self, schema: str, version: int, problems: Collection[str], summary: str) -> None:
        self.schema = schema
        self.version = version
        self.problems = tuple(problems)
        Exception.__init__(self, f"{summary}: " + "; ".join(self.problems))


class SchemaCatalogError(SchemaHealthError, SchemaVersionError):
    """The version row says N but the catalog is not schema N's (refused, nothing written).

    Something is missing, or objects of another schema version are present: the version
    row was edited, a migration was applied by hand in part, or a backup of another
    version was restored under this version row. ``alkstore db upgrade`` refuses such a
    schema rather than migrate from a state it cannot know.
    """

    def __init__(
        self, schema: str, version: int, problems: Collection[str], closest: int | None = None
    ) -> None:
        like = "" if closest is None else f" (it is closest to version {closest}'s)"
        super().__init__(
            schema,
            version,
            problems,
            f"schema {shown(schema)} says pg-boss schema version {version} but its catalog is "
            f"not version {version}'s{like}; nothing was changed, compare it with the "
            "differences below",
        )
        self.closest = closest
        self.found = version
        self.expected = version if closest is None else closest


class UnfinishedIndexBuildError(SchemaHealthError):
    """An index build did not finish: an INVALID index, a job-table index a background
    build never made, or an unfinished ``bam`` row.

    ``alkstore db upgrade`` (or :func:`alkstore_sa.migrate.upgrade`) heals it, even when
    the schema is already at its target version; the message says which indexes matter
    for correctness and which only for speed.
    """

    def __init__(self, schema: str, version: int, problems: Collection[str]) -> None:
        super().__init__(
            schema,
            version,
            problems,
            f"schema {shown(schema)} (pg-boss schema version {version}) has unfinished index "
            f"builds; run `alkstore db upgrade --schema-version {version} --schema {schema}` "
            "to finish them",
        )


class SchemaProfileError(SchemaVersionError):
    """The schema was built for another database backend profile than the caller's.

    pg-boss builds a different schema under some profiles (a plain ``job`` table under
    ``cockroachdb`` and ``yugabytedb``, its ``noTablePartitioning`` flag). A runtime or
    an upgrade whose profile expects the other shape refuses the schema before reading or
    writing a job, naming what differs; a worker or supervisor says so at ERROR and
    looks again later, as for a version it does not speak.

    :ivar schema: the schema.
    :ivar found: its pg-boss schema version (also ``expected``).
    :ivar backend: the caller's profile name.
    :ivar differs: what differs, in words.
    """

    def __init__(self, schema: str, version: int, backend: str, differs: str) -> None:
        self.schema = schema
        self.found = version
        self.expected = version
        self.backend = backend
        self.differs = differs
        AlkstoreError.__init__(
            self,
            f"schema {shown(schema)} (pg-boss schema version {version}) does not match backend "
            f"{backend!r}: {differs}; nothing was read or written (the 'Database backends' "
            "page)",
        )


class SchemaFeatureError(AlkstoreError):
    """A call needs a newer pg-boss schema version than the schema is at.

    Raised before any statement is sent, so the caller's transaction is untouched;
    for example ``QueueService.touch`` or ``upsert`` on a schema at 26 (both came
    with pg-boss 12, schema 46). Upgrade the schema (``alkstore db upgrade``) to use it.

    :ivar schema: the schema.
    :ivar feature: what was asked for (``"touch"``...).
    :ivar needed: the first schema version that has it (also ``expected``).
    :ivar found: the schema's version.
    """

    def __init__(self, schema: str, feature: str, needed: int, found: int) -> None:
        self.schema = schema
        self.feature = feature
        self.needed = needed
        self.expected = needed
        self.found = found
        super().__init__(
            f"{feature} needs a pg-boss schema at version {needed} or later (pg-boss 12); "
            f"schema {shown(schema)} is at {found}: run `alkstore db upgrade "
            f"--schema-version {needed} --schema {schema}`"
        )


class PooledConnectionError(AlkstoreError):
    """A schema change was given a connection that goes through a connection pooler.

    An upgrade holds pg-boss's migration lock as a session advisory lock and may build
    indexes ``CONCURRENTLY`` between transactions: both need one server session from
    start to end, which a pooler in transaction mode does not keep (the lock would be
    taken on one server connection and released on another, and stay held). The
    library cannot tell a pooler's transaction mode from its session mode, so it
    refuses both, before anything is written; give the upgrade a URL that reaches
    PostgreSQL directly (the "Behind PgBouncer" page).

    :ivar schema: the schema to be changed.
    """

    def __init__(self, schema: str) -> None:
        self.schema = schema
        super().__init__(
            f"schema {shown(schema)}: this connection goes through a connection pooler "
            "(PgBouncer or another), and a schema upgrade needs one server session "
            "throughout (a session advisory lock, CONCURRENTLY index builds); run it "
            "with a URL that reaches PostgreSQL directly (the 'Behind PgBouncer' page)"
        )


class FlowConflictError(AlkstoreError):
    """A job of a :meth:`~alkstore_sa.QueueService.flow` was refused by a unique
    index: its ``id`` is taken in its queue, or the queue's policy or a throttle
    slot already holds its ``singleton_key`` (or the insert deadlocked with
    another transaction on such an index).

    A flow is all or nothing, as in pg-boss: none of its jobs or dependencies
    was written, and the caller's transaction is still usable.
    """

    def __init__(self, queues: Sequence[str]) -> None:
        self.queues = tuple(queues)
        super().__init__(
            "flow refused: a job conflicts with a unique index of queue(s) "
            + ", ".join(repr(q) for q in self.queues)
            + " (id already taken, or the policy or a throttle slot holds its singleton_key);"
            " nothing of the flow was written"
        )
