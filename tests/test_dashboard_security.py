"""The dashboard's outer checks (alkstore_sa/dashboard/_security.py): DNS rebinding
(a foreign ``Host``), cross-origin POSTs, CSRF tokens bound to who is logged in,
security headers on every response (a 500 included), hostile form input, and
redirects and names that try to leave their place.

One schema at 46 seeded per test; every refusal checks that nothing changed.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.authentication import SimpleUser
from starlette.requests import Request
from starlette.routing import Mount
from starlette.testclient import TestClient

from alkstore_sa import InvalidOptionsError, QueueService
from alkstore_sa._hosts import bind_address
from alkstore_sa.dashboard import check_bind, create_app

Scope = MutableMapping[str, Any]


def _seed(engine: Engine, schema: str) -> uuid.UUID:
    """Queue ``mail`` with one failed job (its id) and a schedule ``five``."""
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("mail", retry_limit=0)
        q.schedule("mail", "*/5 * * * *", key="five")
        job = q.send("mail", {"secret": "the job list"})
        assert job is not None
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        assert [j.id for j in q.fetch("mail", 1)] == [job]
        q.fail("mail", job, {"error": "boom"})
    return job


def _state(engine: Engine, schema: str, job: uuid.UUID) -> str:
    with Session(engine) as session:
        found = QueueService(session, schema=schema).get_job("mail", job)
        assert found is not None
        return str(found.state)


def _count(engine: Engine, schema: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f'SELECT count(*) FROM "{schema}".job')).scalar_one())


def _token(html: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, "no CSRF token on the page"
    return found.group(1)


def _headers_ok(response: Any) -> None:
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.fixture
def seeded(engine: Engine, schema46: str) -> tuple[str, uuid.UUID]:
    return schema46, _seed(engine, schema46)


def test_a_rebound_page_reads_and_changes_nothing(
    engine: Engine, seeded: tuple[str, uuid.UUID]
) -> None:
    schema, job = seeded
    app = create_app(engine, schemas=[schema])
    # What a page on evil.example, its name rebound to 127.0.0.1, sends: its own
    # name as Host and as Origin (to the browser it is same-origin).
    evil = TestClient(app, base_url="http://evil.example:8765")
    evil.headers["origin"] = "http://evil.example:8765"
    for path in ("/", f"/s/{schema}/jobs", f"/s/{schema}/jobs/{job}?queue=mail", "/metrics"):
        page = evil.get(path)
        assert page.status_code == 400, path
        assert "the job list" not in page.text and "csrf_token" not in page.text
        assert "not allowed" in page.text and "evil.example" in page.text
        _headers_ok(page)
    # Even with a token from a real page, the POST is refused at the door.
    local = TestClient(app, base_url="http://127.0.0.1:8765")
    token = _token(local.get(f"/s/{schema}/jobs/{job}?queue=mail").text)
    evil.cookies.update(local.cookies)
    done = evil.post(
        f"/s/{schema}/actions/delete",
        data={"ids": str(job), "queue": "mail", "csrf_token": token, "confirm": "yes"},
        follow_redirects=False,
    )
    assert done.status_code == 400 and _state(engine, schema, job) == "failed"


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8765", "127.0.0.1", "127.1.2.3:80", "[::1]:8765", "LOCALHOST."]
)
def test_loopback_names_are_served(engine: Engine, schema46: str, host: str) -> None:
    client = TestClient(create_app(engine, schemas=[schema46]))
    page = client.get("/", headers={"host": host})
    assert page.status_code == 200, page.text
    _headers_ok(page)


@pytest.mark.parametrize(
    "host", ["", "evil.example", "127.0.0.1.evil.example", "user@127.0.0.1", "127.0.0.1:99999"]
)
def test_other_names_are_refused(engine: Engine, schema46: str, host: str) -> None:
    client = TestClient(create_app(engine, schemas=[schema46]))
    assert client.get("/", headers={"host": host}).status_code == 400


def test_allowed_hosts_and_authentication(engine: Engine, schema46: str) -> None:
    named = TestClient(create_app(engine, schemas=[schema46], allowed_hosts=["Dash.Internal"]))
    assert named.get("/", headers={"host": "dash.internal:443"}).status_code == 200
    assert named.get("/", headers={"host": "other.internal"}).status_code == 400
    # Loopback names stay served next to the ones listed.
    assert named.get("/", headers={"host": "127.0.0.1"}).status_code == 200
    anyone = TestClient(create_app(engine, schemas=[schema46], allowed_hosts=["*"]))
    assert anyone.get("/", headers={"host": "whatever.example"}).status_code == 200
    # Authenticated and no list: any name (the proxy's), the credentials guard it.
    authed = TestClient(create_app(engine, schemas=[schema46], basic_auth=("ops", "pw")))
    assert authed.get("/", headers={"host": "dash.example.com"}).status_code == 401
    assert authed.get("/", auth=("ops", "pw"), headers={"host": "dash.example.com"}).is_success
    for bad in (["bad host"], ["a/b"], [""], [7]):
        with pytest.raises(InvalidOptionsError, match="allowed_hosts"):
            create_app(engine, schemas=[schema46], allowed_hosts=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({}, False),  # no Origin, no Sec-Fetch-Site: not from a page of ours
        ({"origin": "http://evil.example"}, False),
        ({"origin": "http://127.0.0.1:9999"}, False),  # another port, another origin
        ({"origin": "null"}, False),
        ({"origin": "http://127.0.0.1:8765", "sec-fetch-site": "cross-site"}, False),
        ({"sec-fetch-site": "same-site"}, False),
        ({"origin": "http://127.0.0.1:8765"}, True),
        ({"origin": "https://127.0.0.1:8765"}, True),  # a TLS proxy in front
        ({"sec-fetch-site": "same-origin"}, True),
    ],
)
def test_a_change_must_come_from_the_dashboards_own_page(
    engine: Engine, seeded: tuple[str, uuid.UUID], headers: dict[str, str], allowed: bool
) -> None:
    schema, job = seeded
    client = TestClient(create_app(engine, schemas=[schema]), base_url="http://127.0.0.1:8765")
    token = _token(client.get(f"/s/{schema}/jobs/{job}?queue=mail").text)
    done = client.post(
        f"/s/{schema}/actions/retry",
        data={"ids": str(job), "queue": "mail", "csrf_token": token, "confirm": "yes"},
        headers=headers,
        follow_redirects=False,
    )
    if allowed:
        assert done.status_code == 303 and _state(engine, schema, job) == "retry"
    else:
        assert done.status_code == 403 and "cross-origin" in done.text
        assert _state(engine, schema, job) == "failed"
        _headers_ok(done)


def test_the_csrf_token_is_bound_to_who_is_logged_in(
    engine: Engine, seeded: tuple[str, uuid.UUID]
) -> None:
    schema, job = seeded
    dashboard = create_app(engine, schemas=[schema], auth=lambda request: True)

    async def login(scope: Scope, receive: Callable[[], Awaitable[Any]], send: Any) -> None:
        # The mounting application's authentication: the user from a header.
        if scope["type"] == "http":
            user = dict(scope["headers"]).get(b"x-user", b"").decode()
            scope["user"] = SimpleUser(user)
        await dashboard(scope, receive, send)

    client = TestClient(login, base_url="http://127.0.0.1", headers={"origin": "http://127.0.0.1"})
    page = client.get(f"/s/{schema}/jobs/{job}?queue=mail", headers={"x-user": "alice"})
    form = {"ids": str(job), "queue": "mail", "csrf_token": _token(page.text), "confirm": "yes"}
    # Alice's token (same browser, same cookie) is not Mallory's.
    stolen = client.post(
        f"/s/{schema}/actions/retry",
        data=form,
        headers={"x-user": "mallory"},
        follow_redirects=False,
    )
    assert stolen.status_code == 403 and "invalid CSRF token" in stolen.text
    assert _state(engine, schema, job) == "failed"
    own = client.post(
        f"/s/{schema}/actions/retry", data=form, headers={"x-user": "alice"}, follow_redirects=False
    )
    assert own.status_code == 303 and _state(engine, schema, job) == "retry"


def test_every_response_carries_the_headers_a_500_included(
    engine: Engine, schema46: str, caplog: pytest.LogCaptureFixture
) -> None:
    def broken_hook(request: Request) -> bool:
        raise RuntimeError("the application's hook is broken")

    client = TestClient(
        create_app(engine, schemas=[schema46], auth=broken_hook), base_url="http://127.0.0.1"
    )
    failed = client.get("/")
    assert failed.status_code == 500 and "internal error" in failed.text
    assert "broken" not in failed.text  # the reason goes to the log, not the page
    assert "the application's hook is broken" in caplog.text
    _headers_ok(failed)
    plain = TestClient(create_app(engine, schemas=[schema46]), base_url="http://127.0.0.1")
    for response in (
        plain.get("/"),
        plain.get("/healthz"),
        plain.get("/static/style.css"),
        plain.get("/s/nope/jobs"),  # 404
        plain.get(f"/s/{schema46}/jobs?state=bogus"),  # 400
        plain.post(f"/s/{schema46}/send", data={}),  # 403: no Origin
    ):
        _headers_ok(response)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"n": ' + "9" * 5000 + "}", "not valid JSON"),
        ('{"n": 1', "not valid JSON"),
    ],
    ids=["nested-100k-deep", "5000-digit-integer", "truncated"],
)
def test_hostile_send_form_data_is_a_400_and_writes_nothing(
    engine: Engine, seeded: tuple[str, uuid.UUID], data: str, message: str
) -> None:
    schema, _ = seeded
    client = TestClient(
        create_app(engine, schemas=[schema]),
        base_url="http://127.0.0.1",
        headers={"origin": "http://127.0.0.1"},
    )
    token = _token(client.get(f"/s/{schema}/queues/mail").text)
    before = _count(engine, schema)
    sent = client.post(
        f"/s/{schema}/send", data={"queue": "mail", "data": data, "csrf_token": token}
    )
    assert sent.status_code == 400 and message in sent.text
    assert _count(engine, schema) == before


def test_next_with_dot_segments_stays_inside_the_mount(
    engine: Engine, seeded: tuple[str, uuid.UUID]
) -> None:
    schema, job = seeded
    outer = Starlette(routes=[Mount("/admin/queues", app=create_app(engine, schemas=[schema]))])
    client = TestClient(outer, base_url="http://localhost", headers={"origin": "http://localhost"})
    page = client.get(f"/admin/queues/s/{schema}/jobs/{job}?queue=mail")
    form = {"ids": str(job), "queue": "mail", "csrf_token": _token(page.text), "confirm": "yes"}
    fallback = f"/admin/queues/s/{quote(schema)}/jobs/{job}?queue=mail"
    for evil in (
        "/admin/queues/s/../../evil",
        "/admin/queues/%2e%2e/evil",
        "/admin/queues/s/%2E%2E/%2e%2e/%2e%2e/evil",
        "/admin/queues/./../evil",
    ):
        done = client.post(
            f"/admin/queues/s/{schema}/actions/resume",  # refused for a failed job: no change
            data={**form, "next": evil},
            follow_redirects=False,
        )
        assert done.status_code == 303 and done.headers["location"] == fallback, evil


def test_a_bidi_override_in_a_schedule_key_is_shown_escaped(
    engine: Engine, seeded: tuple[str, uuid.UUID]
) -> None:
    schema, _ = seeded
    with engine.begin() as conn:  # as a console or another client could write it
        conn.execute(
            text(f"UPDATE \"{schema}\".schedule SET key = 'night\u202egpj.exe' WHERE key = 'five'")
        )
    client = TestClient(create_app(engine, schemas=[schema]), base_url="http://127.0.0.1")
    for path in (f"/s/{schema}/queues/mail", f"/s/{schema}/schedules"):
        page = client.get(path)
        assert page.status_code == 200 and "\u202e" not in page.text, path
        assert "night\\u202egpj.exe" in page.text, path


def test_an_ipv6_loopback_in_brackets_is_bound_without_them() -> None:
    check_bind("[::1]", has_auth=False)
    assert bind_address("[::1]") == "::1"
    assert bind_address(" ::1 ") == "::1"
    assert bind_address("127.0.0.1") == "127.0.0.1"
    with pytest.raises(InvalidOptionsError, match="without authentication"):
        check_bind("[::]", has_auth=False)
