"""The operation protocol: statements yielded, results sent back."""

from __future__ import annotations

import time
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sqlalchemy import Executable, Result, func, select

from ..names import notify_channel

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One statement to run. ``savepoint``: run it inside a SAVEPOINT and send a
    conflict (see :func:`is_conflict`) back into the operation as :class:`Conflict`
    instead of poisoning the transaction."""

    statement: Executable
    params: Mapping[str, Any] | None = None
    savepoint: bool = False


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


@dataclass(slots=True)
class Context:
    """What every operation needs to know about its service."""

    schema: str
    notify: bool = True
    policies: PolicyCache = field(default_factory=PolicyCache)

    @property
    def channel(self) -> str:
        return notify_channel(self.schema)


def check_schema(ctx: Context) -> Op[None]:
    """Raise a clear error if the schema is missing or at another version."""
    from ..errors import SchemaNotInstalledError, SchemaVersionError
    from ..names import SCHEMA_VERSION
    from ..sql._common import VERSION

    found = yield Call(select(func.to_regclass(f'"{ctx.schema}".version').is_not(None)))
    if not found.scalar_one():
        raise SchemaNotInstalledError(ctx.schema)
    result = yield Call(select(VERSION.c.version).limit(1))
    version = result.scalar()
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(ctx.schema, version, SCHEMA_VERSION)


class Conflict(Exception):
    """Sent into an operation when its savepoint statement hit a unique index
    (or deadlocked on one with another session)."""


# A unique violation (a policy or throttle index) or a deadlock on a unique index
# (with a client that takes no key locks, see sql/fetch.py) is answered as a
# conflict. Anything else is a real error and is raised: a foreign-key or check
# violation must not pass for "nothing happened", and under SERIALIZABLE the
# caller must retry a serialization failure itself.
_CONFLICT_CODES = frozenset({"23505", "40P01"})  # unique_violation, deadlock_detected


def is_conflict(error: BaseException) -> bool:
    """Is ``error`` (a SQLAlchemy ``DBAPIError``) a conflict with other sessions?"""
    from sqlalchemy.exc import DBAPIError

    code = getattr(getattr(error, "orig", None), "sqlstate", None)
    return isinstance(error, DBAPIError) and code in _CONFLICT_CODES
