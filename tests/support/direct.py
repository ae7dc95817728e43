"""Raw SQL and a one-transaction service on a test's schema, for tests that take
the ``engine`` and ``schema`` fixtures rather than an ``env``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

MINUTE_BEHIND_NOW = "SELECT date_trunc('minute', now() - interval '1 second')"
"""The start of the minute, never less than a second before the database's clock: a
fake clock at it plus one second is not ahead of the database (if it were, the
send-it job filed at the database's time would not be due yet at the fake one)."""


def rows(engine: Engine, schema: str, sql: str, **params: Any) -> list[Any]:
    """Run ``sql`` (``{s}`` stands for the quoted schema) in its own transaction;
    its rows, if it returns any."""
    with engine.begin() as conn:
        result = conn.execute(text(sql.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def in_tx(engine: Engine, schema: str, fn: Callable[[QueueService], Any]) -> Any:
    """``fn`` on a service over a session of its own, committed when it returns."""
    with Session(engine) as session, session.begin():
        return fn(QueueService(session, schema=schema))
