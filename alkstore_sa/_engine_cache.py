"""Per-engine caches (queue policies, verified schema versions) shared by every service,
worker and supervisor on one engine, and the Context and execution options a service
derives from its schema."""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

from sqlalchemy import Engine

from . import names, versions
from ._pooler import watch
from .backends import Backend
from .backends import resolve as resolve_backend
from .errors import SchemaVersionError
from .names import DEFAULT_SCHEMA, validate_schema
from .ops import Call, Context, Op, PolicyCache, check_schema

log = logging.getLogger("alkstore_sa")


class _EngineState:
    """What the services, workers and supervisors of one engine share."""

    def __init__(self) -> None:
        self.policies = PolicyCache()
        # schema -> where supervision's sweep of the attempt history stopped.
        self.sweeps: dict[str, int] = {}
        # schema -> (version, when it was read, whether the attempt history table was
        # there); a version once seen is kept after its entry expires, so that a change
        # can be told from a first reading.
        self._versions: dict[str, tuple[int, float, bool]] = {}
        # schema -> whether our workers' claim tables (models/claims.py) were usable then.
        self._claims: dict[str, bool] = {}
        self._lock = threading.Lock()

    def version(self, schema: str) -> int | None:
        """The schema's verified version, or ``None`` when it must be read (again).

        An entry is trusted for :data:`~alkstore_sa.names.SCHEMA_RECHECK_SECONDS`,
        so a schema migrated under a running process is noticed within that time.
        """
        hit = self._versions.get(schema)
        if hit is None or hit[1] == 0.0:
            return None
        if time.monotonic() - hit[1] > names.SCHEMA_RECHECK_SECONDS:
            return None
        return hit[0]

    def known(self, schema: str) -> int | None:
        """The version last read for ``schema``, fresh or not (``None``: never read)."""
        hit = self._versions.get(schema)
        return None if hit is None else hit[0]

    def history(self, schema: str) -> bool:
        """Whether ``schema`` held the attempt history table when its version was read."""
        hit = self._versions.get(schema)
        return hit is not None and hit[2]

    def claims(self, schema: str) -> bool:
        """Whether ``schema``'s claim tables were usable when its version was read."""
        return self._claims.get(schema, False)

    def remember(
        self, schema: str, version: int, *, history: bool = False, claims: bool = False
    ) -> int | None:
        """Store a version just read (and whether the attempt history table was there);
        return the version it replaces if it differs.

        The first reader to see a change logs it (once per engine and change):
        ``extra={"action": "schema_version_changed", "from": ..., "to": ...}``.
        """
        with self._lock:
            before = self.known(schema)
            self._versions[schema] = (version, time.monotonic(), history)
            self._claims[schema] = claims
        if before is None or before == version:
            return None
        log.warning(
            "schema %r moved from pg-boss schema version %d to %d under this process; "
            "its statements are now those of %d",
            schema,
            before,
            version,
            version,
            extra={
                "action": "schema_version_changed",
                "schema": schema,
                "from": before,
                "to": version,
            },
        )
        return before

    def expire(self, schema: str) -> None:
        """Read the schema's version again before its next statement (a statement
        failed the way a changed schema makes it fail)."""
        with self._lock:
            hit = self._versions.get(schema)
            if hit is not None:
                self._versions[schema] = (hit[0], 0.0, hit[2])

    def forget(self, schema: str) -> None:
        """Forget everything about ``schema`` (it was dropped or refused): its version,
        its queues' policies and where its attempt sweep stopped."""
        with self._lock:
            self._versions.pop(schema, None)
            self.sweeps.pop(schema, None)
        self.policies.forget(schema)


_states: weakref.WeakKeyDictionary[Engine, _EngineState] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def engine_state(engine: Engine) -> _EngineState:
    """Per-engine caches (queue policies, verified schema versions), shared by all services."""
    state = _states.get(engine)
    if state is None:
        with _lock:
            state = _states.setdefault(engine, _EngineState())
        watch(engine)  # a pooler in front of it? (the "Behind PgBouncer" page)
    return state


def execution_options(schema: str) -> dict[str, Any]:
    """The execution options that point the models' ``pgboss`` schema at ``schema``."""
    return {"schema_translate_map": {DEFAULT_SCHEMA: schema}}


