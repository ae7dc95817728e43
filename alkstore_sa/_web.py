"""What the dashboard and the HTTP API share: the check of the engine and schemas they are
given, and the transaction each request runs its work in (one of its own, under a
``statement_timeout``, read-only when it only reads)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from .backends import Backend
from .errors import InvalidOptionsError
from .names import validate_schema
from .service import QueueService

T = TypeVar("T")


def checked_schemas(engine: object, schemas: Sequence[str] | str) -> tuple[str, ...]:
    """``schemas`` validated (one name may be given alone), for a synchronous ``engine``.

    :raises InvalidOptionsError: for an engine that is not a synchronous SQLAlchemy
        ``Engine``, no schema, or a bad name.
    """
    if not isinstance(engine, Engine):
        raise InvalidOptionsError(
            "engine", f"must be a synchronous SQLAlchemy Engine, not {type(engine).__name__}"
        )
    if isinstance(schemas, str):
        schemas = (schemas,)
    if not schemas:
        raise InvalidOptionsError("schemas", "name at least one schema")
    return tuple(validate_schema(s) for s in schemas)


def in_transaction(
    engine: Engine,
    schema: str,
    backend: Backend,
    timeout_ms: int,
    work: Callable[[QueueService], T],
    *,
    write: bool,
) -> T:
    """``work`` on a service of ``schema`` in a transaction of its own, committed when it
    returns (read-only unless ``write``), with ``statement_timeout`` ``timeout_ms``
    (0: none) for that transaction only."""
    with Session(engine) as session, session.begin():
        if not write:
            session.execute(text("SET TRANSACTION READ ONLY"))
        session.execute(
            text("SELECT set_config('statement_timeout', :ms, true)"), {"ms": str(timeout_ms)}
        )
        return work(QueueService(session, schema=schema, backend=backend))
