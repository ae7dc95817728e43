"""Advisory locks shared with Node pg-boss (the same keys pg-boss computes)."""

from __future__ import annotations

from sqlalchemy import CTE, ColumnElement, Select, Text, bindparam, func, literal, select, true

from .base import advisory_key

CREATE_QUEUE = "create-queue"
DELETE_QUEUE = "delete-queue"
QUEUE_STATS = "queue-stats"


def table_key(table: str, step: str) -> str:
    """Per-table keys: ``<table>failJobsByTimeout`` and ``<table>deletion``."""
    return f"{table}{step}"


def xact_lock() -> Select[tuple[None]]:
    """Take the transaction-scoped lock for ``:lock_schema`` + ``:lock_key``."""
    key = bindparam("lock_schema", type_=Text) + bindparam("lock_key", type_=Text)
    return select(func.pg_advisory_xact_lock(advisory_key(key)))


def try_xact_lock() -> Select[tuple[bool]]:
    """Like :func:`xact_lock` but answers ``false`` instead of waiting."""
    key = bindparam("lock_schema", type_=Text) + bindparam("lock_key", type_=Text)
    return select(func.pg_try_advisory_xact_lock(advisory_key(key)))


def try_lock_cte(key: str, *, advisory: bool = True) -> CTE:
    """A ``MATERIALIZED`` CTE ``lock(got)`` that tries the transaction-scoped lock
    for ``:lock_schema`` + ``key`` once, for a statement that does its work only
    when ``got`` (the loser scans nothing). Without ``advisory`` (a backend profile
    with ``noAdvisoryLocks``) ``got`` is simply true: every caller does the work."""
    got: ColumnElement[bool]
    if advisory:
        got = func.pg_try_advisory_xact_lock(
            advisory_key(bindparam("lock_schema", type_=Text) + literal(key, Text))
        )
    else:
        got = true()
    return select(got.label("got")).cte("lock").prefix_with("MATERIALIZED")
