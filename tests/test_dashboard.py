"""The web dashboard (alkstore_sa.dashboard) on a real PostgreSQL, through Starlette's TestClient.

Pages at schema 46 and 26, the job list's filters and keyset pages, hostile job
data rendered escaped, and the security rules: CSRF, read-only, basic auth, the
bind check, bad filters.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

from alkstore_sa import InvalidOptionsError, QueueService
from alkstore_sa.dashboard import check_bind, create_app

HOSTILE = {
    "script": "<script>alert(1)</script>",
    "attr": '"><img src=x onerror=alert(1)>',
    "url": "javascript:alert(document.cookie)",
    "rlo": "invoice\u202egpj.exe",
    "big": "x" * 1_000_000,
}


def _seed(engine: Engine, schema: str) -> dict[str, Any]:
    """Queue ``mail`` (dead letter ``mail_dlq``): 3 created jobs, one failed, one hostile."""
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("mail_dlq")
        q.create_queue("mail", dead_letter="mail_dlq", retry_limit=0)
        created = [q.send("mail", {"n": n, "to": f"user{n}@example.com"}) for n in range(3)]
        q.send("mail", {"n": 9}, singleton_key="k-9")
        q.schedule("mail", "*/5 * * * *", key="five")
        q.subscribe("mail.sent", "mail")
        failing = q.send("mail", {"n": 100}, priority=10)
        assert failing is not None
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        assert [j.id for j in q.fetch("mail", 1)] == [failing]
        q.fail("mail", failing, {"error": "<script>boom()</script>"})
    with Session(engine) as session, session.begin():
        hostile = QueueService(session, schema=schema).send("mail", HOSTILE)
    return {"created": created, "failed": failing, "hostile": hostile}


LOCAL = "http://127.0.0.1"


def _local(app: Any, base_url: str = LOCAL) -> TestClient:
    """A client as a browser on this machine is one: a loopback ``Host``, and
    the ``Origin`` of the dashboard's own pages on every request."""
    return TestClient(app, base_url=base_url, headers={"origin": base_url})


def _client(engine: Engine, schema: str, **options: Any) -> TestClient:
    return _local(create_app(engine, schemas=[schema], **options))


def _token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def _state(engine: Engine, schema: str, job_id: uuid.UUID) -> str:
    with Session(engine) as session, session.begin():
        job = QueueService(session, schema=schema).get_job("mail", job_id)
        assert job is not None
        return str(job.state)


