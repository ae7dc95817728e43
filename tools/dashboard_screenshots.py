"""Regenerate the dashboard screenshots of the docs: ``docs/img/dashboard-overview.png``,
``dashboard-queue.png``, ``dashboard-job.png``, ``dashboard-health.png``,
``dashboard-attempts.png`` and ``dashboard-schedules.png`` (1280x800).

It fills a fresh schema with demo data (a few queues, jobs in every state, some failed with
their errors), serves the dashboard on a free loopback port and photographs six pages with a
headless Chromium (Selenium; the ``test`` and ``dashboard`` extras, and Chromium with its
chromedriver)::

    python tools/dashboard_screenshots.py                          # an embedded PostgreSQL
    python tools/dashboard_screenshots.py --database-url postgresql://localhost/scratch

The schema (``pgboss`` unless ``--schema`` says otherwise) must not exist yet: it is created
for the pictures and dropped afterwards, so the tool never shows or touches real data.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, migrate

ROOT = Path(__file__).resolve().parent.parent
WIDTH, HEIGHT = 1280, 800
T = TypeVar("T")


# What a worker stores for a handler that raised (alkstore_sa.options.error_output): the
# traceback of a demo shop's webhook handler, under a worker's own frames.
STACK = """Traceback (most recent call last):
  File "/srv/shop/.venv/lib/python3.12/site-packages/alkstore_sa/worker/_run.py", line 91, in run
    result = handler(job)
             ^^^^^^^^^^^^
  File "/srv/shop/.venv/lib/python3.12/site-packages/alkstore_sa/worker/_pool.py", line 40, in call
    return fn(job)
           ^^^^^^^
  File "/srv/shop/shop/webhooks.py", line 58, in deliver
    response.raise_for_status()
  File "/srv/shop/shop/http.py", line 21, in raise_for_status
    raise DeliveryError(f"{self.reason} from {self.host}")
shop.http.DeliveryError: {error}
"""


def raised(queue: str, error: str) -> dict[str, str]:
    """The output a worker writes when a handler of ``queue`` raised ``error``."""
    return {"name": "DeliveryError", "message": error, "stack": STACK.replace("{error}", error)}


def spread_attempts(engine: Engine, schema: str) -> None:
    """Space the recorded attempts as a worker's retries would (each took a few seconds,
    minutes apart) and say which worker ran them: the seed fails them all at once."""
    with engine.begin() as conn:
        conn.execute(
            text(
                f'UPDATE "{schema}".alkstore_job_attempt a SET'
                " failed_on = a.failed_on - make_interval(mins => 7 * (3 - a.attempt)),"
                " started_on = a.failed_on - make_interval(mins => 7 * (3 - a.attempt))"
                " - make_interval(secs => 3 + a.attempt * 4),"
                " worker = 'webhooks@web-' || (1 + a.attempt % 2) || :pid"
            ),
            {"pid": ":4121"},
        )


def tx(engine: Engine, schema: str, fn: Callable[[QueueService], T]) -> T:
    with Session(engine) as session, session.begin():
        return fn(QueueService(session, schema=schema))


def seed(engine: Engine, schema: str) -> str:
    """Demo data; returns the id of the failed job the job page shows."""

    def queues(q: QueueService) -> None:
        q.create_queue("webhooks-dlq")
        q.create_queue("webhooks", retry_limit=2, dead_letter="webhooks-dlq")
        q.create_queue("emails", retry_limit=3, retry_backoff=True)
        q.create_queue("invoices", policy="singleton")
        q.create_queue("thumbnails", retry_limit=1)

    tx(engine, schema, queues)
    # A pass makes today's and tomorrow's day partitions of queue_stats, and yesterday's
    # is made here (a pass's clock may not be that far off): the history below goes into
    # them (the queues are empty yet: the pass's own rows count nothing).
    tx(engine, schema, lambda q: q.supervise(force=True, persist_queue_stats=True))
    day = (dt.datetime.now(dt.UTC) - dt.timedelta(days=1)).date()
    with engine.begin() as conn:
        conn.execute(
            text(
                f'CREATE TABLE IF NOT EXISTS "{schema}".queue_stats_{day:%Y%m%d} PARTITION OF '
                f"\"{schema}\".queue_stats FOR VALUES FROM ('{day} 00:00:00+00') "
                f"TO ('{day + dt.timedelta(days=1)} 00:00:00+00')"
            )
        )

    def fail_to_the_end(queue: str, data: Any, error: str, attempts: int) -> str:
        """Send a job and fail every attempt until it is ``failed``."""
        job_id = tx(engine, schema, lambda q: q.send(queue, data, priority=10))
        for attempt in range(attempts):

            def one_attempt(q: QueueService, attempt: int = attempt) -> None:
                (job,) = q.fetch(queue, ignore_start_after=True)
                assert str(job.id) == str(job_id)
                q.fail(queue, job, raised(queue, error))

            tx(engine, schema, one_attempt)
        return str(job_id)

    shown = fail_to_the_end(
        "webhooks",
        {"url": "https://hooks.example.com/orders", "event": "order.paid", "order": 10432},
        "HTTP 502 Bad Gateway from hooks.example.com",
        3,
    )
    fail_to_the_end(
        "webhooks",
        {"url": "https://hooks.example.com/orders", "event": "order.refunded", "order": 10377},
        "timed out after 30 s",
        3,
    )
    fail_to_the_end("thumbnails", {"image": "uploads/2026/12/cat.heic"}, "unsupported format", 2)

    def traffic(q: QueueService) -> None:
        for n in range(12):
            q.send("emails", {"template": "receipt", "order": 10400 + n})
        for n in range(3):
            q.send("invoices", {"customer": 812 + n}, singleton_key=f"customer-{812 + n}")
        for n in range(7):
            q.send("thumbnails", {"image": f"uploads/2026/12/photo-{n:03d}.jpg"})
        q.send("webhooks", {"url": "https://hooks.example.com/orders", "event": "order.paid"})
        q.schedule(
            "invoices", "0 6 * * 1-5", {"run": "daily"}, key="weekday-run", tz="Europe/Paris"
        )
        q.schedule("emails", "*/15 * * * *", {"digest": True}, key="digest")

    tx(engine, schema, traffic)

    def work(q: QueueService) -> None:
        for job in q.fetch("emails", 6):
            q.complete("emails", job, {"message_id": f"<{job.id}@mail.example.com>"})
        for job in q.fetch("thumbnails", 4):
            q.complete("thumbnails", job, {"bytes": 18_342})
        q.fetch("emails", 2)  # left active: workers are on them
        q.fetch("invoices", 1)

    tx(engine, schema, work)
    tx(engine, schema, lambda q: q.supervise(force=True))
    spread_attempts(engine, schema)
    record_history(engine, schema)
    return shown


def record_history(engine: Engine, schema: str) -> None:
    """A day of hourly queue-stats rows (what a supervisor persisting queue stats writes),
    so the overview's "completed, last 24 h" column has something to draw."""
    insert = text(
        f'INSERT INTO "{schema}".queue_stats (name, captured_on, queued_count, deferred_count,'
        " total_count, completed_delta, delta_on)"
        " VALUES (:name, now() - make_interval(hours => :h), :queued, 0, :total, :done,"
        " now() - make_interval(hours => :h))"
    )
    # Completions per hour: a day curve for emails, a steady trickle for thumbnails,
    # webhooks going quiet in the last hours (their endpoint is down).
    shapes: dict[str, Callable[[int], int]] = {
        "emails": lambda h: 40 + int(30 * abs(12 - h) / 12) + (h * 7) % 11,
        "thumbnails": lambda h: 8 + (h * 5) % 6,
        "webhooks": lambda h: 0 if h < 3 else 15 + (h * 3) % 7,
        "invoices": lambda h: 2 if h % 6 == 0 else 0,
    }
    with engine.begin() as conn:
        for name, shape in shapes.items():
            for h in range(23, -1, -1):
                done = shape(h)
                conn.execute(insert, {"name": name, "h": h, "queued": 3, "total": 9, "done": done})


