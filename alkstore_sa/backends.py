"""Database backend profiles: pg-boss 12.38's ``backend`` option, in Python.

pg-boss runs on PostgreSQL and on engines that speak its protocol but lack some of its
features. A *profile* names the engine; it stands for a fixed set of *compatibility
flags*, each of which turns one feature off (a plain ``job`` table instead of a
partitioned one, a claim without ``SKIP LOCKED``, polling instead of ``LISTEN``...).
The profile is the only input, as in pg-boss: flags are not set one by one.

The names and the flag sets are pg-boss 12.38's (``BACKEND_PROFILES`` of its
``attorney.js``), so a Python service and a Node one given the same profile make the
same choices. The "Database backends" page says what each flag changes and costs, and
how far each is verified here.

The flags come in two kinds: :data:`FOLLOWED_FLAGS` choose the runtime's statements,
:data:`SCHEMA_FLAGS` how the schema is built; every one of pg-boss 12.38's is followed.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from .errors import InvalidOptionsError, shown

FLAGS: Mapping[str, str] = MappingProxyType(
    {
        "noSkipLocked": "jobs are claimed by one UPDATE that rechecks their state, without "
        "FOR UPDATE SKIP LOCKED; under contention some fetches come back empty",
        "noMultiMutationCte": "settlements and expiry run as separate statements in one "
        "transaction, not one statement that changes several tables",
        "noTablePartitioning": "the job table is a plain table: no partitioned queues",
        "noDeferrableConstraints": "foreign keys are not deferrable",
        "noAdvisoryLocks": "no advisory locks around installs, migrations and maintenance",
        "noCoveringIndexes": "indexes have no INCLUDE columns",
        "noAddColumnBackfill": "a migration does not fill a column it has just added",
        "noListenNotify": "no LISTEN/NOTIFY: workers poll, and a queue's notify is ignored",
        "noIndexProgressView": "index builds are reclaimed by timeout, not by progress",
        "noReindex": "index bloat is reported, never rebuilt",
        "noMonitorVacuum": "no vacuum or transaction-horizon warnings",
        "noTransactionalHeartbeat": "transactional handlers get no heartbeat",
        "inlineTableIndexes": "indexes are declared inside CREATE TABLE",
    }
)
"""Every compatibility flag of pg-boss 12.38, by its name there, with what it changes."""

PROFILES: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "postgres": (),
        "cockroachdb": tuple(FLAGS),
        "yugabytedb": (
            "noTablePartitioning",
            "noAdvisoryLocks",
            "noIndexProgressView",
            "noReindex",
            "noMonitorVacuum",
        ),
        "citus": (),  # pg-boss keeps its tables coordinator-local
        "pglite": (),
    }
)
"""Each profile's flags, as pg-boss 12.38 sets them (``postgres`` is the default), in the
order of :data:`FLAGS`."""

DEPRECATED: Mapping[str, str] = MappingProxyType(
    {
        "yugabytedb": "backend 'yugabytedb' is deprecated in pg-boss 12.38 and will be "
        "refused by its next major: YugabyteDB is not tested there and upgrades do not "
        "work on it",
    }
)
"""Profiles pg-boss 12.38 deprecates, with what it says (a ``DeprecationWarning`` here)."""

FOLLOWED_FLAGS = (
    "noSkipLocked",
    "noMultiMutationCte",
    "noListenNotify",
    "noAdvisoryLocks",
    "noIndexProgressView",
    "noReindex",
    "noMonitorVacuum",
    "noTransactionalHeartbeat",
)
"""The *runtime* flags: each chooses statements, and each can be forced on a stock
PostgreSQL schema (a ``Backend`` made directly) to test its path."""

SCHEMA_FLAGS = (
    "noTablePartitioning",
    "noDeferrableConstraints",
    "noCoveringIndexes",
    "noAddColumnBackfill",
    "inlineTableIndexes",
)
"""The *schema* flags: they change how the schema is built (``alkstore db upgrade
--backend``), and a runtime checks that the schema it meets was built for its profile."""

DIALECT_PROFILES: Mapping[str, str] = MappingProxyType({"cockroachdb": "cockroachdb"})
"""SQLAlchemy dialect names that settle the profile (``sqlalchemy-cockroachdb``'s)."""


@dataclass(frozen=True, slots=True)
class Backend:
    """A database backend profile: its name and the compatibility flags it sets.

    Applications name a profile (``backend="citus"``); :func:`resolve` makes it. Made
    directly, a ``Backend`` forces flags on stock PostgreSQL, as pg-boss's ``__test__``
    options do, so that a flag's path can be tested without the engine that needs it.

    :ivar name: one of :data:`PROFILES`.
    :ivar flags: the flags the profile sets (names of :data:`FLAGS`).
    """

    name: str
    flags: frozenset[str]

    def has(self, flag: str) -> bool:
        """Whether the profile sets ``flag`` (a key of :data:`FLAGS`)."""
        if flag not in FLAGS:
            raise KeyError(flag)
        return flag in self.flags

    def __str__(self) -> str:
        return self.name


POSTGRES = Backend("postgres", frozenset())
"""The default profile: stock PostgreSQL, every feature on."""


def resolve(backend: str | Backend | None = None, *, dialect: str | None = None) -> Backend:
    """The profile named ``backend``, or the one a SQLAlchemy ``dialect`` name settles
    (:data:`DIALECT_PROFILES`), or ``postgres``.

    A name given for an engine whose dialect settles another profile is refused, as is
    a name pg-boss does not know (the message lists the names). A deprecated profile
    gives a :class:`DeprecationWarning`.

    :raises InvalidOptionsError: for any of the above, before anything is sent.
    """
    implied = DIALECT_PROFILES.get(dialect or "")
    if isinstance(backend, Backend):
        # Flags forced on a profile, as pg-boss's ``__test__`` options force them: for
        # tests of a flag's path on stock PostgreSQL.
        unknown = sorted(backend.flags - set(FLAGS))
        if unknown:
            raise InvalidOptionsError("backend", f"unknown flags {', '.join(unknown)}")
        if backend.name not in PROFILES:
            raise InvalidOptionsError(
                "backend",
                f"unknown backend {shown(backend.name)}: expected one of {', '.join(PROFILES)}",
            )
        return backend
    if backend is None:
        name = implied or "postgres"
    elif isinstance(backend, str):
        name = backend
    else:
        raise InvalidOptionsError(
            "backend", f"expected a profile name or a Backend, got {shown(backend)}"
        )
    if name not in PROFILES:
        raise InvalidOptionsError(
            "backend", f"unknown backend {shown(name)}: expected one of {', '.join(PROFILES)}"
        )
    if implied is not None and name != implied:
        raise InvalidOptionsError(
            "backend",
            f"backend {shown(name)} on an engine whose dialect is {dialect!r}: "
            f"that dialect is backend {implied!r}",
        )
    if name in DEPRECATED:
        warnings.warn(DEPRECATED[name], DeprecationWarning, stacklevel=2)
    flags = frozenset(PROFILES[name])
    return POSTGRES if name == "postgres" else Backend(name, flags)


def queue_claims_skip_locked(backend: Backend) -> bool:
    """Whether the supervisor's claims of queue rows (monitor and maintenance turns) skip
    rows another pass holds: only on stock PostgreSQL without ``noSkipLocked``, as pg-boss
    12.38 decides (elsewhere they wait; the name order keeps them free of deadlocks)."""
    return backend.name == "postgres" and not backend.has("noSkipLocked")


__all__ = [
    "DEPRECATED",
    "DIALECT_PROFILES",
    "FLAGS",
    "FOLLOWED_FLAGS",
    "POSTGRES",
    "PROFILES",
    "SCHEMA_FLAGS",
    "Backend",
    "queue_claims_skip_locked",
    "resolve",
]
