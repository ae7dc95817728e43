"""The operation protocol: statements yielded, results sent back."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Executable, Result

from .. import versions
from ..backends import POSTGRES, Backend
from ..names import SCHEMA_VERSION, notify_channel, schema_key
from ..schema_versions import NO_VERSION_ROW
from ..sql.common.base import schema_tables, version_row, version_table_exists
from ..sql.statements import Failing, Statements, statements_for
from ..sql.v46.fail import SplitFail

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One statement to run. ``savepoint``: run it inside a SAVEPOINT and send a
    conflict (see :func:`is_conflict`) back into the operation as :class:`Conflict`
    instead of poisoning the transaction. ``refused`` (with ``savepoint``): the
    names of the constraints whose violation is sent back instead, and nothing else
    is (the statement's errors are raised as they are). ``contained`` (with
    ``savepoint``): every database error of the statement is sent back, as a
    :class:`Conflict` whose ``error`` is it. ``direct``: the driver may run the
    statement on the DBAPI connection itself, in the same transaction, instead of
    through SQLAlchemy's execute (see :mod:`alkstore_sa.ops.driver`); only for
    statements whose result columns psycopg loads as SQLAlchemy would (booleans,
    integers, text, UUIDs and arrays of them)."""

    statement: Executable
    params: Mapping[str, Any] | None = None
    savepoint: bool = False
    refused: frozenset[str] = frozenset()
    contained: bool = False
    direct: bool = False


Op = Generator[Call, Result[Any], T]


class PolicyCache:
    """Queue policies by name, shared by the services of one engine.

    ``fetch`` needs the policy to choose its statement; a queue's policy never
    changes while it exists, and a stale entry (queue deleted and re-created
    with another policy) only makes one fetch come back empty, which refreshes it.
    """

    ttl = 60.0

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[str, float]] = {}

    def get(self, schema: str, name: str) -> str | None:
        hit = self._entries.get((schema, name))
        if hit is None or time.monotonic() - hit[1] > self.ttl:
            return None
        return hit[0]

    def put(self, schema: str, name: str, policy: str) -> None:
        self._entries[(schema, name)] = (policy, time.monotonic())

    def drop(self, schema: str, name: str) -> None:
        self._entries.pop((schema, name), None)

    def forget(self, schema: str) -> None:
        """Drop every entry of ``schema`` (dropped, or made again under its name)."""
        for key in [k for k in self._entries if k[0] == schema]:
            self._entries.pop(key, None)


@dataclass(slots=True)
class Context:
    """What every operation needs to know about its service.

    ``version`` is the pg-boss schema version the operations speak (26 or 46):
    :func:`check_schema` sets it from the installed schema. Operations never
    compare it: they build statements through :attr:`sql`, that version's
    statement set, and ask :meth:`has` or :meth:`require` for what only some
    versions have (the table of :mod:`alkstore_sa.versions`). ``backend`` is the
    database backend profile (:mod:`alkstore_sa.backends`), whose flags choose among
    the version's statements as the version chooses the set.
    """

    schema: str
    notify: bool = True
    policies: PolicyCache = field(default_factory=PolicyCache)
    version: int = SCHEMA_VERSION
    backend: Backend = POSTGRES
    history: bool = False
    """Whether the schema holds the attempt history table (read with the version):
    the fails then record each attempt."""
    claims: bool = False
    """Whether our workers' claim tables are there and writable (read with the version):
    a worker's claims at 26 then record themselves, and its sweep rescues the jobs of
    workers that stopped answering (:mod:`alkstore_sa.models.claims`)."""
    sweeps: dict[str, int] = field(default_factory=dict)
    """Where supervision's sweep of each schema's attempt history stopped (an attempt
    id), shared by the services of one engine as ``policies`` is."""

    @property
    def channel(self) -> str:
        return notify_channel(self.schema)

    @property
    def lock_name(self) -> str:
        """The schema as pg-boss's lock keys name it (:func:`~alkstore_sa.names.schema_key`)."""
        return schema_key(self.schema)

    @property
    def sql(self) -> Statements:
        """The statement set of the schema's version, as the backend profile's flags
        choose among its statements."""
        return statements_for(self.version, self.backend.flags, history=self.history)

    def has(self, feature: str) -> bool:
        """Whether the schema's version has ``feature`` (a key of
        :data:`alkstore_sa.versions.FEATURES`)."""
        return versions.has(self.version, feature)

    def require(self, feature: str, what: str | None = None) -> None:
        """Refuse ``feature`` (printed as ``what``) on a schema whose version lacks
        it: :class:`~alkstore_sa.SchemaFeatureError`, before any statement."""
        versions.require(self.schema, self.version, feature, what)