@pytest.fixture
def seeded46(engine: Engine, schema46: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield schema46, _seed(engine, schema46)


def test_every_page_at_46(engine: Engine, seeded46: tuple[str, dict[str, Any]]) -> None:
    schema, ids = seeded46
    with engine.begin() as conn:  # two recorded stats rows: a sparkline
        # Twenty minutes back may be yesterday (UTC), whose day partition a schema installed
        # after midnight lacks: made here as a pass would have made it then.
        day = conn.execute(
            text("SELECT ((now() - interval '20 minutes') AT TIME ZONE 'UTC')::date")
        ).scalar_one()
        after = day + dt.timedelta(days=1)
        conn.execute(
            text(
                f'CREATE TABLE IF NOT EXISTS "{schema}".queue_stats_{day:%Y%m%d} PARTITION OF '
                f"\"{schema}\".queue_stats FOR VALUES FROM ('{day} 00:00:00+00') "
                f"TO ('{after} 00:00:00+00')"
            )
        )
        for minutes, done in ((20, 5), (10, 9)):
            conn.execute(
                text(
                    f'INSERT INTO "{schema}".queue_stats (name, captured_on, queued_count,'
                    " deferred_count, total_count, completed_delta, delta_on)"
                    " VALUES ('mail', now() - make_interval(mins => :m), 1, 0, 5, :d,"
                    " now() - make_interval(mins => :m))"
                ),
                {"m": minutes, "d": done},
            )
    client = _client(engine, schema)
    overview = client.get("/")
    assert overview.status_code == 200
    assert f'<table class="queues" data-schema="{schema}">' in overview.text
    row = re.search(r'<tr data-queue="mail".*?</tr>', overview.text, re.S)
    assert row is not None
    assert re.search(r'class="count-failed"><a [^>]*>1</a>', row.group(0))
    # The queue with a failed job comes first: problem queues lead.
    assert overview.text.index('data-queue="mail"') < overview.text.index('data-queue="mail_dlq"')
    assert '<polyline points="' in row.group(0)
    for path in ("queues/mail", "jobs", "schedules", "instances", "warnings"):
        page = client.get(f"/s/{schema}/{path}")
        assert page.status_code == 200, (path, page.text[:500])
    queue = client.get(f"/s/{schema}/queues/mail").text
    assert '<dl id="queue-options">' in queue and 'id="dead-letter-link"' in queue
    subscriptions = re.search(r'<table id="queue-subscriptions">(.*?)</table>', queue, re.S)
    assert subscriptions is not None and "<code>mail.sent</code>" in subscriptions.group(1)
    schedules = client.get(f"/s/{schema}/schedules").text
    assert re.search(r'class="next-fire">\d{4}-\d\d-\d\d \d\d:\d[05]:00 UTC', schedules)
    job = client.get(f"/s/{schema}/jobs/{ids['failed']}")
    assert job.status_code == 200
    assert '<span id="job-state" class="state-failed">failed</span>' in job.text
    assert '<ol id="timeline">' in job.text and 'id="action-retry"' in job.text
    assert client.get("/healthz").text == "ok"
    headers = overview.headers
    assert "default-src 'self'" in headers["content-security-policy"]
    assert headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff"
    assert headers["referrer-policy"]


def test_schema_26_pages(engine: Engine, schema: str) -> None:
    ids = _seed(engine, schema)
    client = _client(engine, schema)
    overview = client.get("/")
    assert overview.status_code == 200 and 'data-queue="mail"' in overview.text
    assert "needs schema 46" in overview.text
    job = client.get(f"/s/{schema}/jobs/{ids['created'][0]}?queue=mail")
    assert job.status_code == 200 and ">created</span>" in job.text
    assert client.get(f"/s/{schema}/jobs?queue=mail").status_code == 200
    warnings = client.get(f"/s/{schema}/warnings")
    assert warnings.status_code == 200 and 'id="needs-46"' in warnings.text
    # A group filter needs 46: a message, not a server error.
    assert client.get(f"/s/{schema}/jobs?group=g").status_code == 400


def test_filters_and_keyset_pages(engine: Engine, seeded46: tuple[str, dict[str, Any]]) -> None:
    schema, ids = seeded46
    client = _client(engine, schema)

    def listed(query: str) -> list[tuple[str, str]]:
        page = client.get(f"/s/{schema}/jobs?{query}")
        assert page.status_code == 200, page.text[:500]
        return re.findall(r'<tr data-job-id="([0-9a-f-]{36})" data-state="(\w+)">', page.text)

    assert listed("queue=mail&state=failed") == [(str(ids["failed"]), "failed")]
    assert [j for j, _ in listed("queue=mail&key=k-9")] and len(listed("key=k-9")) == 1
    assert len(listed("q=user1%40example")) == 1
    assert listed("queue=mail_dlq&state=failed") == []
    # since/until bound created_on: one job moved to 2001 is alone in 2001, and the only
    # one missing from a range that starts after it.
    with engine.begin() as conn:
        conn.execute(
            text(f"UPDATE \"{schema}\".job SET created_on = '2001-06-01Z' WHERE id = :id"),
            {"id": ids["failed"]},
        )
    everyone = {j for j, _ in listed("")}
    assert listed("since=2001-01-01&until=2002-01-01") == [(str(ids["failed"]), "failed")]
    later = {j for j, _ in listed("since=2002-01-01&until=2999-01-01")}
    assert later == everyone - {str(ids["failed"])} and len(later) >= 5
    assert listed("since=2000-01-01&until=2001-06-01") == []  # until excluded

    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema).send_many(
            "mail", [{"data": {"bulk": n}} for n in range(120)]
        )
    first = client.get(f"/s/{schema}/jobs?queue=mail")
    first_ids = re.findall(r'<tr data-job-id="([0-9a-f-]{36})"', first.text)
    link = re.search(r'<a id="next-page" href="([^"]+)"', first.text)
    assert link is not None and len(first_ids) == 50
    second = client.get(link.group(1).replace("&amp;", "&"))
    second_ids = re.findall(r'<tr data-job-id="([0-9a-f-]{36})"', second.text)
    assert len(second_ids) == 50 and not set(first_ids) & set(second_ids)
    assert f'<a id="first-page" href="/s/{schema}/jobs?queue=mail">' in second.text
    assert 'id="first-page"' not in first.text