def make_context(
    schema: str,
    *,
    notify: bool,
    engine: Engine | None,
    backend: str | Backend | None = None,
) -> tuple[Context, _EngineState | None]:
    """The operations' Context for ``schema``, with the engine's caches when there is one,
    and the backend profile ``backend`` names (:func:`alkstore_sa.backends.resolve`, which
    the engine's dialect may settle)."""
    schema = validate_schema(schema)
    profile = resolve_backend(backend, dialect=engine.dialect.name if engine is not None else None)
    state = engine_state(engine) if engine is not None else None
    ctx = Context(
        schema=schema,
        # No LISTEN/NOTIFY on the backend: nothing to announce a job on.
        notify=notify and not profile.has("noListenNotify"),
        policies=state.policies if state is not None else PolicyCache(),
        sweeps=state.sweeps if state is not None else {},
        backend=profile,
    )
    return ctx, state


def ensure_version(ctx: Context, state: _EngineState | None) -> Op[int]:
    """Set ``ctx.version`` from the engine's cache, reading the schema when it is stale.

    The operation every service, worker and supervisor runs before its own: a read
    of the version table at most every :data:`~alkstore_sa.names.SCHEMA_RECHECK_SECONDS`
    per engine and schema, none in between.
    """
    if state is not None:
        cached = state.version(ctx.schema)
        if cached is not None:
            ctx.version = cached
            ctx.history = state.history(ctx.schema)
            ctx.claims = state.claims(ctx.schema)
            _require_profile(ctx)
            return cached
    version = yield from check_schema(ctx)
    _require_profile(ctx)
    if state is not None:
        state.remember(ctx.schema, version, history=ctx.history, claims=ctx.claims)
    return version


def _require_profile(ctx: Context) -> None:
    # Backend profiles came with pg-boss 12.27: a schema at 26 has none.
    if ctx.backend.flags:
        what = f"backend {str(ctx.backend)!r}"
        versions.require(ctx.schema, ctx.version, "a backend profile's flags", what)


def version_due(ctx: Context, state: _EngineState) -> Op[int] | None:
    """``None`` when the engine's cached version is fresh (then set in ``ctx``), else
    the operation that reads it; for runtimes that start a transaction per operation
    and should not start one for nothing."""
    cached = state.version(ctx.schema)
    if cached is None:
        return ensure_version(ctx, state)
    ctx.version = cached
    ctx.history = state.history(ctx.schema)
    ctx.claims = state.claims(ctx.schema)
    _require_profile(ctx)
    return None


MIGRATION_WAIT = 0.5
"""Seconds between looks at a schema seen mid-migration."""


def passing_through(found: int | None) -> bool:
    """Whether ``found`` is a version a migration between two spoken ones passes through.

    Our migrations commit version by version (the "Compatibility with pg-boss, and deliberate
    differences" page, "Live upgrades"), so a schema going from 26 to 46 shows 27 to 45 on the way.
    """
    spoken = names.SPOKEN_SCHEMA_VERSIONS
    return found is not None and found not in spoken and min(spoken) < found < max(spoken)


def migration_under_way(schema: str, caller_pid: int) -> Op[tuple[bool, bool]]:
    """Whether a session holds pg-boss's migration lock on ``schema`` (an ``alkstore db
    upgrade`` or a Node ``start()`` is migrating it), and whether that session waits
    for a lock the backend ``caller_pid`` holds (then waiting for the migration is
    futile: it waits for the caller). Reads ``pg_locks`` only; the migration lock is
    never taken, so a migration that wants it is not held up."""
    from sqlalchemy import BigInteger, Integer, and_, column, func, literal, select, table
    from sqlalchemy.dialects.postgresql import OID, array

    from .sql.common.base import advisory_key

    key = advisory_key(literal(schema))
    locks = table(
        "pg_locks",
        column("locktype"),
        column("database", OID),
        column("classid", OID),
        column("objid", OID),
        column("objsubid"),
        column("granted"),
        column("pid", Integer),
    )
    databases = table("pg_database", column("oid", OID), column("datname"))
    # A bigint advisory key is kept as two 32-bit halves (classid high, objid low).
    low = literal(4294967295, BigInteger)
    holder = (
        select(locks.c.pid)
        .where(
            and_(
                locks.c.locktype == "advisory",
                locks.c.objsubid == 1,
                locks.c.granted,
                locks.c.database
                == select(databases.c.oid)
                .where(databases.c.datname == func.current_database())
                .scalar_subquery(),
                locks.c.classid.cast(BigInteger) == key.op(">>")(literal(32, Integer)).op("&")(low),
                locks.c.objid.cast(BigInteger) == key.op("&")(low),
            )
        )
        .limit(1)
        .subquery()
    )
    blocked = array([literal(caller_pid, Integer)]).bool_op("<@")(
        func.pg_blocking_pids(holder.c.pid)
    )
    blocked_label = "blocked_by_caller"
    result = yield Call(select(holder.c.pid, blocked.label(blocked_label)))
    row = result.first()
    if row is None:
        return False, False
    return True, bool(row._mapping[blocked_label])