def check_schema(ctx: Context) -> Op[int]:
    """Read the installed version into ``ctx.version`` and return it (and into
    ``ctx.history`` whether the attempt history table is there).

    Raises :class:`~alkstore_sa.SchemaNotInstalledError` if the schema is missing and
    :class:`~alkstore_sa.SchemaVersionError` (one line of advice) if its version is not
    in :data:`~alkstore_sa.names.SPOKEN_SCHEMA_VERSIONS`; ``ctx`` is then unchanged.
    Only reads, so a refusal leaves the caller's transaction usable.
    """
    from .. import names
    from ..errors import SchemaNotInstalledError, SchemaVersionError

    found = yield from read_version(ctx.schema)
    if found is None:
        raise SchemaNotInstalledError(ctx.schema)
    version = None if found == NO_VERSION_ROW else found
    # Read here, not bound at import: tests widen the set with monkeypatch.
    spoken = names.SPOKEN_SCHEMA_VERSIONS
    if version not in spoken:
        expected = min((v for v in spoken if version is None or v >= version), default=max(spoken))
        raise SchemaVersionError(ctx.schema, version, expected, spoken=spoken)
    assert version is not None  # spoken versions are numbers
    tables = (yield Call(schema_tables(ctx.schema))).one()
    _check_profile(ctx, version, tables.job_kind)
    ctx.history = bool(tables.attempts)
    ctx.claims = bool(tables.claims)
    ctx.version = found
    return found


def _check_profile(ctx: Context, version: int, kind: str | None) -> None:
    """Refuse a schema built for another backend profile (its job table's ``kind``,
    partitioned or not): :class:`~alkstore_sa.SchemaProfileError`, before anything else
    is read."""
    from ..errors import SchemaProfileError

    if kind is None:
        return  # no job table: the catalog checks (``alkstore db check``) say what is amiss
    plain = ctx.backend.has("noTablePartitioning")
    if (kind == "p") == (not plain):
        return
    if plain:
        differs = "its job table is partitioned, and this backend's (noTablePartitioning) is not"
    else:
        differs = (
            "its job table is a plain table, as pg-boss builds it under a backend with "
            f"noTablePartitioning (cockroachdb, yugabytedb); backend {str(ctx.backend)!r} "
            "needs it partitioned: name the backend the schema was built for"
        )
    raise SchemaProfileError(ctx.schema, version, str(ctx.backend), differs)


def read_version(schema: str) -> Op[int | None]:
    """The pg-boss version of ``schema``: the one reader of the version row.

    ``None`` when there is no version table (nothing installed),
    :data:`~alkstore_sa.schema_versions.NO_VERSION_ROW` when the table holds no row.
    Two reads, no lock: it leaves the caller's transaction as it was.
    """
    exists = yield Call(version_table_exists(schema))
    if not exists.scalar_one():
        return None
    value = (yield Call(version_row())).scalar()
    return NO_VERSION_ROW if value is None else int(value)


# SQLSTATEs with which a statement of one schema version fails on another: a
# column, table or function the statement names is gone or has a new signature
# (42703, 42P01, 42883), an enum or other typed literal no longer parses (22P02,
# 42804), a NOT NULL or CHECK added since trips (23502, 23514). Seen when a
# worker speaking 26 keeps running while its schema is migrated to 46 (the
# "Live upgrades" part of the compatibility page); any of them makes the runtime
# read the installed version again before its next statement.
_SCHEMA_CHANGE_CODES = frozenset({"42703", "42P01", "42883", "22P02", "42804", "23502", "23514"})


def may_be_schema_change(error: BaseException) -> bool:
    """Could ``error`` (a SQLAlchemy ``DBAPIError``) come from a schema at another version?"""
    from sqlalchemy.exc import DBAPIError

    code = getattr(getattr(error, "orig", None), "sqlstate", None)
    return isinstance(error, DBAPIError) and code in _SCHEMA_CHANGE_CODES


class Conflict(Exception):
    """Sent into an operation when its savepoint statement hit a unique index
    (or deadlocked on one with another session), or violated a constraint the
    :class:`Call` named as ``refused`` (``constraint``: its name)."""

    def __init__(self, constraint: str | None = None, error: BaseException | None = None) -> None:
        super().__init__(constraint)
        self.constraint = constraint
        self.error = error


