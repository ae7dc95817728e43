"""The dashboard's overview for a screen left open (docs/how-to/dashboard.md): summary cards,
pages that refresh themselves without a script, paused with one click, and a dark theme
where the system asks for one."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient
from support.direct import rows

from alkstore_sa import InvalidOptionsError, QueueService
from alkstore_sa.dashboard import create_app

LOCAL = "http://127.0.0.1"
REFRESH = re.compile(r'<meta http-equiv="refresh" content="(\d+)">')


def _client(engine: Engine, schema: str, **options: Any) -> TestClient:
    app = create_app(engine, schemas=[schema], **options)
    return TestClient(app, base_url=LOCAL, headers={"origin": LOCAL})


def _cards(html: str) -> dict[str, int]:
    found = re.findall(r'data-card="(\w+)"><span class="card-number">(\d+)</span>', html)
    return {key: int(number) for key, number in found}


def test_the_overview_sums_its_queues_in_cards(engine: Engine, schema46: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.create_queue("mail", warning_queued=2)
        q.create_queue("sms", retry_limit=0)
        for n in range(3):
            q.send("mail", {"n": n})
        q.send("sms", {})
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        [job] = q.fetch("sms")
        q.fail("sms", job.id, {"error": "no signal"})
    page = _client(engine, schema46).get("/")
    assert page.status_code == 200
    assert _cards(page.text) == {
        "queues": 2,
        "queued": 3,
        "active": 0,
        "failed": 1,
        "completed": 0,
        "flagged": 2,  # mail over its warning_queued, sms with a failure
    }
    assert 'class="card card-failed card-alert"' in page.text


def test_pages_without_forms_refresh_themselves_until_paused(engine: Engine, schema46: str) -> None:
    client = _client(engine, schema46, refresh_seconds=7)
    for path in ("/", f"/s/{schema46}/instances", f"/s/{schema46}/warnings"):
        assert REFRESH.findall(client.get(path).text) == ["7"], path
    # A page with forms does not: a reload would throw away what is being typed.
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("mail")
    for path in (f"/s/{schema46}/queues/mail", f"/s/{schema46}/jobs?queue=mail"):
        assert REFRESH.findall(client.get(path).text) == [], path

    here = f"/s/{quote(schema46, safe='')}/instances"  # as the page's own link writes it
    paused = client.get("/live", params={"on": "0", "next": here}, follow_redirects=False)
    assert paused.status_code == 303
    assert paused.headers["location"] == here
    assert "alkstore_live=off" in paused.headers["set-cookie"]
    page = client.get("/").text
    assert REFRESH.findall(page) == [] and 'id="live-resume"' in page
    resumed = client.get("/live?on=1&next=/", follow_redirects=False)
    assert resumed.headers["location"] == "/"
    assert REFRESH.findall(client.get("/").text) == ["7"]


@pytest.mark.parametrize("evil", ["https://evil.example", "//evil.example", "/s/../../x"])
def test_the_live_switch_returns_only_to_a_page_of_the_dashboard(
    engine: Engine, schema46: str, evil: str
) -> None:
    answer = _client(engine, schema46).get(f"/live?on=0&next={evil}", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/"


def test_refresh_can_be_turned_off_and_is_checked(engine: Engine, schema46: str) -> None:
    page = _client(engine, schema46, refresh_seconds=0).get("/").text
    assert REFRESH.findall(page) == [] and 'id="live' not in page
    bad_values: tuple[Any, ...] = (-1, 3601, 2.5, True, "5")
    for bad in bad_values:
        with pytest.raises(InvalidOptionsError, match="refresh_seconds"):
            create_app(engine, schemas=[schema46], refresh_seconds=bad)


def test_the_style_sheet_has_a_dark_theme_for_the_system_setting(
    engine: Engine, schema46: str
) -> None:
    client = _client(engine, schema46)
    assert '<meta name="color-scheme" content="light dark">' in client.get("/").text
    css = client.get("/static/style.css").text
    dark = css.split("@media (prefers-color-scheme: dark)", 1)[1]
    body = re.search(r"body \{[^}]*background: (#[0-9a-f]{6})", dark)
    assert body is not None and int(body.group(1)[1:3], 16) < 0x40  # a dark background


def test_a_queue_page_lists_its_newest_jobs_by_state_and_says_why_it_is_flagged(
    engine: Engine, schema46: str
) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.create_queue("mail", retry_limit=0, warning_queued=3)
        sent = [q.send("mail", {"n": n, "html": "<b>x</b>"}) for n in range(8)]
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        [job] = q.fetch("mail")
        q.fail("mail", job.id, {"error": "bounced"})
    page = _client(engine, schema46).get(f"/s/{schema46}/queues/mail").text
    assert 'id="queue-reasons"' in page and "1 failed job" in page
    failed = re.search(r'data-state="failed">(.*?)</table>', page, re.S)
    created = re.search(r'data-state="created">(.*?)</table>', page, re.S)
    assert failed is not None and created is not None
    assert re.findall(r'data-job-id="([^"]+)"', failed.group(1)) == [str(job.id)]
    shown = re.findall(r'data-job-id="([^"]+)"', created.group(1))
    assert len(shown) == 5 and set(shown) <= {str(i) for i in sent} - {str(job.id)}
    assert "(7, the newest 5" in page
    assert 'data-state="active"' not in page  # no active job: no list
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page


def _waited_and_completed(engine: Engine, schema: str) -> None:
    """A job of ``mail`` that waited half a minute for a worker, then completed."""
    with Session(engine) as session, session.begin():
        sent = QueueService(session, schema=schema).send("mail", {})
    rows(
        engine,
        schema,
        "UPDATE {s}.job SET created_on = now() - interval '30 seconds', "
        "start_after = now() - interval '30 seconds' WHERE id = :id",
        id=sent,
    )
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        [job] = q.fetch("mail")
        q.complete("mail", job.id)


def test_a_queue_page_charts_a_day_of_history_or_else_the_last_hour(
    engine: Engine, schema46: str
) -> None:
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("mail")
    _waited_and_completed(engine, schema46)
    client = _client(engine, schema46)
    page = client.get(f"/s/{schema46}/queues/mail").text
    # No history: the last hour from the job table, and how to keep more.
    assert 'data-source="jobs"' in page and 'id="charts-note"' in page
    assert "the last hour (most: 1)" in page

    # History recorded by supervision passes: a day, with wait times. A pass counts
    # what finished between the one before it and 10 s before itself, so the second
    # one runs on a clock a minute ahead to see the job that waited.
    def supervise(ahead: float) -> None:
        now = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ahead)
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema46).supervise(
                force=True, persist_queue_stats=True, now=now
            )

    supervise(0)
    _waited_and_completed(engine, schema46)
    supervise(60)
    page = client.get(f"/s/{schema46}/queues/mail").text
    assert 'data-source="history"' in page and 'id="charts-note"' not in page
    assert "the last 24 hours" in page and 'class="failed"' in page
    assert 'class="p95"' in page  # the job waited: a wait-time chart
    points = re.findall(r'<polyline class="completed" points="([^"]*)"', page)
    assert len(points) == 2 and all(p.strip() for p in points)
