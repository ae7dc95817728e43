"""The dashboard's forms succeed, and write what they say (alkstore_sa.dashboard).

Each form is posted as a browser posts it: read from the page that shows it (its action,
its hidden fields, the CSRF token among them, the values it is filled with), with only
the fields a person would type changed, from the dashboard's own origin; a confirmation
page's form is posted the same way. Then the redirect, the flash message the next page
shows, and what the database holds now. The refusals are in tests/test_dashboard.py and
tests/test_dashboard_security.py; the retry, bulk cancel and queue-wide redrive
successes in tests/test_dashboard.py.
"""

from __future__ import annotations

import html
import uuid
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from typing import Any, TypeVar

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient

from alkstore_sa import QueueService
from alkstore_sa.dashboard import create_app

T = TypeVar("T")
LOCAL = "http://127.0.0.1"


@pytest.fixture(params=[26, 46], ids=["schema26", "schema46"])
def at(request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh schema at 26, then one at 46: every form works at both."""
    yield request.getfixturevalue("schema" if request.param == 26 else "schema46")


def browser(engine: Engine, schema: str) -> TestClient:
    """The dashboard as a browser on this machine reaches it: a loopback ``Host``, and the
    ``Origin`` of the dashboard's own pages on every request (its cookies kept)."""
    return TestClient(
        create_app(engine, schemas=[schema]), base_url=LOCAL, headers={"origin": LOCAL}
    )


def tx(engine: Engine, schema: str, work: Callable[[QueueService], T]) -> T:
    with Session(engine) as session, session.begin():
        return work(QueueService(session, schema=schema))


# ------------------------------------------------------------------ forms as a browser reads them


class Form:
    def __init__(self, attrs: dict[str, str | None]) -> None:
        self.id = attrs.get("id")
        self.action = attrs.get("action") or ""
        self.method = (attrs.get("method") or "get").lower()
        self.fields: list[tuple[str, str]] = []
        self.buttons: dict[str, str | None] = {}  # id -> formaction


class _Forms(HTMLParser):
    """The forms of a page, with the values a browser would submit (checkboxes only when
    checked; a select's selected option, or its first)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self._form: Form | None = None
        self._textarea: str | None = None
        self._text: list[str] = []
        self._select: str | None = None
        self._options: list[tuple[str, bool]] = []
        self._option: tuple[str | None, bool] | None = None

    def handle_starttag(self, tag: str, attr_list: list[tuple[str, str | None]]) -> None:
        attrs = dict(attr_list)
        if tag == "form":
            self._form = Form(attrs)
            self.forms.append(self._form)
            return
        form = self._form
        if form is None:
            return
        name = attrs.get("name")
        if tag == "input" and name:
            kind = (attrs.get("type") or "text").lower()
            if kind in ("checkbox", "radio") and "checked" not in attrs:
                return
            form.fields.append((name, attrs.get("value") or ""))
        elif tag == "textarea" and name:
            self._textarea, self._text = name, []
        elif tag == "select" and name:
            self._select, self._options = name, []
        elif tag == "option" and self._select is not None:
            self._option = (attrs.get("value"), "selected" in attrs)
            self._text = []
        elif tag == "button" and attrs.get("id"):
            form.buttons[str(attrs["id"])] = attrs.get("formaction")

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag == "textarea" and self._form is not None and self._textarea is not None:
            self._form.fields.append((self._textarea, "".join(self._text)))
            self._textarea = None
        elif tag == "option" and self._option is not None:
            value, selected = self._option
            self._options.append((value if value is not None else "".join(self._text), selected))
            self._option = None
        elif tag == "select" and self._form is not None and self._select is not None:
            chosen = [v for v, selected in self._options if selected] or [
                v for v, _ in self._options[:1]
            ]
            self._form.fields.extend((self._select, v) for v in chosen)
            self._select = None


def form_of(page: str, button: str) -> Form:
    """The form of ``page`` with the button whose id is ``button``."""
    parser = _Forms()
    parser.feed(page)
    found = [f for f in parser.forms if button in f.buttons]
    assert len(found) == 1, f"no single form with button #{button} on the page"
    return found[0]


def submit(client: TestClient, page: str, button: str, **typed: str | list[str]) -> Any:
    """Click ``button`` of ``page`` after typing ``typed`` into its form: the response,
    not followed."""
    form = form_of(page, button)
    assert form.method == "post" and any(k == "csrf_token" and v for k, v in form.fields)
    fields: dict[str, list[str]] = {}
    for key, value in form.fields:
        fields.setdefault(key, []).append(value)
    for key, typed_value in typed.items():
        fields[key] = typed_value if isinstance(typed_value, list) else [typed_value]
    action = form.buttons[button] or form.action
    return client.post(action, data=fields, follow_redirects=False)


def confirmed(client: TestClient, page: str, button: str, **typed: str | list[str]) -> Any:
    """``submit``, then the confirmation page's own form: the response, not followed."""
    asked = submit(client, page, button, **typed)
    assert asked.status_code == 200 and 'id="confirm"' in asked.text, asked.text[:500]
    return submit(client, asked.text, "confirm")


def flash_after(client: TestClient, response: Any) -> str:
    """The flash message of the page a redirect leads to."""
    assert response.status_code == 303, response.text[:500]
    page = client.get(response.headers["location"]).text
    start = page.index('<div class="flash">') + len('<div class="flash">')
    return html.unescape(page[start : page.index("</div>", start)])


def seeded(engine: Engine, schema: str, retry_limit: int = 1) -> list[uuid.UUID]:
    """Queues ``mail`` and ``mail_dlq``; three jobs sent to ``mail`` (their ids)."""

    def work(q: QueueService) -> list[uuid.UUID]:
        q.create_queue("mail_dlq")
        q.create_queue("mail", retry_limit=retry_limit)
        return [j for j in (q.send("mail", {"n": n}) for n in range(3)) if j is not None]

    return tx(engine, schema, work)


def states(engine: Engine, schema: str, name: str = "mail") -> dict[uuid.UUID, str]:
    with engine.connect() as conn:
        found = conn.execute(
            text(f'SELECT id, state::text FROM "{schema}".job WHERE name = :n'), {"n": name}
        ).all()
    return {row[0]: row[1] for row in found}


# ------------------------------------------------------------------ queues


def test_the_create_queue_form_creates_the_queue_with_its_options(engine: Engine, at: str) -> None:
    seeded(engine, at)
    client = browser(engine, at)
    page = client.get(f"/s/{at}/queues/mail").text
    done = submit(
        client,
        page,
        "create",
        name="reports",
        policy="stately",
        retry_limit="4",
        dead_letter="mail_dlq",
    )
    assert done.headers["location"] == f"/s/{at}/queues/reports"
    assert flash_after(client, done) == "created queue reports"
    info = tx(engine, at, lambda q: q.get_queue("reports"))
    assert info is not None
    assert (info.policy, info.retry_limit, info.dead_letter) == ("stately", 4, "mail_dlq")


def test_the_update_queue_form_changes_what_was_typed_and_keeps_the_rest(
    engine: Engine, at: str
) -> None:
    seeded(engine, at)
    client = browser(engine, at)
    before = tx(engine, at, lambda q: q.get_queue("mail"))
    assert before is not None
    page = client.get(f"/s/{at}/queues/mail").text
    done = submit(
        client, page, "save-queue", retry_limit="6", warning_queued="50", dead_letter="mail_dlq"
    )
    assert done.headers["location"] == f"/s/{at}/queues/mail"
    assert flash_after(client, done) == "updated queue mail"
    after = tx(engine, at, lambda q: q.get_queue("mail"))
    assert after is not None
    assert (after.retry_limit, after.warning_queued, after.dead_letter) == (6, 50, "mail_dlq")
    # The fields the form showed and nobody touched are written back as they were.
    for kept in (
        "policy",
        "retry_delay",
        "expire_seconds",
        "retention_seconds",
        "deletion_seconds",
    ):
        assert getattr(after, kept) == getattr(before, kept), kept

    # The form posted again unchanged, as the page now shows it: nothing moves.
    page = client.get(f"/s/{at}/queues/mail").text
    assert submit(client, page, "save-queue").status_code == 303
    again = tx(engine, at, lambda q: q.get_queue("mail"))
    assert again is not None
    assert (again.retry_limit, again.warning_queued, again.dead_letter) == (6, 50, "mail_dlq")


# ------------------------------------------------------------------ sending


def test_the_send_form_sends_the_job_with_its_data_and_key(engine: Engine, at: str) -> None:
    seeded(engine, at)
    client = browser(engine, at)
    page = client.get(f"/s/{at}/queues/mail").text
    assert form_of(page, "send").fields.count(("data", "{}")) == 1  # the page's default
    done = submit(client, page, "send", data='{"to": "ada", "tags": [1, 2]}', singleton_key="k1")
    location = done.headers["location"]
    assert location.startswith(f"/s/{at}/jobs/") and location.endswith("?queue=mail")
    job_id = uuid.UUID(location.split("/jobs/")[1].split("?")[0])
    assert flash_after(client, done) == f"sent job {job_id}"
    job = tx(engine, at, lambda q: q.get_job("mail", job_id))
    assert job is not None
    assert (job.data, job.singleton_key, str(job.state)) == (
        {"to": "ada", "tags": [1, 2]},
        "k1",
        "created",
    )

    # Empty data is a job without data.
    empty = submit(client, page, "send", data="")
    empty_id = uuid.UUID(empty.headers["location"].split("/jobs/")[1].split("?")[0])
    blank = tx(engine, at, lambda q: q.get_job("mail", empty_id))
    assert blank is not None and blank.data is None


def test_the_send_form_says_when_the_queue_policy_takes_no_job(engine: Engine, at: str) -> None:
    tx(engine, at, lambda q: q.create_queue("one", policy="short"))
    client = browser(engine, at)
    page = client.get(f"/s/{at}/queues/one").text
    first = submit(client, page, "send", data='{"n": 1}', singleton_key="k")
    assert first.headers["location"].startswith(f"/s/{at}/jobs/")
    # A second queued job of the same key: the short policy keeps one.
    second = submit(client, page, "send", data='{"n": 2}', singleton_key="k")
    assert second.headers["location"] == f"/s/{at}/queues/one"
    assert flash_after(client, second) == "the queue's policy did not accept the job"
    assert len(states(engine, at, "one")) == 1


# ------------------------------------------------------------------ job actions


def test_resume_from_a_job_page_puts_the_job_back_in_its_queue(engine: Engine, at: str) -> None:
    job_id, other, _ = seeded(engine, at)
    tx(engine, at, lambda q: q.cancel("mail", [job_id, other]))
    client = browser(engine, at)
    page = client.get(f"/s/{at}/jobs/{job_id}?queue=mail").text
    done = confirmed(client, page, "action-resume")
    assert done.headers["location"] == f"/s/{at}/jobs/{job_id}?queue=mail"
    assert flash_after(client, done) == "resumed 1 job(s)"
    now = states(engine, at)
    assert (now[job_id], now[other]) == ("created", "cancelled")


def test_delete_from_a_job_page_deletes_that_job_only(engine: Engine, at: str) -> None:
    job_id, *kept = seeded(engine, at)
    client = browser(engine, at)
    page = client.get(f"/s/{at}/jobs/{job_id}?queue=mail").text
    done = confirmed(client, page, "action-delete")
    assert done.headers["location"] == f"/s/{at}/jobs?queue=mail"
    assert flash_after(client, done) == "deleted 1 job(s)"
    assert sorted(states(engine, at)) == sorted(kept)


def test_bulk_resume_and_delete_from_the_job_list(engine: Engine, at: str) -> None:
    first, second, third = seeded(engine, at)
    tx(engine, at, lambda q: q.cancel("mail", [first, second, third]))
    client = browser(engine, at)
    listing = client.get(f"/s/{at}/jobs?queue=mail").text
    chosen = [str(first), str(second)]
    done = confirmed(client, listing, "bulk-resume", ids=chosen)
    assert flash_after(client, done) == "resumed 2 job(s)"
    assert states(engine, at) == {first: "created", second: "created", third: "cancelled"}

    listing = client.get(f"/s/{at}/jobs?queue=mail").text
    done = confirmed(client, listing, "bulk-delete", ids=[str(third)])
    assert flash_after(client, done) == "deleted 1 job(s)"
    assert states(engine, at) == {first: "created", second: "created"}


# ------------------------------------------------------------------ queue-wide actions


def test_queue_wide_cancel_then_resume(engine: Engine, at: str) -> None:
    ids = seeded(engine, at)
    tx(engine, at, lambda q: q.create_queue("other"))
    [untouched] = tx(engine, at, lambda q: [q.send("other", {"n": 9})])
    client = browser(engine, at)
    page = client.get(f"/s/{at}/queues/mail").text
    done = confirmed(client, page, "queue-cancel-queued")
    assert done.headers["location"] == f"/s/{at}/queues/mail"
    assert flash_after(client, done) == "cancelled 3 job(s)"
    assert states(engine, at) == dict.fromkeys(ids, "cancelled")
    page = client.get(f"/s/{at}/queues/mail").text
    done = confirmed(client, page, "queue-resume-cancelled")
    assert flash_after(client, done) == "resumed 3 job(s)"
    assert states(engine, at) == dict.fromkeys(ids, "created")
    assert states(engine, at, "other") == {untouched: "created"}


def test_queue_wide_retry_and_delete_by_state(engine: Engine, at: str) -> None:
    kept, *failing = seeded(engine, at, retry_limit=0)
    tx(engine, at, lambda q: q.fetch("mail", 3))
    tx(engine, at, lambda q: q.fail("mail", failing, {"e": 1}))
    tx(engine, at, lambda q: q.complete("mail", kept))
    client = browser(engine, at)
    page = client.get(f"/s/{at}/queues/mail").text
    done = confirmed(client, page, "queue-retry-failed")
    assert flash_after(client, done) == "retried 2 job(s)"
    assert states(engine, at) == {kept: "completed", **dict.fromkeys(failing, "retry")}

    page = client.get(f"/s/{at}/queues/mail").text
    done = confirmed(client, page, "queue-delete-state", state="completed")
    assert flash_after(client, done) == "deleted 1 job(s)"
    assert states(engine, at) == dict.fromkeys(failing, "retry")


def test_redrive_to_a_queue_named_in_the_form(engine: Engine, at: str) -> None:
    def dead(q: QueueService) -> uuid.UUID:
        q.create_queue("dlq")
        q.create_queue("src", retry_limit=0, dead_letter="dlq")
        q.create_queue("fixed")
        job_id = q.send("src", {"order": 7})
        assert job_id is not None
        return job_id

    job_id = tx(engine, at, dead)
    tx(engine, at, lambda q: q.fetch("src"))
    tx(engine, at, lambda q: q.fail("src", job_id, {"e": 1}))
    assert len(states(engine, at, "dlq")) == 1
    client = browser(engine, at)
    page = client.get(f"/s/{at}/queues/dlq").text
    done = confirmed(client, page, "queue-redrive", to="fixed")
    assert done.headers["location"] == f"/s/{at}/queues/dlq"
    assert flash_after(client, done) == "redrove 1 job(s) out of dlq"
    [moved] = tx(engine, at, lambda q: q.find_jobs("fixed").jobs)
    assert (moved.data, str(moved.state)) == ({"order": 7}, "created")
