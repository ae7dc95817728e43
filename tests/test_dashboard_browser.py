"""The dashboard in a real browser.

The app of ``alkstore_sa.dashboard.create_app`` is served by uvicorn on a free loopback port
(one server per test, over that test's fresh schema at 46) and driven by a headless Chromium
through Selenium (one browser per module). Without Chromium, its WebDriver, Selenium or the
dashboard's dependencies these tests skip locally, and FAIL under CI (``CI`` set), so a CI run
cannot pass by not running them. Every page visited is saved as a PNG into the directory
``ALKSTORE_ARTIFACTS_DIR`` names (default ``test-artifacts/`` at the repository root).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from support.skips import unavailable

from alkstore_sa import QueueService

pytestmark = pytest.mark.browser

if TYPE_CHECKING:
    import uvicorn
    from selenium.webdriver.remote.webdriver import WebDriver
    from selenium.webdriver.remote.webelement import WebElement

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# What a page may run when its escaping is wrong: each sets window.__pwned.
HOSTILE = {
    "script": "<script>window.__pwned=1</script>",
    "attribute": '"><img src=x onerror="window.__pwned=1">',
    "link": "javascript:window.__pwned=1",
}


def artifacts_dir() -> Path:
    path = Path(os.environ.get("ALKSTORE_ARTIFACTS_DIR") or ROOT / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def driver() -> Iterator[WebDriver]:
    """One headless Chromium for the module."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        unavailable("Chromium and chromedriver are not installed (apt: chromium chromium-driver)")
    if importlib.util.find_spec("selenium") is None:
        unavailable("selenium is not installed (it is in the test extra)")
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(chromium)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    browser = webdriver.Chrome(options=options, service=Service(str(chromedriver)))
    metrics = {"width": 1280, "height": 800, "deviceScaleFactor": 1, "mobile": False}
    browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    browser.set_page_load_timeout(30)
    yield browser
    browser.quit()


class LiveServer:
    """The dashboard under uvicorn in a background thread, on a free loopback port."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.sock = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", access_log=False)
        self.server: uvicorn.Server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self.thread.start()
        deadline = time.monotonic() + 15
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard's uvicorn server did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


class Dashboard:
    """One test's dashboard: its schema, its live server, the browser, and seeding helpers."""

    def __init__(
        self, engine: Engine, schema: str, server: LiveServer, driver: WebDriver, test: str
    ) -> None:
        self.engine = engine
        self.schema = schema
        self.server = server
        self.driver = driver
        self.test = re.sub(r"[^A-Za-z0-9_.-]+", "_", test)
        self.shots = 0

    # -- data, written through the service in committed transactions

    def tx(self, fn: Callable[[QueueService], T]) -> T:
        with Session(self.engine) as session, session.begin():
            return fn(QueueService(session, schema=self.schema))

    def send(self, queue: str, data: Any = None, **options: Any) -> uuid.UUID:
        job_id = self.tx(lambda q: q.send(queue, data, **options))
        assert job_id is not None
        return job_id

    def failed(self, queue: str, data: Any = None, output: Any = None) -> uuid.UUID:
        """A job of ``queue`` (a queue without retries), failed with ``output``."""
        job_id = self.send(queue, data)
        self.tx(lambda q: q.fail(queue, job_id, output))
        assert self.state(queue, job_id) == "failed"
        return job_id

    def state(self, queue: str, job_id: uuid.UUID) -> str:
        job = self.tx(lambda q: q.get_job(queue, job_id))
        assert job is not None
        return str(job.state)

    # -- the browser

    def url(self, path: str) -> str:
        return self.server.url + path

    def spath(self, rest: str) -> str:
        return f"/s/{quote(self.schema)}{rest}"

    def visit(self, path: str, label: str) -> None:
        self.driver.get(self.url(path))
        self.shot(label)

    def shot(self, label: str) -> None:
        """Save what the browser shows now as a test artifact."""
        self.shots += 1
        name = f"{self.test}-{self.shots:02d}-{label}.png"
        self.driver.save_screenshot(str(artifacts_dir() / name))

    def one(self, css: str) -> WebElement:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def all(self, css: str) -> list[WebElement]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def leave_page(self, act: Callable[[], object]) -> None:
        """Run ``act`` (a click or a submit) and wait until the next page replaced this one."""
        from selenium.webdriver.support import expected_conditions as ec
        from selenium.webdriver.support.ui import WebDriverWait

        page = self.one("html")
        act()
        WebDriverWait(self.driver, 10).until(ec.staleness_of(page))

    def pwned(self) -> Any:
        return self.driver.execute_script("return window.__pwned")