# A unique violation (a policy or throttle index) or a deadlock on a unique index
# (with a client that takes no key locks, see sql/v26/fetch.py) is answered as a
# conflict. Anything else is a real error and is raised: a foreign-key or check
# violation must not pass for "nothing happened", and under SERIALIZABLE the
# caller must retry a serialization failure itself.
_CONFLICT_CODES = frozenset({"23505", "40P01"})  # unique_violation, deadlock_detected


def refused_constraint(call: Call, error: BaseException) -> str | None:
    """The name of the constraint of ``call.refused`` that ``error`` (a SQLAlchemy
    ``DBAPIError``) violated, if any."""
    diag = getattr(getattr(error, "orig", None), "diag", None)
    name = getattr(diag, "constraint_name", None)
    return name if name in call.refused else None


def sent_back(call: Call, error: BaseException) -> Conflict | None:
    """What a savepoint ``call`` that failed with ``error`` sends back into its
    operation: a :class:`Conflict`, or None when ``error`` is to be raised."""
    if call.contained:
        return Conflict(refused_constraint(call, error), error)
    if call.refused:
        name = refused_constraint(call, error)
        return None if name is None else Conflict(name)
    return Conflict() if is_conflict(error) else None


def restated(op: Op[T], change: Callable[[Call], Call]) -> Op[T]:
    """``op`` with each statement it yields replaced by ``change(statement)``;
    results and conflicts go back to ``op`` as they come."""
    try:
        call = next(op)
        while True:
            try:
                result = yield change(call)
            except Conflict as exc:
                call = op.throw(exc)
                continue
            call = op.send(result)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def contained(op: Op[T]) -> Op[T]:
    """``op`` with each of its plain statements in a savepoint that sends every
    database error back (``contained``): a statement that fails raises
    :class:`Conflict` (its ``error`` the cause) out of ``op``, with the caller's
    transaction rolled back to just before it and still usable. Statements ``op``
    already runs in a savepoint keep their own rule."""

    def in_savepoint(call: Call) -> Call:
        return call if call.savepoint else dataclasses.replace(call, savepoint=True, contained=True)

    return restated(op, in_savepoint)


def is_conflict(error: BaseException) -> bool:
    """Is ``error`` (a SQLAlchemy ``DBAPIError``) a conflict with other sessions?"""
    from sqlalchemy.exc import DBAPIError

    code = getattr(getattr(error, "orig", None), "sqlstate", None)
    return isinstance(error, DBAPIError) and code in _CONFLICT_CODES


Recorder = Callable[[Call, Call], Generator[Call, Result[Any], None]]
"""How a split fail runs its two attempt-history statements (record, then trim)."""


def _in_turn(record: Call, trim: Call) -> Generator[Call, Result[Any], None]:
    yield record
    yield trim


def failing(
    stmt: Failing, params: Mapping[str, Any], *, recorder: Recorder = _in_turn
) -> Op[list[Any]]:
    """Run a fail (:meth:`Statements.fail_jobs` and the like) with ``params``; its
    rows ``(id, name, state, dead_letter, dead_lettered)``. A split fail runs its
    statements in turn, in the caller's transaction (:class:`SplitFail`), its attempt
    history's two through ``recorder``."""
    if not isinstance(stmt, SplitFail):
        return list((yield Call(stmt, params)).all())
    picked = (yield Call(stmt.pick, params)).one()
    if not picked.ids:
        return []
    keys = {"ids": picked.ids, "names": picked.names}
    yield Call(stmt.remove, keys)
    retried = list((yield Call(stmt.retry, {"rows": picked.rows})).scalars())
    failed = list((yield Call(stmt.fail, {"rows": picked.rows, "retried": retried})).scalars())
    if stmt.record is not None and stmt.trim is not None:
        by = {k: params[k] for k in ("worker", "worker_id") if k in params}
        yield from recorder(Call(stmt.record, {"rows": picked.rows, **by}), Call(stmt.trim, keys))
    if len(retried) + len(failed) != len(picked.ids):
        # Each row deleted is inserted again by one of the two: anything else is a
        # job lost, and the transaction must not commit.
        put_back = len(retried) + len(failed)
        raise AssertionError(f"fail: {len(picked.ids)} jobs deleted, {put_back} put back")
    return list((yield Call(stmt.dead_letter, keys)).all())
