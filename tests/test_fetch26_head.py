"""The schema-26 claim takes the head of the queue first (a bounded sort) and sorts every
ready job only when the head falls short: same answer as one full sort, in every case."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event, text

from alkstore_sa._engine_cache import execution_options
from alkstore_sa.sql.common.claim import HEAD_EXTRA, HEAD_ROOM
from alkstore_sa.sql.v26 import fetch as fetch26

BATCH = 2
HEAD = HEAD_ROOM * BATCH + HEAD_EXTRA
"""Rows the head of a claim of ``BATCH`` holds."""


@pytest.fixture
def queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue("q"))
    return "q"


def fill(env: Any, queue: str, n: int) -> list[uuid.UUID]:
    """``n`` ready jobs, fetch order = list order (one send_many keeps input order)."""
    ids: list[uuid.UUID] = env.tx(lambda q: q.send_many(queue, [{"data": i} for i in range(n)]))
    return ids


@pytest.fixture
def lock_first(env: Any) -> Iterator[Any]:
    """``lock_first(queue, n)``: another transaction row-locks the queue's first ``n``
    jobs in fetch order until the test ends (another claim in flight)."""
    conns: list[Any] = []

    def lock(queue: str, n: int) -> None:
        conn = env.engine.connect()
        conns.append(conn)
        conn.execute(
            text(
                f'SELECT id FROM "{env.schema}".job WHERE name = :q '
                "ORDER BY priority DESC, created_on, id LIMIT :n FOR UPDATE"
            ),
            {"q": queue, "n": n},
        )

    yield lock
    for conn in conns:
        conn.rollback()
        conn.close()


def test_a_few_locked_jobs_at_the_head_are_skipped(env: Any, queue: str, lock_first: Any) -> None:
    ids = fill(env, queue, HEAD + 20)
    lock_first(queue, 3)
    assert [j.id for j in env.tx(lambda q: q.fetch(queue, BATCH))] == ids[3 : 3 + BATCH]


def test_a_head_wholly_locked_by_others_falls_back_to_the_full_sort(
    env: Any, queue: str, lock_first: Any
) -> None:
    ids = fill(env, queue, HEAD + 20)
    lock_first(queue, HEAD + 5)
    got = [j.id for j in env.tx(lambda q: q.fetch(queue, BATCH))]
    assert got == ids[HEAD + 5 : HEAD + 5 + BATCH]


def test_a_head_partly_locked_by_others_still_answers_in_fetch_order(
    env: Any, queue: str, lock_first: Any
) -> None:
    ids = fill(env, queue, HEAD + 20)
    lock_first(queue, HEAD - 1)  # one free row left in the head: short, so the full sort
    got = [j.id for j in env.tx(lambda q: q.fetch(queue, BATCH))]
    assert got == ids[HEAD - 1 : HEAD - 1 + BATCH]


def test_rows_of_racy_policies_filling_the_head_are_passed_over(env: Any, queue: str) -> None:
    ids = fill(env, queue, HEAD + 20)
    # Rows another client wrote with a policy whose unique index covers 'active':
    # a claim of a standard queue leaves them alone, even when they fill its head.
    env.sql(
        "UPDATE {s}.job SET policy = 'singleton' WHERE id = ANY(:ids)",
        ids=[str(i) for i in ids[: HEAD + 1]],
    )
    got = [j.id for j in env.tx(lambda q: q.fetch(queue, BATCH))]
    assert got == ids[HEAD + 1 : HEAD + 1 + BATCH]
    [(left,)] = env.sql(
        "SELECT count(*) FROM {s}.job WHERE policy = 'singleton' AND state = 'created'"
    )
    assert left == HEAD + 1


def test_a_queue_shorter_than_the_batch_is_claimed_whole(env: Any, queue: str) -> None:
    ids = fill(env, queue, 3)
    assert [j.id for j in env.tx(lambda q: q.fetch(queue, 10))] == ids


def test_deferred_jobs_stay_out_of_the_head(env: Any, queue: str) -> None:
    ids = fill(env, queue, HEAD + 10)
    env.sql(
        "UPDATE {s}.job SET start_after = now() + interval '1 day' WHERE id = ANY(:ids)",
        ids=[str(i) for i in ids[:HEAD]],
    )
    got = [j.id for j in env.tx(lambda q: q.fetch(queue, BATCH))]
    assert got == ids[HEAD : HEAD + BATCH]


def _nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def test_the_plan_sorts_only_the_head_when_it_is_enough(env: Any, queue: str) -> None:
    fill(env, queue, 1_000)
    env.sql("ANALYZE {s}.job_common")
    stmt = fetch26.fetch_jobs(priority=True, ignore_start_after=False, singleton_aware=False)
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, statement: str, params: Any, *args: Any) -> None:
        seen.append((statement, params))

    with env.engine.connect() as conn:
        event.listen(conn, "before_cursor_execute", capture)
        conn.execution_options(**execution_options(env.schema)).execute(
            stmt, {"qname": queue, "limit": 10, "cached_policy": "standard"}
        ).all()
        event.remove(conn, "before_cursor_execute", capture)
        conn.rollback()
        statement, params = seen[-1]
        raw = conn.connection.driver_connection
        [(doc,)] = raw.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchall()
        conn.rollback()
    plan = (json.loads(doc) if isinstance(doc, str) else doc)[0]["Plan"]
    ctes = {n["Subplan Name"]: n for n in _nodes(plan) if "Subplan Name" in n}
    # The head: a top-N sort of the ready jobs, holding only its rows.
    head_sorts = [n for n in _nodes(ctes["CTE head"]) if n["Node Type"] == "Sort"]
    assert [n["Sort Method"] for n in head_sorts] == ["top-N heapsort"]
    # The full sort (CTE slow) was planned but its scan of the jobs never ran.
    slow_scans = [n for n in _nodes(ctes["CTE slow"]) if n.get("Relation Name") == "job_common"]
    assert slow_scans and all(n["Actual Loops"] == 0 for n in slow_scans)
    assert ctes["CTE fast"]["Actual Rows"] == 10