@pytest.fixture
def dash(
    request: pytest.FixtureRequest, engine: Engine, schema46: str, driver: WebDriver
) -> Iterator[Dashboard]:
    """The dashboard over a fresh schema at 46, served and open in the browser."""
    for module in ("uvicorn", "starlette"):
        if importlib.util.find_spec(module) is None:
            unavailable(f"{module} is not installed (the dashboard needs it)")
    from alkstore_sa.dashboard import create_app

    # No reloading unless a test asks for it: a reload between two steps of a test would
    # leave it holding elements of the page before.
    refresh = request.node.get_closest_marker("refresh")
    app = create_app(
        engine,
        schemas=(schema46,),
        title="alkstore browser test",
        refresh_seconds=refresh.args[0] if refresh is not None else 0,
    )
    server = LiveServer(app)
    # Cookies are per host, not per port: start every test without the previous one's.
    driver.get(server.url + "/healthz")
    driver.delete_all_cookies()
    try:
        yield Dashboard(engine, schema46, server, driver, request.node.name)
    finally:
        server.stop()


@pytest.mark.smoke
def test_overview_shows_each_queue_and_its_counts(dash: Dashboard) -> None:
    dash.tx(lambda q: q.create_queue("emails", retry_limit=0))
    dash.tx(lambda q: q.create_queue("reports"))
    for n in range(3):
        dash.send("emails", {"n": n})
    dash.failed("emails", {"n": 3}, {"error": "smtp down"})
    dash.send("reports", {"day": "2026-12-01"})

    dash.visit("/", "overview")

    table = dash.one(f'table.queues[data-schema="{dash.schema}"]')
    assert table.is_displayed()
    emails = dash.one(f'table.queues[data-schema="{dash.schema}"] tr[data-queue="emails"]')
    reports = dash.one(f'table.queues[data-schema="{dash.schema}"] tr[data-queue="reports"]')
    assert emails.find_element("css selector", "td.count-created").text.strip() == "3"
    assert emails.find_element("css selector", "td.count-failed").text.strip() == "1"
    assert reports.find_element("css selector", "td.count-created").text.strip() == "1"
    assert reports.find_element("css selector", "td.count-failed").text.strip() in ("0", "")
    # The queue with a failed job comes first, and its name leads to the queue's page.
    rows = [r.get_attribute("data-queue") for r in table.find_elements("css selector", "tr")]
    assert [r for r in rows if r] == ["emails", "reports"]
    dash.leave_page(emails.find_element("link text", "emails").click)
    dash.shot("queue")
    assert dash.one("#queue-options").is_displayed()
    assert dash.driver.current_url.endswith(dash.spath("/queues/emails"))