def serve(app: Any) -> tuple[str, Callable[[], None]]:
    """Run ``app`` under uvicorn in a thread on a free loopback port; (base URL, stop)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the dashboard's server did not start")
        time.sleep(0.02)

    def stop() -> None:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()

    return f"http://127.0.0.1:{sock.getsockname()[1]}", stop


def photograph(base: str, pages: dict[str, str], out: Path) -> None:
    """Save a WIDTHxHEIGHT screenshot of each ``{file name: path}`` into ``out``."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    chromedriver = shutil.which("chromedriver")
    if chromium is None or chromedriver is None:
        sys.exit("Chromium and chromedriver are needed (apt: chromium chromium-driver)")
    options = Options()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    try:
        metrics = {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        for name, path in pages.items():
            driver.get(base + path)
            driver.save_screenshot(str(out / name))
            print(f"wrote {out / name}")
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", help="a scratch database (default: embedded)")
    parser.add_argument("--schema", default="pgboss", help="created and dropped (default pgboss)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)

    from alkstore_sa.dashboard import create_app

    with contextlib.ExitStack() as stack:
        url = args.database_url
        if url is None:
            from alkstore_sa._embedded import embedded_postgres

            url = stack.enter_context(embedded_postgres("alkstore-screenshots-"))
        engine = create_engine(migrate.normalise_url(url))
        stack.callback(engine.dispose)
        if args.schema in inspect(engine).get_schema_names():
            sys.exit(f"schema {args.schema!r} exists: give --schema a name that does not")
        migrate.upgrade(engine, args.schema, schema_version=46)

        def drop() -> None:
            with engine.begin() as conn:
                conn.execute(text(f'DROP SCHEMA IF EXISTS "{args.schema}" CASCADE'))

        stack.callback(drop)
        job_id = seed(engine, args.schema)
        base, stop = serve(create_app(engine, schemas=(args.schema,), title="alkstore"))
        stack.callback(stop)
        args.out.mkdir(parents=True, exist_ok=True)
        photograph(
            base,
            {
                "dashboard-overview.png": "/",
                "dashboard-queue.png": f"/s/{args.schema}/queues/webhooks",
                "dashboard-job.png": f"/s/{args.schema}/jobs/{job_id}",
                "dashboard-health.png": f"/s/{args.schema}/health",
                "dashboard-attempts.png": f"/s/{args.schema}/jobs/{job_id}#attempts",
                "dashboard-schedules.png": f"/s/{args.schema}/schedules",
            },
            args.out,
        )


if __name__ == "__main__":
    main()