def backend_pid() -> Op[int]:
    """The server process of the connection the operation runs on."""
    from sqlalchemy import func, select

    result = yield Call(select(func.pg_backend_pid()))
    return int(result.scalar_one())


_SAVEPOINT = "alkstore_version_read"


def version_unlocked(ctx: Context, state: _EngineState) -> Op[int]:
    """:func:`ensure_version` for a caller's transaction that keeps no lock from it.

    A read of the version table holds its lock until the caller's transaction ends,
    and a migration altering that table would wait for it (and the caller, waiting
    out the migration, for the migration): the read runs in a savepoint rolled back
    at once, which releases what it locked. Fresh cached versions read nothing.
    """
    cached = state.version(ctx.schema)
    if cached is not None:
        ctx.version = cached
        ctx.history = state.history(ctx.schema)
        ctx.claims = state.claims(ctx.schema)
        return cached
    from sqlalchemy import text

    from .errors import SchemaNotInstalledError

    yield Call(text(f"SAVEPOINT {_SAVEPOINT}"))
    try:
        version = yield from ensure_version(ctx, state)
    except (SchemaVersionError, SchemaNotInstalledError):
        yield Call(text(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}"))
        yield Call(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
        raise
    yield Call(text(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}"))
    yield Call(text(f"RELEASE SAVEPOINT {_SAVEPOINT}"))
    return version


MIGRATION_GRACE = 60.0
"""How long a version between two known ones is taken for a migration under way
before it is reported as a schema this release cannot use."""


class Refusals:
    """What a worker or supervisor says, and how long it waits, when the installed
    version is refused: each version said once; a migration under way waited out.

    Our migrations commit version by version, so a runtime that spoke 26 sees 27
    to 45 for a few seconds on the way to 46 (Node pg-boss migrates in one
    transaction, so there the new version appears at once): such a version is
    logged at INFO and looked at again every :data:`MIGRATION_WAIT` seconds for up
    to :data:`MIGRATION_GRACE`; anything else is logged at ERROR and looked at
    again every :data:`~alkstore_sa.names.SCHEMA_RECHECK_SECONDS`.
    """

    def __init__(self, logger: logging.Logger, who: str, stops: str, **extra: Any) -> None:
        self._log = logger
        self._who = who
        self._stops = stops
        self._extra = extra
        self._said: set[tuple[int | None, bool]] = set()
        self._since: dict[int | None, float] = {}
        self._lock = threading.Lock()

    def refused(self, error: SchemaVersionError, state: _EngineState, schema: str) -> float:
        """Note one refusal; the seconds to wait before looking again."""
        found, before = error.found, state.known(schema)
        now = time.monotonic()
        with self._lock:
            since = self._since.setdefault(found, now)
            migrating = (
                before is not None
                and found is not None
                and before < found < names.NEWEST_KNOWN_SCHEMA_VERSION
                and now - since < MIGRATION_GRACE
            )
            first = (found, migrating) not in self._said
            self._said.add((found, migrating))
        if first and migrating:
            self._log.info(
                "%s waits: schema %r is being migrated (now at version %s)",
                self._who,
                schema,
                found,
                extra={
                    "action": "schema_migrating",
                    "schema": schema,
                    "found": found,
                    **self._extra,
                },
            )
        elif first:
            self._log.error(
                "%s %s: %s",
                self._who,
                self._stops,
                error,
                extra={
                    "action": "schema_version_refused",
                    "schema": schema,
                    "found": found,
                    **self._extra,
                },
            )
        return MIGRATION_WAIT if migrating else names.SCHEMA_RECHECK_SECONDS

    def clear(self) -> None:
        """The schema is usable again: a later refusal is said again."""
        with self._lock:
            self._said.clear()
            self._since.clear()