def test_job_list_pages_and_filters_by_state(dash: Dashboard) -> None:
    from selenium.webdriver.support.ui import Select

    dash.tx(lambda q: q.create_queue("emails", retry_limit=0))
    sent = dash.tx(lambda q: q.send_many("emails", [{"data": {"n": n}} for n in range(53)]))
    failed = {dash.failed("emails", {"n": n}, {"error": "boom"}) for n in range(2)}
    every = {str(i) for i in [*sent, *failed]}
    assert len(every) == 55

    # A page of 50 (the dashboard's page size), then the rest behind the next-page link.
    dash.visit(dash.spath("/jobs?queue=emails"), "jobs-page-1")
    first = [r.get_attribute("data-job-id") for r in dash.all("#jobs tr[data-job-id]")]
    dash.leave_page(dash.one("a#next-page").click)
    dash.shot("jobs-page-2")
    second = [r.get_attribute("data-job-id") for r in dash.all("#jobs tr[data-job-id]")]
    assert (len(first), len(second)) == (50, 5)
    assert set(first) | set(second) == every
    assert dash.all("a#next-page") == []

    form = dash.one("form#job-filters")
    Select(form.find_element("css selector", 'select[name="state"]')).select_by_value("failed")
    dash.leave_page(form.submit)
    dash.shot("failed-jobs")

    assert "state=failed" in dash.driver.current_url
    rows = dash.all("#jobs tr[data-job-id]")
    assert {r.get_attribute("data-job-id") for r in rows} == {str(i) for i in failed}
    assert {r.get_attribute("data-state") for r in rows} == {"failed"}
    assert {r.find_element("css selector", "td.state").text.strip() for r in rows} == {"failed"}


def test_retry_a_failed_job_from_its_page_after_confirming(dash: Dashboard) -> None:
    dash.tx(lambda q: q.create_queue("emails", retry_limit=0))
    job_id = dash.failed("emails", {"to": "ada@example.com"}, {"error": "smtp down"})

    dash.visit(dash.spath(f"/jobs/{job_id}"), "failed-job")
    assert dash.one("#job-state").text.strip() == "failed"
    assert "smtp down" in dash.one("#job-output").text

    dash.leave_page(dash.one("#action-retry").click)
    confirm = dash.one("#confirm")
    dash.shot("confirm-retry")
    assert dash.state("emails", job_id) == "failed", "nothing may change before confirming"
    dash.leave_page(confirm.click)
    dash.one(".flash")
    dash.shot("retried-job")

    assert dash.driver.current_url.split("?")[0].endswith(dash.spath(f"/jobs/{job_id}"))
    assert dash.one("#job-state").text.strip() in ("retry", "created")
    assert dash.state("emails", job_id) in ("retry", "created")


def test_hostile_job_content_is_shown_as_text_and_never_run(dash: Dashboard) -> None:
    dash.tx(lambda q: q.create_queue("emails", retry_limit=0))
    job_id = dash.failed(
        "emails",
        {**HOSTILE, "url": HOSTILE["link"]},
        {"error": HOSTILE["script"], "href": HOSTILE["link"]},
    )

    dash.visit(dash.spath(f"/jobs/{job_id}"), "hostile-job")
    shown = dash.one("#job-data").text
    assert HOSTILE["script"] in shown
    assert "<img src=x onerror=" in shown
    assert HOSTILE["link"] in shown
    assert HOSTILE["script"] in dash.one("#job-output").text
    # Text, not markup: nothing was parsed into elements, nothing ran, nothing links out.
    assert dash.all("#job-data *, #job-output *") == []
    assert dash.all('img[src="x"], a[href^="javascript:"]') == []
    assert dash.pwned() is None

    for path, label in (
        (dash.spath("/jobs?queue=emails"), "hostile-list"),
        (dash.spath("/jobs?q=" + quote(HOSTILE["attribute"])), "hostile-search"),
        ("/", "hostile-overview"),
    ):
        dash.visit(path, label)
        assert dash.all('img[src="x"], a[href^="javascript:"]') == []
        assert dash.pwned() is None


