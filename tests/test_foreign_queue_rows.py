"""Queue rows another client wrote, which we would never write, stop nobody else.

Written through raw SQL (the schema's own ``create_queue`` function, then a plain
UPDATE), as Node pg-boss or a SQL console could write them: a queue whose name our
``create_queue`` refuses, and one whose policy this release does not know
(docs/concepts/guarantees.md).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from support.skips import require_module

from alkstore_sa import UnknownPolicyError
from alkstore_sa.models.enums import QueuePolicy


def foreign_queue(env: Any, name: str) -> None:
    env.sql("SELECT {s}.create_queue(:n, jsonb_build_object('policy', 'standard'))", n=name)


def test_expiry_runs_for_every_queue_beside_one_whose_name_we_would_refuse(
    env46_sync: Any,
) -> None:
    env = env46_sync
    env.tx(lambda q: q.create_queue("good", expire_seconds=1))
    foreign_queue(env, "my queue")
    foreign_queue(env, "x" * 201)
    job = env.tx(lambda q: q.send("good", {}))
    env.tx(lambda q: q.fetch("good"))
    env.sql("UPDATE {s}.job SET started_on = now() - interval '1 hour' WHERE id = :id", id=job)
    report = env.tx(lambda q: q.supervise())
    # Before, expiry re-validated the names it read and failed for every queue.
    assert report.errors == ()
    assert report.expired == {"good": 1}
    assert env.tx(lambda q: q.get_job("good", job)).state.value == "retry"


def test_a_queue_with_an_unknown_policy_is_listed_and_never_served(env46_sync: Any) -> None:
    env = env46_sync
    env.tx(lambda q: q.create_queue("good"))
    foreign_queue(env, "odd")
    env.sql("UPDATE {s}.queue SET policy = 'bogus' WHERE name = 'odd'")
    env.sql("INSERT INTO {s}.job (name, policy) VALUES ('odd', 'bogus')")
    queues = {q.name: q.policy for q in env.tx(lambda q: q.get_queues())}
    assert queues == {"good": QueuePolicy.STANDARD, "odd": "bogus"}
    for call in (lambda q: q.fetch("odd"), lambda q: q.send("odd", {})):
        with pytest.raises(UnknownPolicyError) as caught:
            env.tx(call)
        assert (caught.value.queue, caught.value.policy) == ("odd", "bogus")
    # The caller's transaction goes on after the error: its own write commits.
    svc = env.service()
    svc.send("good", {"mine": 1})
    with pytest.raises(UnknownPolicyError):
        svc.send("odd", {})
    env.commit()
    assert env.sql("SELECT count(*) FROM {s}.job WHERE name = 'good'") == [(1,)]
    assert env.sql("SELECT state::text FROM {s}.job WHERE name = 'odd'") == [("created",)]


def test_the_dashboard_shows_foreign_queues_beside_the_others(env46_sync: Any) -> None:
    require_module("starlette", "the dashboard extra")
    from starlette.testclient import TestClient

    from alkstore_sa.dashboard import create_app

    env = env46_sync
    env.tx(lambda q: q.create_queue("good"))
    env.tx(lambda q: q.send("good", {}))
    foreign_queue(env, "my queue")
    foreign_queue(env, "x" * 201)
    foreign_queue(env, "odd")
    env.sql("UPDATE {s}.queue SET policy = 'bogus' WHERE name = 'odd'")
    client = TestClient(create_app(env.engine, schemas=[env.schema]), base_url="http://127.0.0.1")
    overview = client.get("/")
    assert overview.status_code == 200, overview.text
    for name in ("good", "my queue", "x" * 201, "odd"):
        assert f'data-queue="{name}"' in overview.text, name
    odd = client.get(f"/s/{env.schema}/queues/odd")
    assert odd.status_code == 200 and "bogus" in odd.text


def test_the_dashboard_links_and_redirects_to_a_queue_by_any_name(env46_sync: Any) -> None:
    """A name with a space, ``#``, ``?`` and a letter outside ASCII is percent-encoded
    in every link and redirect: unencoded, the link pointed at another page and the
    redirect after an action was a 500 (a header holds ASCII only)."""
    require_module("starlette", "the dashboard extra")
    import re

    from starlette.testclient import TestClient

    from alkstore_sa.dashboard import create_app

    env = env46_sync
    name = "né #1?x"
    foreign_queue(env, name)
    client = TestClient(
        create_app(env.engine, schemas=[env.schema]),
        base_url="http://127.0.0.1",
        headers={"origin": "http://127.0.0.1"},
    )
    overview = client.get("/")
    link = f"/s/{quote(env.schema)}/queues/n%C3%A9%20%231%3Fx"
    assert f'href="{link}"' in overview.text
    page = client.get(link)
    assert page.status_code == 200 and f"Queue {name}" in page.text
    token = re.search(r'name="csrf_token" value="([^"]+)"', page.text)
    assert token is not None
    done = client.post(
        f"/s/{env.schema}/actions/retry",
        data={"queue": name, "csrf_token": token.group(1), "confirm": "yes"},
        follow_redirects=False,
    )
    assert done.status_code == 303 and done.headers["location"] == link


BIG = "('{\"n\": ' || repeat('9', 5000) || '}')::jsonb"  # an integer Python will not convert
DEEP = "(repeat('[', 300) || repeat(']', 300))::jsonb"  # deeper than MAX_JSON_DEPTH


def test_warning_and_instance_rows_python_cannot_read_stop_no_listing(env46_sync: Any) -> None:
    require_module("starlette", "the dashboard extra")
    from starlette.testclient import TestClient

    from alkstore_sa.dashboard import create_app

    env = env46_sync
    env.sql(
        "INSERT INTO {s}.warning (type, message, data, created_on) VALUES"
        " ('slow', 'big', " + BIG + ", now()), ('slow', 'deep', " + DEEP + ", now()),"
        " ('slow', 'late', '{}', 'infinity'), ('slow', 'fine', '{\"a\": 1}', now())"
    )
    env.sql(
        "INSERT INTO {s}.instance (id, host, pid, version, node_version, heartbeat_seconds,"
        " supervise, schedule, migrate, persist_queue_stats, persist_warnings, workers,"
        " metrics, config) VALUES (gen_random_uuid(), 'h', 1, 'v', 'n', 30, true, true,"
        " true, true, true, " + DEEP + ", " + BIG + ", '{}'), (gen_random_uuid(), 'ok', 2,"
        " 'v', 'n', 30, true, true, true, true, true, '[]', NULL, '{}')"
    )
    # Before, each listing raised ValueError or RecursionError for the whole table.
    warnings = {w.message: w for w in env.tx(lambda q: q.get_warnings())}
    assert set(warnings) == {"big", "deep", "late", "fine"}
    assert warnings["fine"].data == {"a": 1} and warnings["fine"].unreadable == {}
    assert (
        warnings["big"].data is None and "cannot be decoded" in warnings["big"].unreadable["data"]
    )
    assert "deeper than" in warnings["deep"].unreadable["data"]
    assert "infinity" in warnings["late"].unreadable["created_on"]
    instances = {i.host: i for i in env.tx(lambda q: q.get_instances())}
    assert instances["ok"].unreadable == {} and instances["ok"].workers == []
    bad = instances["h"]
    assert set(bad.unreadable) == {"workers", "metrics"} and bad.workers == []
    client = TestClient(create_app(env.engine, schemas=[env.schema]), base_url="http://127.0.0.1")
    for page in ("warnings", "instances"):
        assert client.get(f"/s/{env.schema}/{page}").status_code == 200, page