def test_hostile_data_is_escaped(engine: Engine, seeded46: tuple[str, dict[str, Any]]) -> None:
    schema, ids = seeded46
    client = _client(engine, schema)
    for path in (f"jobs/{ids['hostile']}?queue=mail", "jobs?queue=mail", f"jobs/{ids['failed']}"):
        html = client.get(f"/s/{schema}/{path}").text
        assert "<script>" not in html and "<img" not in html
        assert "\u202e" not in html
    job = client.get(f"/s/{schema}/jobs/{ids['hostile']}?queue=mail").text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in job
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in job
    assert "\\u202e" in job and "x" * 1_000_000 in job
    assert 'href="javascript:' not in job
    failed = client.get(f"/s/{schema}/jobs/{ids['failed']}").text
    assert "&lt;script&gt;boom()&lt;/script&gt;" in failed
    # Error pages quote what was asked for, escaped.
    for path, status in (
        ("/s/%3Cscript%3E/jobs", 404),
        (f"/s/{schema}/jobs?state=%3Cscript%3E", 400),
        (f"/s/{schema}/jobs?queue=%3Cscript%3E", 200),  # no such queue: no jobs
        (f"/s/{schema}/queues/%3Cscript%3E", 404),
        (f"/s/{schema}/jobs?queue=%3Cscript%3E{'x' * 1000}", 400),  # no queue has it
    ):
        page = client.get(path)
        assert page.status_code == status and "&lt;script&gt;" in page.text, path
        assert "<script>" not in page.text


def test_retry_through_confirmation(engine: Engine, seeded46: tuple[str, dict[str, Any]]) -> None:
    schema, ids = seeded46
    client = _client(engine, schema)
    page = client.get(f"/s/{schema}/jobs/{ids['failed']}?queue=mail").text
    form = {"ids": str(ids["failed"]), "queue": "mail", "csrf_token": _token(page)}
    confirm = client.post(f"/s/{schema}/actions/retry", data=form)
    assert confirm.status_code == 200 and 'id="confirm"' in confirm.text
    assert 'name="confirm" value="yes"' in confirm.text
    assert _state(engine, schema, ids["failed"]) == "failed"
    done = client.post(
        f"/s/{schema}/actions/retry", data={**form, "confirm": "yes"}, follow_redirects=False
    )
    assert done.status_code == 303
    assert _state(engine, schema, ids["failed"]) == "retry"
    after = client.get(done.headers["location"])
    assert '<div class="flash">retried 1 job(s)</div>' in after.text
    assert ">retry</span>" in after.text

    # Bulk, from the job list's checkboxes: the list's own form, then the confirmation.
    listing = client.get(f"/s/{schema}/jobs?queue=mail&state=created").text
    assert 'name="scope" value="selected"' in listing
    chosen = [str(i) for i in ids["created"][:2]]
    bulk = {"ids": chosen, "scope": "selected", "csrf_token": _token(listing)}
    assert client.post(f"/s/{schema}/actions/cancel", data={**bulk, "ids": []}).status_code == 400
    assert 'id="confirm"' in client.post(f"/s/{schema}/actions/cancel", data=bulk).text
    client.post(f"/s/{schema}/actions/cancel", data={**bulk, "confirm": "yes"})
    assert [_state(engine, schema, uuid.UUID(i)) for i in chosen] == ["cancelled"] * 2
    assert _state(engine, schema, ids["created"][2]) == "created"

    # Redrive the dead-letter copy of the failed job back to the queue it failed in.
    queue_page = client.get(f"/s/{schema}/queues/mail_dlq").text
    redrive = {"queue": "mail_dlq", "csrf_token": _token(queue_page), "confirm": "yes"}
    moved = client.post(f"/s/{schema}/actions/redrive", data=redrive)
    assert '<div class="flash">redrove 1 job(s) out of mail_dlq</div>' in moved.text
    with Session(engine) as session, session.begin():
        left = QueueService(session, schema=schema).find_jobs("mail_dlq", state="created")
        assert left.jobs == []


