"""Queue, subscription and job rows another client wrote (Node pg-boss, a SQL console)
with times Python cannot hold never take a reader or a page down.

``get_queues``/``get_queue`` (and so the dashboard overview, the queue page and
``get_queue_stats_history``), ``get_subscriptions`` and ``count_jobs`` read each
row tolerantly: the row is returned, a time such as ``infinity`` stands in as the
nearest one Python holds, ``unreadable`` names it with its stored text, and the pages
show it as stored.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from alkstore_sa import QueueService
from alkstore_sa.dashboard import create_app
from alkstore_sa.records import OUTSIDE_DATETIME

LOCAL = "http://127.0.0.1"


@pytest.fixture(params=[26, 46])
def any_schema(request: pytest.FixtureRequest, schema_pool: Any, spoken46: None) -> Iterator[str]:
    name = schema_pool.take(request.param)
    yield name
    schema_pool.give_back(name)


def service(engine: Engine, schema: str, work: Any) -> Any:
    with Session(engine) as session, session.begin():
        return work(QueueService(session, schema=schema))


def sql(engine: Engine, statement: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(statement))


def pages(engine: Engine, schema: str, *paths: str) -> dict[str, str]:
    c = TestClient(create_app(engine, schemas=[schema]), base_url=LOCAL, headers={"origin": LOCAL})
    out = {}
    for path in paths:
        page = c.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        out[path] = page.text
    return out


def test_a_queue_row_with_times_at_infinity_is_read_and_shown(
    engine: Engine, any_schema: str
) -> None:
    schema = any_schema
    service(engine, schema, lambda q: (q.create_queue("q"), q.create_queue("r")))
    sql(
        engine,
        f"UPDATE \"{schema}\".queue SET monitor_on = 'infinity', maintain_on = '-infinity',"
        " created_on = '-infinity', updated_on = 'infinity' WHERE name = 'q'",
    )
    found = service(engine, schema, lambda q: q.get_queues())
    assert [i.name for i in found] == ["q", "r"]  # never dropped
    q = service(engine, schema, lambda s: s.get_queue("q"))
    assert q is not None
    assert set(q.unreadable) == {"monitor_on", "maintain_on", "created_on", "updated_on"}
    assert q.unreadable["created_on"] == "-infinity" + OUTSIDE_DATETIME
    assert q.created_on.year == 1 and q.updated_on.year == 9999  # the stand-ins
    assert found[1].unreadable == {}
    # The queue's jobs are still counted and served.
    service(engine, schema, lambda s: s.send("q", {"n": 1}))
    [counts] = service(engine, schema, lambda s: s.count_jobs(["q"]))
    assert counts.counts["created"] == 1
    shown = pages(engine, schema, "/", f"/s/{schema}/queues/q")
    assert 'data-queue="q"' in shown["/"]
    queue_page = shown[f"/s/{schema}/queues/q"]
    assert "<dd>-infinity</dd>" in queue_page and "<dd>infinity</dd>" in queue_page
    assert "0001-01" not in queue_page and "9999-12" not in queue_page


def test_the_stats_history_of_a_queue_at_infinity_is_read(engine: Engine, schema46: str) -> None:
    service(engine, schema46, lambda q: q.create_queue("q"))
    sql(engine, f"UPDATE \"{schema46}\".queue SET created_on = 'infinity' WHERE name = 'q'")
    history = service(engine, schema46, lambda q: q.get_queue_stats_history("q"))
    assert history is not None


def test_a_subscription_at_infinity_is_read_and_shown(engine: Engine, any_schema: str) -> None:
    schema = any_schema
    service(engine, schema, lambda q: (q.create_queue("q"), q.subscribe("later", "q")))
    service(engine, schema, lambda q: q.subscribe("sooner", "q"))
    sql(
        engine,
        f"UPDATE \"{schema}\".subscription SET created_on = 'infinity',"
        " updated_on = '-infinity' WHERE event = 'later'",
    )
    found = service(engine, schema, lambda q: q.get_subscriptions(name="q"))
    assert [s.event for s in found] == ["later", "sooner"]
    assert set(found[0].unreadable) == {"created_on", "updated_on"} and found[1].unreadable == {}
    page = pages(engine, schema, f"/s/{schema}/queues/q")[f"/s/{schema}/queues/q"]
    assert "<td><code>later</code></td><td>infinity</td>" in page


@pytest.mark.parametrize("column", ["start_after", "created_on"])
def test_a_job_at_minus_infinity_is_counted_and_shown(
    engine: Engine, any_schema: str, column: str
) -> None:
    schema = any_schema
    service(engine, schema, lambda q: q.create_queue("q"))
    job_id = service(engine, schema, lambda q: q.send("q", {"n": 1}))
    service(engine, schema, lambda q: q.send("q", {"n": 2}))
    sql(engine, f"UPDATE \"{schema}\".job SET {column} = '-infinity' WHERE id = '{job_id}'")
    [counts] = service(engine, schema, lambda q: q.count_jobs())
    assert counts.counts["created"] == 2
    assert counts.oldest_ready_seconds is not None
    if column == "start_after":
        # Counted from the earliest time Python holds, as the job is read: finite, and
        # plainly older than any job could be.
        assert math.isfinite(counts.oldest_ready_seconds)
        assert counts.oldest_ready_seconds > 2000 * 365 * 86_400
    shown = pages(engine, schema, "/", f"/s/{schema}/queues/q")
    assert 'data-queue="q"' in shown["/"]
