"""Check that the ceiling's SQL has the shapes of alkstore_sa's statements.

``python -m bench.shapes`` runs each operation once through alkstore_sa while
recording the statement and parameters SQLAlchemy hands to psycopg, then asks
PostgreSQL for the plan of that statement and of the ceiling's hand-written
one (``EXPLAIN (FORMAT JSON)``, inside a rolled-back transaction) and compares
the plan trees: node types, relations, indexes, join types, CTE names and
sort keys. Equal trees mean the database does the same work on both sides, so
the benchmark compares only what runs in Python. With ``--sql`` it also prints
both statements.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from alkstore_sa import QueueService
from alkstore_sa.ops import Settlement

from . import ceiling
from .common import DEFAULT_URL, QUEUE, Config, drop, install, new_schema, preload

PLAN_KEYS = ("Node Type", "Relation Name", "Index Name", "Join Type", "CTE Name", "Operation")
CONDITIONS = ("Filter", "Index Cond", "Hash Cond", "Join Filter", "One-Time Filter")


def _normalise(condition: str) -> str:
    """A plan condition without aliases, casts, parentheses or spaces."""
    condition = re.sub(r"::[\w. ]+(\[\])?", "", condition)  # casts
    condition = re.sub(r"\b\w+\.", "", condition)  # table aliases and schemas
    return re.sub(r"[()\s]", "", condition)


def plan_shape(node: dict[str, Any]) -> list[Any]:
    """The parts of a JSON plan node that describe the work, recursively."""
    shape: list[Any] = [node.get(k) for k in PLAN_KEYS]
    shape += [_normalise(node[k]) if k in node else None for k in CONDITIONS]
    keys = node.get("Sort Key")
    if keys:
        # Aliases differ (anon_1 vs src); the sorted columns do not.
        shape.append([re.sub(r"^\w+\.", "", k) for k in keys])
    shape.append([plan_shape(child) for child in node.get("Plans", [])])
    return shape


@contextmanager
def captured(cfg: Config) -> Iterator[list[tuple[str, Any]]]:
    """Record (statement, parameters) of every statement the engine runs."""
    seen: list[tuple[str, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        seen.append((statement, params))

    event.listen(cfg.engine, "before_cursor_execute", before)
    try:
        yield seen
    finally:
        event.remove(cfg.engine, "before_cursor_execute", before)


def explain(cfg: Config, statement: Any, params: Any) -> list[Any]:
    with cfg.raw() as conn:
        try:
            if not isinstance(statement, str):
                statement = statement.as_string(conn)
            row = conn.execute(f"EXPLAIN (FORMAT JSON, COSTS OFF) {statement}", params).fetchone()
            assert row is not None
            return plan_shape(row[0][0]["Plan"])
        finally:
            conn.rollback()


def last_matching(seen: list[tuple[str, Any]], needle: str) -> tuple[str, Any]:
    for statement, params in reversed(seen):
        if needle in statement:
            return statement, params
    raise LookupError(f"no captured statement contains {needle!r}")


def compare(cfg: Config, show_sql: bool) -> bool:
    st = ceiling.Statements(cfg.schema)
    preload(cfg, QUEUE, 50)
    with captured(cfg) as seen, Session(cfg.engine) as session, session.begin():
        service = QueueService(session, schema=cfg.schema)
        service.send(QUEUE, {"n": 1})
        jobs = service.fetch(QUEUE, 10)
        service.complete_many(QUEUE, [Settlement(j.id, None, j.started_on) for j in jobs])
        session.rollback()
    pairs = {
        "send (insert CTE)": (
            last_matching(seen, "INSERT INTO"),
            (st.insert, ceiling.insert_params(st, QUEUE, [{"n": 1}])),
        ),
        "fetch (claim CTE)": (
            last_matching(seen, "FOR UPDATE SKIP LOCKED"),
            (st.fetch, ceiling.fetch_params(QUEUE, 10)),
        ),
        "complete (unnest update)": (
            last_matching(seen, "'completed'"),
            (st.complete, ceiling.complete_params(QUEUE, [(j.id, j.started_on) for j in jobs])),
        ),
    }
    ok = True
    for label, ((ours, our_params), (theirs, their_params)) in pairs.items():
        same = explain(cfg, ours, our_params) == explain(cfg, theirs, their_params)
        ok &= same
        print(f"{label:<26} {'same plan' if same else 'PLANS DIFFER'}")
        if show_sql or not same:
            with cfg.raw() as conn:
                text = theirs if isinstance(theirs, str) else theirs.as_string(conn)
            print(f"  alkstore_sa:\n{ours}\n  ceiling:\n{text}\n")
    return ok


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.shapes", description=__doc__)
    p.add_argument("--database-url", default=os.environ.get("ALKSTORE_DATABASE_URL", DEFAULT_URL))
    p.add_argument("--sql", action="store_true", help="print both statements")
    args = p.parse_args()
    cfg = Config(url=args.database_url, schema=new_schema(), quick=True, reps=1)
    install(cfg)
    try:
        return 0 if compare(cfg, args.sql) else 1
    finally:
        drop(cfg)
        cfg.close()


if __name__ == "__main__":
    raise SystemExit(main())