def test_a_post_without_the_csrf_token_is_refused(dash: Dashboard) -> None:
    dash.tx(lambda q: q.create_queue("emails", retry_limit=0))
    job_id = dash.failed("emails", {"to": "ada@example.com"})
    dash.visit(dash.spath(f"/jobs/{job_id}"), "job")
    action = dash.url(dash.spath("/actions/retry"))
    token = dash.one('input[type="hidden"][name="csrf_token"]').get_attribute("value")
    assert token

    def post(fields: dict[str, str]) -> int:
        """POST the form fields from the page, with its cookies; the response's status."""
        status = dash.driver.execute_async_script(
            """
            const [url, fields, done] = arguments;
            fetch(url, {method: "POST", body: new URLSearchParams(fields),
                        credentials: "same-origin", redirect: "manual"})
              .then(r => done(r.type === "opaqueredirect" ? 303 : r.status),
                    e => done(String(e)));
            """,
            action,
            fields,
        )
        assert isinstance(status, int), status
        return status

    fields = {"ids": str(job_id), "confirm": "yes", "next": dash.spath(f"/jobs/{job_id}")}
    assert post(fields) == 403
    assert post({**fields, "csrf_token": "forged-" + token}) == 403
    assert dash.state("emails", job_id) == "failed"
    # The same request with the page's token is the one that goes through.
    assert post({**fields, "csrf_token": token}) == 303
    assert dash.state("emails", job_id) in ("retry", "created")

    dash.visit(dash.spath(f"/jobs/{job_id}"), "after-posts")
    assert json.loads(dash.one("#job-data").text) == {"to": "ada@example.com"}


@pytest.mark.refresh(1)
def test_the_overview_reloads_itself_until_paused_and_follows_a_dark_system(
    dash: Dashboard,
) -> None:
    from selenium.common.exceptions import TimeoutException
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    dash.tx(lambda q: q.create_queue("emails"))
    dash.visit("/", "live")
    assert dash.one("#live").text.startswith("refreshes every 1 s")
    # It reloads by itself: the page shown is replaced without a click.
    WebDriverWait(dash.driver, 5).until(ec.staleness_of(dash.one("html")))
    dash.leave_page(dash.one("#live-pause").click)
    dash.shot("paused")
    assert dash.one("#live-resume").is_displayed()
    page = dash.one("html")
    with pytest.raises(TimeoutException):
        WebDriverWait(dash.driver, 2.5).until(ec.staleness_of(page))

    # The system's dark setting gives the dark theme (Chromium told so through DevTools).
    def background() -> str:
        return str(
            dash.driver.execute_script("return getComputedStyle(document.body).backgroundColor")
        )

    light = background()
    dash.driver.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": "dark"}]},
    )
    dark = background()
    dash.shot("dark")
    assert light == "rgb(246, 247, 249)" and dark == "rgb(20, 23, 28)"


def test_every_page_renders_on_a_seeded_database(dash: Dashboard) -> None:
    """A few thousand jobs over several queues, failures, a flow, a schedule and history:
    each page answers, shows its heading and no error, and is photographed."""
    names = ("emails", "reports", "webhooks", "thumbnails")

    def seed(q: QueueService) -> None:
        for name in names:
            q.create_queue(name, retry_limit=0)
            q.send_many(name, [{"data": {"n": n}} for n in range(600)])

    dash.tx(seed)
    failed = dash.failed("webhooks", {"url": "https://hooks.example.com"}, {"error": "503"})
    dash.tx(
        lambda q: q.flow(
            [
                {"ref": "a", "name": "reports", "data": {"step": "a"}},
                {"ref": "b", "name": "emails", "data": {"step": "b"}, "depends_on": ["a"]},
            ]
        )
    )
    dash.tx(lambda q: q.schedule("reports", "0 * * * *", {"hourly": True}))
    dash.tx(lambda q: q.supervise(force=True, persist_queue_stats=True))
    pages = {
        "overview": "/",
        **{f"queue-{name}": dash.spath(f"/queues/{name}") for name in names},
        "jobs": dash.spath("/jobs?queue=emails"),
        "failed-job": dash.spath(f"/jobs/{failed}?queue=webhooks"),
        "schedules": dash.spath("/schedules"),
        "instances": dash.spath("/instances"),
        "warnings": dash.spath("/warnings"),
        "health": dash.spath("/health"),
    }
    for label, path in pages.items():
        dash.visit(path, label)
        assert dash.one("h1").text.strip(), label
        assert not dash.all("#error-message"), label
        assert "internal error" not in dash.driver.page_source, label
    dash.visit(dash.spath("/queues/emails"), "emails-again")
    assert dash.one('table.recent-jobs[data-state="created"]').is_displayed()