def test_csrf_read_only_and_errors(engine: Engine, seeded46: tuple[str, dict[str, Any]]) -> None:
    schema, ids = seeded46
    client = _client(engine, schema)
    client.get("/")  # the CSRF cookie
    form = {"ids": str(ids["failed"]), "queue": "mail", "confirm": "yes"}
    assert client.post(f"/s/{schema}/actions/retry", data=form).status_code == 403
    forged = client.post(f"/s/{schema}/actions/retry", data={**form, "csrf_token": "0" * 64})
    assert forged.status_code == 403
    assert _state(engine, schema, ids["failed"]) == "failed"

    token = _token(client.get(f"/s/{schema}/queues/mail").text)
    bad_json = client.post(
        f"/s/{schema}/send", data={"queue": "mail", "data": "{nope", "csrf_token": token}
    )
    assert bad_json.status_code == 400 and "not valid JSON" in bad_json.text
    bad_option = client.post(
        f"/s/{schema}/queues",
        data={"mode": "create", "name": "q2", "retry_limit": "-5", "csrf_token": token},
    )
    assert bad_option.status_code == 400 and "retry_limit" in bad_option.text
    assert "Traceback" not in bad_option.text
    # Queue-wide: the confirmation counts the jobs; bad fields are refused before it.
    wide = {"queue": "mail", "csrf_token": token}
    confirm = client.post(f"/s/{schema}/actions/retry", data=wide).text
    assert '<p id="confirm-matching">1 job(s) match now.</p>' in confirm
    for act, bad in (
        ("delete", {}),  # no state
        ("retry", {"queue": "x" * 1001}),  # longer than any queue name
        ("redrive", {"to": "<b>" + "x" * 1001}),
    ):
        refused_page = client.post(f"/s/{schema}/actions/{act}", data={**wide, **bad})
        assert refused_page.status_code == 400 and "<b>" not in refused_page.text, act
    assert client.get(f"/s/{schema}/jobs?state=bogus").status_code == 400
    assert client.get(f"/s/{schema}/jobs?since=yesterday").status_code == 400
    assert client.get(f"/s/{schema}/jobs?after=garbage").status_code == 400
    assert client.get(f"/s/{schema}/jobs/not-a-uuid").status_code == 400

    ro = _client(engine, schema, read_only=True)
    page = ro.get(f"/s/{schema}/jobs/{ids['failed']}?queue=mail").text
    assert "<form" in ro.get(f"/s/{schema}/jobs").text  # the GET filter form only
    assert 'method="post"' not in page and 'id="action-retry"' not in page
    assert 'method="post"' not in ro.get(f"/s/{schema}/queues/mail").text
    refused = ro.post(f"/s/{schema}/actions/retry", data={**form, "csrf_token": token})
    assert refused.status_code == 403
    assert _state(engine, schema, ids["failed"]) == "failed"
    assert 'method="post"' not in ro.get(f"/s/{schema}/jobs?queue=mail").text
    created = {"mode": "create", "name": "ro_made", "csrf_token": token}
    assert ro.post(f"/s/{schema}/queues", data=created).status_code == 403
    sent = {"queue": "mail", "data": "{}", "csrf_token": token}
    assert ro.post(f"/s/{schema}/send", data=sent).status_code == 403
    assert ro.post("/", data={}).status_code == 403
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        assert q.get_queue("ro_made") is None
        assert len(q.find_jobs("mail").jobs) == 6


def test_basic_auth_and_bind(engine: Engine, schema46: str) -> None:
    client = _client(engine, schema46, basic_auth=("admin", "s3cret"))
    denied = client.get("/")
    assert denied.status_code == 401 and denied.headers["www-authenticate"].startswith("Basic")
    wrong = base64.b64encode(b"admin:nope").decode()
    assert client.get("/", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
    right = base64.b64encode(b"admin:s3cret").decode()
    assert client.get("/", headers={"Authorization": f"Basic {right}"}).status_code == 200
    assert client.get("/healthz").status_code == 200  # for load balancers
    assert client.get(f"/s/{schema46}/queues/healthz").status_code == 401
    for path in ("/metrics", "/static/style.css", f"/s/{schema46}/jobs"):
        assert client.get(path).status_code == 401, path
    assert client.post(f"/s/{schema46}/queues", data={"name": "x"}).status_code == 401

    hooked = _client(engine, schema46, auth=lambda request: request.headers.get("x-ok") == "1")
    assert hooked.get("/").status_code == 403
    assert hooked.get("/", headers={"x-ok": "1"}).status_code == 200

    with pytest.raises(InvalidOptionsError, match="without authentication"):
        check_bind("0.0.0.0", has_auth=False)
    with pytest.raises(InvalidOptionsError, match="without authentication"):
        check_bind("192.168.1.10", has_auth=False)
    check_bind("0.0.0.0", has_auth=True)
    for host in ("127.0.0.1", "::1", "localhost"):
        check_bind(host, has_auth=False)


def test_cli_refuses_public_bind(monkeypatch: pytest.MonkeyPatch, database_url: str) -> None:
    from alkstore_sa.cli import main

    monkeypatch.delenv("ALKSTORE_DASHBOARD_USER", raising=False)
    monkeypatch.delenv("ALKSTORE_DASHBOARD_PASSWORD", raising=False)
    code = main(["dashboard", "--database-url", database_url, "--host", "0.0.0.0"])
    assert code == 2


def test_flow_links_on_job_page(engine: Engine, schema46: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.create_queue("steps")
        refs = q.flow(
            [
                {"ref": "fetch", "name": "steps", "data": {"step": 1}},
                {"ref": "report", "name": "steps", "data": {"step": 2}, "depends_on": ["fetch"]},
            ]
        )
    client = _client(engine, schema46)
    child = client.get(f"/s/{schema46}/jobs/{refs['report']}?queue=steps").text
    parents = re.search(r'<ul id="flow-parents">(.*?)</ul>', child, re.S)
    assert parents is not None and f'data-job-id="{refs["fetch"]}"' in parents.group(1)
    assert 'id="flow-children"' not in child
    parent = client.get(f"/s/{schema46}/jobs/{refs['fetch']}?queue=steps").text
    children = re.search(r'<ul id="flow-children">(.*?)</ul>', parent, re.S)
    assert children is not None and f'data-job-id="{refs["report"]}"' in children.group(1)


def test_next_cookies_and_limits(engine: Engine, seeded46: tuple[str, dict[str, Any]]) -> None:
    schema, ids = seeded46
    # Mounted under /ops, served over https: the cookies say so.
    outer = Starlette(routes=[Mount("/ops", app=create_app(engine, schemas=[schema]))])
    client = _local(outer, base_url="https://localhost")
    page = client.get(f"/ops/s/{schema}/jobs/{ids['failed']}?queue=mail")
    cookie = page.headers["set-cookie"].lower()
    assert "alkstore_csrf=" in cookie and "path=/ops" in cookie and "httponly" in cookie
    assert "samesite=strict" in cookie and "secure" in cookie
    form = {"ids": str(ids["failed"]), "queue": "mail", "csrf_token": _token(page.text)}
    fallback = f"/ops/s/{quote(schema)}/jobs/{ids['failed']}?queue=mail"
    for evil in (
        "https://evil.example",
        "//evil.example",
        "/\\evil.example",
        "/\t/evil.example",
        "/elsewhere",  # this site, but not the dashboard
    ):
        done = client.post(
            f"/ops/s/{schema}/actions/retry",
            data={**form, "confirm": "yes", "next": evil},
            follow_redirects=False,
        )
        assert done.status_code == 303 and done.headers["location"] == fallback, evil
    assert "secure" in done.headers["set-cookie"].lower()  # the flash cookie too
    kept = f"/ops/s/{quote(schema)}/jobs?queue=mail"
    done = client.post(
        f"/ops/s/{schema}/actions/retry",
        data={**form, "confirm": "yes", "next": kept},
        follow_redirects=False,
    )
    assert done.headers["location"] == kept
    confirm = client.post(f"/ops/s/{schema}/actions/delete", data={**form, "next": kept}).text
    assert str(ids["failed"]) in confirm and f'id="cancel-confirm" href="{kept}"' in confirm

    # A token or a flash cookie out of ASCII is refused, not a server error.
    odd = client.post(f"/ops/s/{schema}/actions/retry", data={**form, "csrf_token": "\u00e9" * 8})
    assert odd.status_code == 403
    many = [str(uuid.uuid4()) for _ in range(1001)]
    too_many = client.post(f"/ops/s/{schema}/actions/cancel", data={**form, "ids": many})
    assert too_many.status_code == 400 and "at most 1000" in too_many.text
    odd_flash = "alkstore_flash=a.\u00c3\u00a9".encode("latin-1")
    flash = client.get("/ops/", headers={b"cookie": odd_flash})
    assert flash.status_code == 200 and 'class="flash"' not in flash.text


def test_timeouts_outage_and_queue_counts(engine: Engine, schema46: str) -> None:
    app = create_app(engine, schemas=[schema46], statement_timeout_ms=200)
    client = _local(app)
    assert f"No queues in schema {schema46} yet." in client.get("/").text
    with pytest.raises(DBAPIError, match="statement timeout"):
        app.state.dashboard._session_work(
            schema46, lambda q: q.session.execute(text("SELECT pg_sleep(5)")), write=False
        )
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        for n in range(200):
            q.create_queue(f"q{n:03}")
        q.send("q007", {"n": 1})
    overview = client.get("/").text
    assert len(re.findall(r'<tr data-queue="q\d{3}"', overview)) == 200
    assert overview.count("(first 50 queues only)") == 150
    assert "cached-counts" not in overview

    # The job table locked: counting it times out. The overview falls back to
    # the queue table's cached counters and says so; a queue page is a 503 page.
    with engine.connect() as locker:
        locker.execute(text(f'LOCK TABLE "{schema46}".job IN ACCESS EXCLUSIVE MODE'))
        slow = client.get("/")
        assert slow.status_code == 200 and f'id="cached-counts-{schema46}"' in slow.text
        assert len(re.findall(r'<tr data-queue="q\d{3}"', slow.text)) == 200
        stuck = client.get(f"/s/{schema46}/queues/q007")
        assert stuck.status_code == 503 and "statement timeout" in stuck.text
        locker.rollback()

    # Every pooled connection busy: a 503 page too.
    small = create_engine(engine.url, pool_size=1, max_overflow=0, pool_timeout=0.1)
    try:
        with small.connect():
            busy = _local(create_app(small, schemas=[schema46])).get("/")
            assert busy.status_code == 503 and 'id="error-message"' in busy.text
    finally:
        small.dispose()

    down = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/none")
    try:
        outage = _local(create_app(down, schemas=["pgboss"]))
        for path in ("/", "/s/pgboss/jobs"):
            page = outage.get(path)
            assert page.status_code == 503 and 'id="error-message"' in page.text, path
            assert "Traceback" not in page.text
    finally:
        down.dispose()


def test_a_job_page_offers_only_what_its_state_allows(
    engine: Engine, seeded46: tuple[str, dict[str, Any]]
) -> None:
    schema, ids = seeded46
    client = _client(engine, schema)

    def buttons(job_id: uuid.UUID) -> list[str]:
        page = client.get(f"/s/{schema}/jobs/{job_id}?queue=mail").text
        return re.findall(r'<button id="action-(\w+)"', page)

    assert buttons(ids["failed"]) == ["retry", "delete"]
    assert buttons(ids["created"][0]) == ["cancel", "delete"]
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema).cancel("mail", ids["created"][0])
    assert buttons(ids["created"][0]) == ["resume", "delete"]
