"""Every Python example in README.md and docs/ runs, so a doc example that breaks fails the tests.

How a page is run (one test per page):

- Its ```` ```python ```` blocks run **in order, in one namespace**, since later blocks build on
  earlier ones. A block that is not meant to run is marked in the markdown by the line
  ``<!-- not-run: why -->`` right before its fence (invisible once rendered); keep those rare.
- The only change made to the text is the **URL rule**: every ``postgresql+psycopg://...``
  literal becomes the URL of a database created for this test (``docs_<random>``, dropped
  after), because the examples use the default schema ``pgboss``.
- Names the reader's application supplies (``order``, ``deliver``, ``mailer``, ``myapp.jobs``,
  an engine...) come from the page's **prelude** in :data:`PAGES`, which also does the setup the
  page describes in prose or in shell (``alkstore db upgrade``: ``migrate.upgrade``).
- Top-level ``await`` is allowed, as in ``python -m asyncio``; all blocks of a page share one
  event loop.
- A block that calls ``worker.run()`` would block until SIGINT/SIGTERM. While each block runs,
  a watcher thread waits until a worker created by the block has fetched jobs and its queues
  hold no due unfinished job, then calls the documented ``stop()`` (from another thread, as
  ``Worker.stop`` allows; ``AsyncWorker.stop`` on the page's loop).
- Blocks that define pytest tests (``docs/how-to/testing.md``) are written, after the page's
  prelude imports, into a test module that an inner ``pytest.main`` runs; every test the page
  defines must pass.
- After the page, its ``check`` asserts what the examples should have done (the job rows, the
  handlers' calls), so an example that runs without error but stores the wrong thing fails.

- A **project page** (``docs/tutorial.md``; ``Page(project=True)``) builds an app in a folder
  of its own (the test's ``tmp_path/project``), as its reader does: a ``python`` block whose
  first line is ``# path/to/file.py`` is that file of the project (written, not run); an
  ``ini`` block's keys are set in the project's ``alembic.ini`` (which ``alembic init`` wrote);
  each ``$ ...`` line of a ``console`` block runs in the project folder (``python`` is this
  interpreter) and must exit 0, except a command in ``Page.background``, which is started and
  left running (as in a terminal of its own) until the next console command or the end of the
  page, then stopped with SIGINT (Ctrl-C) and must exit 0. Its other ``python`` blocks run in
  the page's namespace with the project importable; once a background process runs, each
  such block waits until it has registered its worker and no job due within a minute is
  unfinished (dead-letter queues aside: nobody works them). Every block's text gets the URL
  rule, so the app's and its tests' databases are the page's database.

``docs/how-to/alembic.md`` is not collected here: its blocks belong to an Alembic ``env.py``
and a migration, and ``tests/test_alembic_app.py`` runs them inside a throw-away Alembic project.
"""

from __future__ import annotations

import ast
import asyncio
import configparser
import datetime as dt
import inspect
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool
from support.skips import require_module

from alkstore_sa import AsyncWorker, QueueService, Worker, migrate

ROOT = Path(__file__).resolve().parent.parent

SKIPPED_PAGES = frozenset({"docs/how-to/alembic.md"})
"""Pages whose Python blocks another test runs: alembic.md's, tests/test_alembic_app.py."""

FENCE_OPEN = re.compile(r"^```python\s*$")
FENCE_CLOSE = re.compile(r"^```\s*$")
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(?P<reason>\S.*?)\s*-->\s*$")
URL = re.compile(r"postgresql\+psycopg://[^\s\"'`]+")

WORKER_DEADLINE = 30.0
"""Seconds a block's worker may take before it is stopped anyway (and the check fails)."""


# ---------------------------------------------------------------- collecting the blocks


@dataclass(frozen=True)
class Block:
    """One ```` ```python ```` block of a page."""

    page: str
    line: int  # line of the first line of code, 1-based
    code: str
    not_run: str | None  # the reason given by a not-run marker, if any


def blocks_of(page: str) -> list[Block]:
    """The Python blocks of ``page`` (a path relative to the repository), in order."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        if not FENCE_OPEN.match(lines[i]):
            i += 1
            continue
        marker = NOT_RUN.match(lines[i - 1]) if i > 0 else None
        start = i + 1
        end = start
        while end < len(lines) and not FENCE_CLOSE.match(lines[end]):
            end += 1
        if end == len(lines):
            raise AssertionError(f"{page}:{i + 1}: unclosed ```python block")
        code = "\n".join(lines[start:end]) + "\n"
        found.append(Block(page, start + 1, code, marker["reason"] if marker else None))
        i = end + 1
    return found


def pages_with_examples() -> list[str]:
    """README.md and docs/**/*.md that have Python blocks, except :data:`SKIPPED_PAGES`."""
    candidates = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    pages = [p.relative_to(ROOT).as_posix() for p in candidates]
    return [p for p in pages if p not in SKIPPED_PAGES and blocks_of(p)]


def with_database(code: str, url: str) -> str:
    """The URL rule: every ``postgresql+psycopg://`` literal names the page's database."""
    return URL.sub(url, code)


def compiled(block: Block, url: str) -> types.CodeType:
    # Padding with newlines makes tracebacks point at the markdown's own line numbers.
    source = "\n" * (block.line - 1) + with_database(block.code, url)
    # dont_inherit: a page runs as the reader's module would, without this module's
    # ``from __future__ import annotations`` (a mapped class's annotations stay objects).
    code: types.CodeType = compile(
        source,
        str(ROOT / block.page),
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )
    return code


# ---------------------------------------------------------------- a database per page


@pytest.fixture
def page_url(database_url: str) -> Iterator[str]:
    """A fresh database on the test server for one page; dropped afterwards."""
    name = "docs_" + uuid.uuid4().hex[:12]
    admin = create_engine(database_url, isolation_level="AUTOCOMMIT", poolclass=NullPool)
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            # Anything the examples left connected (a pool, a listener) would block the drop.
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()


@dataclass
class Ctx:
    """What a prelude and a check get: the page's database, and an engine of the harness."""

    url: str
    engine: Engine
    tmp_path: Path
    loop: asyncio.AbstractEventLoop
    notes: dict[str, Any] = field(default_factory=dict)

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.engine.begin() as conn:
            result = conn.execute(text(statement), params)
            return list(result.all()) if result.returns_rows else []

    def jobs(self, queue: str) -> list[Any]:
        return self.sql(
            "SELECT id, state::text AS state, data, output, priority, singleton_key, retry_limit"
            " FROM pgboss.job WHERE name = :q ORDER BY created_on, id",
            q=queue,
        )

    def service(self, fn: Callable[[QueueService], Any]) -> Any:
        with Session(self.engine) as session, session.begin():
            return fn(QueueService(session))


# ---------------------------------------------------------------- the reader's application


class AppBase(DeclarativeBase):
    """Metadata of the stand-in application models, apart from the library's."""


class Order(AppBase):
    __tablename__ = "orders"
    id: Mapped[int] = mapped_column(primary_key=True)  # autoincrement, as in most apps
    item: Mapped[str] = mapped_column(default="")
    shipped: Mapped[bool] = mapped_column(default=False)


class Invoice(AppBase):
    __tablename__ = "invoices"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(default="")
    order_id: Mapped[int | None] = mapped_column(default=None)


class Signup(AppBase):
    __tablename__ = "signups"
    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(default="")


class FakeMailer:
    """A test's fake mailer: records the addresses it sent to, from any thread or loop."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._changed = threading.Condition()

    def _record(self, to: str) -> None:
        with self._changed:
            self.sent.append(to)
            self._changed.notify_all()

    def send(self, to: str, subject: str) -> None:
        self._record(to)

    def wait_for(self, to: str, timeout: float = 20) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: to in self.sent, timeout), self.sent


class AsyncFakeMailer(FakeMailer):
    async def send(self, to: str, subject: str) -> None:  # type: ignore[override]
        self._record(to)


class Recorder:
    """Stands for the app's mailer or HTTP client: records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def send(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))

    async def post(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append((args, kwargs))


def install_schema(ctx: Ctx) -> None:
    """What ``alkstore db upgrade --database-url ...`` does, plus the app's own tables."""
    migrate.upgrade(ctx.engine, "pgboss")
    AppBase.metadata.create_all(ctx.engine)


def finished(ctx: Ctx, queue: str) -> list[Any]:
    return [j for j in ctx.jobs(queue) if j.state == "completed"]


# ---------------------------------------------------------------- the pages


@dataclass
class Page:
    """How to run one page: its prelude, steps between blocks, and what to check after."""

    prelude: Callable[[Ctx], dict[str, Any]]
    check: Callable[[Ctx, dict[str, Any]], None]
    before_block: dict[int, Callable[[Ctx], None]] = field(default_factory=dict)
    pytest_tests: int | None = None  # the page defines this many pytest tests
    cleanup: Callable[[Ctx], None] | None = None  # undoes what the page did to the process
    project: bool = False  # builds a project in a folder (see the module's docstring)
    background: frozenset[str] = frozenset()  # a project's commands that run until stopped


def readme_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    delivered: list[Any] = []
    ctx.notes["delivered"] = delivered
    return {"order": Order(item="book"), "deliver": delivered.append}


def readme_five_minutes_pass(ctx: Ctx) -> None:
    # The README sends with start_after=5 minutes; the worker block runs "later".
    ctx.sql("UPDATE pgboss.job SET start_after = now() WHERE name = 'emails'")


def readme_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [order_id] = [row.id for row in ctx.sql("SELECT id FROM orders")]
    [job] = ctx.jobs("emails")
    assert job.data == {"order": order_id}
    assert job.singleton_key == f"order-{order_id}" and job.priority == 5
    assert job.state == "completed" and job.output == {"sent": True}
    assert ctx.notes["delivered"] == [order_id]


def quickstart_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    ctx.notes["mailer"] = mailer = Recorder()
    return {"Order": Order, "mailer": mailer}


def quickstart_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [order_id] = [row.id for row in ctx.sql("SELECT id FROM orders")]
    [job] = ctx.jobs("emails")
    assert job.data == {"order": order_id}
    assert job.state == "completed" and job.output == {"sent": True}
    assert ctx.notes["mailer"].calls == [((order_id,), {})]
    assert ctx.jobs("emails-dlq") == []


def enqueue_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    ctx.service(lambda jobs: jobs.create_queue("invoices.render"))
    return {
        "engine": create_engine(ctx.url),
        "async_engine": create_async_engine(ctx.url),
        "Invoice": Invoice,
    }


def enqueue_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    invoice_ids = [row.id for row in ctx.sql("SELECT id FROM invoices ORDER BY id")]
    assert len(invoice_ids) == 2
    assert [job.data for job in ctx.jobs("invoices.render")] == [
        {"invoice": i} for i in invoice_ids
    ]


def workers_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)

    def setup(jobs: QueueService) -> None:
        for queue in ("emails", "webhooks", "invoices"):
            jobs.create_queue(queue)
        jobs.send("emails", {"to": "ada@example.com", "subject": "Welcome"})
        jobs.send("webhooks", {"url": "https://example.com/hook", "body": {"event": "paid"}})

    ctx.service(setup)
    ctx.notes["mailer"] = mailer = Recorder()
    ctx.notes["http"] = http = Recorder()
    return {"mailer": mailer, "http": http, "Invoice": Invoice}


def workers_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    from alkstore_sa.testing import drain

    # The worker's job (with its output), and the one the fencing example completed.
    first, second = sorted(finished(ctx, "emails"), key=lambda j: j.output is None)
    assert first.output == {"sent": True}
    assert second.data == {"to": "ada@example.com"} and second.output is None
    assert ctx.notes["mailer"].calls == [((), {"to": "ada@example.com", "subject": "Welcome"})]
    assert len(finished(ctx, "webhooks")) == 1
    assert ctx.notes["http"].calls == [(("https://example.com/hook",), {"json": {"event": "paid"}})]
    # The transactional handler of the last block, run the documented way for tests.
    ctx.service(lambda jobs: jobs.send("invoices", {"order": 7}))
    result = drain(ctx.engine, ns["worker"])
    assert (result.completed, result.failed) == (1, 0)
    assert [row.order_id for row in ctx.sql("SELECT order_id FROM invoices")] == [7]


def supervision_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)

    def send(jobs: QueueService) -> None:
        jobs.create_queue("emails")
        jobs.create_queue("reports", retry_limit=2)
        for n in range(3):
            jobs.send("emails", {"n": n})
        jobs.send("reports", {"month": 5})

    def work(jobs: QueueService) -> None:
        # A transaction of its own: within the sending one, now() has not passed start_after.
        done = jobs.fetch("emails", batch_size=3)
        assert jobs.complete("emails", [job.id for job in done]).count == 3
        assert len(jobs.fetch("reports")) == 1

    ctx.service(send)
    ctx.service(work)
    # The report job's worker crashed an hour ago: its lease has run out.
    ctx.sql("UPDATE pgboss.job SET started_on = now() - interval '1 hour' WHERE name = 'reports'")
    [now] = ctx.sql("SELECT now()")
    warnings: list[Any] = []
    ctx.notes["warnings"] = warnings
    return {"engine": create_engine(ctx.url), "alert": warnings.append, "start": now[0]}


def supervision_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [stored] = ctx.service(lambda jobs: jobs.get_schedules("nightly-report"))
    assert (stored.cron, stored.timezone, stored.data) == (
        "30 2 * * *",
        "Europe/Berlin",
        {"format": "pdf"},
    )
    [report] = ctx.jobs("reports")
    assert report.state == "retry" and report.output == {"value": {"message": "job timed out"}}
    assert ctx.jobs("emails") == []  # deleted by the fake-clock pass
    assert isinstance(ns["clock"].now(), dt.datetime)


def groups_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    ctx.service(lambda jobs: jobs.create_queue("exports"))
    return {}


def groups_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    rows = ctx.sql(
        "SELECT group_id, group_tier, state::text AS state, output FROM pgboss.job"
        " WHERE name = 'exports' ORDER BY group_id, created_on"
    )
    by_group: dict[str, list[Any]] = {}
    for row in rows:
        by_group.setdefault(row.group_id, []).append(row)
    assert [r.state for r in by_group["acme"]] == ["completed"] * 3
    assert {r.group_tier for r in by_group["globex"]} == {"enterprise"}
    assert sorted(r.output["exported"] for r in by_group["globex"]) == [0, 1, 2]
    assert sorted(r.state for r in by_group["initech"]) == ["completed"] * 2 + ["created"] * 3
    assert ns["local"].specs["exports"].local_group_concurrency == 1


def interop_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    ctx.service(lambda jobs: jobs.create_queue("emails"))
    return {"engine": create_engine(ctx.url)}


def interop_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [job] = ctx.jobs("emails")
    assert job.data == {"to": "a@example.com"}
    assert (job.priority, job.retry_limit, job.state) == (5, 3, "created")


def upgrade_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    ctx.service(lambda jobs: jobs.create_queue("emails"))
    return {}


def upgrade_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    from psycopg.errors import DeadlockDetected
    from sqlalchemy.exc import OperationalError

    from alkstore_sa import SchemaVersionChangedError

    [job] = ctx.jobs("emails")
    assert (str(job.id), job.data) == (str(ns["job_id"]), {"to": "a@example.com"})

    # The page's helper runs the whole transaction again after each transient failure,
    # and the failed attempt's send is rolled back with it: one job per success.
    transient = [
        SchemaVersionChangedError("pgboss", 26, 46),
        OperationalError("INSERT ...", {}, DeadlockDetected("deadlock detected")),
    ]
    attempts: list[int] = []

    def flaky(session: Session, jobs: QueueService) -> Any:
        attempts.append(1)
        sent = jobs.send("emails", {"attempt": len(attempts)})
        if transient:
            raise transient.pop(0)
        return sent

    again = ns["in_transaction"](flaky)
    assert len(attempts) == 3
    assert [j.data for j in ctx.jobs("emails")][1:] == [{"attempt": 3}]
    assert str(ctx.jobs("emails")[1].id) == str(again)

    # Anything else is raised at once, and two transient failures in two attempts end it.
    def broken(session: Session, jobs: QueueService) -> Any:
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection"))

    with pytest.raises(OperationalError):
        ns["in_transaction"](broken)

    def always_moved(session: Session, jobs: QueueService) -> Any:
        raise SchemaVersionChangedError("pgboss", 26, 46)

    with pytest.raises(SchemaVersionChangedError):
        ns["in_transaction"](always_moved, attempts=2)


def limits_prelude(ctx: Ctx) -> dict[str, Any]:
    import alkstore_sa.limits

    install_schema(ctx)
    ctx.service(lambda jobs: jobs.create_queue("uploads"))
    ctx.notes["max_payload"] = alkstore_sa.limits.MAX_PAYLOAD_BYTES
    return {}


def limits_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    # A 2 MiB payload, over the default 1 MiB limit, is accepted once the page raised it.
    data = {"blob": "x" * (2 * 1024 * 1024)}
    assert ctx.service(lambda jobs: jobs.send("uploads", data)) is not None


def limits_cleanup(ctx: Ctx) -> None:
    import alkstore_sa.limits

    if "max_payload" in ctx.notes:
        alkstore_sa.limits.MAX_PAYLOAD_BYTES = ctx.notes["max_payload"]


def tracing_prelude(ctx: Ctx) -> dict[str, Any]:
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    install_schema(ctx)
    ctx.notes["provider"] = trace._TRACER_PROVIDER
    rendered: list[Any] = []
    ctx.notes["rendered"] = rendered

    def render(order: int) -> None:
        rendered.append((order, trace.get_current_span().get_span_context()))

    return {"exporter": InMemorySpanExporter(), "render": render}


def tracing_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    ns["provider"].force_flush()
    spans = {s.name: s for s in ns["exporter"].get_finished_spans()}
    checkout, send, process = spans["checkout"], spans["send invoices"], spans["process invoices"]
    assert {s.context.trace_id for s in (send, process)} == {checkout.context.trace_id}
    assert process.parent.span_id == send.context.span_id
    [(order, rendering)] = ctx.notes["rendered"]
    assert order == 42 and spans["render pdf"].context.span_id == rendering.span_id
    assert spans["render pdf"].parent.span_id == process.context.span_id
    [(stored,)] = ctx.sql("SELECT trace_context FROM pgboss.job WHERE name = 'invoices'")
    assert stored == {
        "traceparent": f"00-{send.context.trace_id:032x}-"
        f"{send.context.span_id:016x}-{send.context.trace_flags:02x}"
    }


def tracing_cleanup(ctx: Ctx) -> None:
    # The page set the process's global tracer provider: put back the unset one.
    from opentelemetry import trace
    from opentelemetry.util._once import Once

    trace._TRACER_PROVIDER_SET_ONCE = Once()
    if trace._TRACER_PROVIDER is not ctx.notes.get("provider"):
        trace._TRACER_PROVIDER.shutdown()  # type: ignore[union-attr]
    trace._TRACER_PROVIDER = ctx.notes.get("provider")


def observability_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    return {}


def observability_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [worker] = ctx.sql("SELECT name, stopped_on, workers FROM pgboss.instance")
    assert worker.name == "billing" and worker.stopped_on is not None
    assert [w["queue"] for w in worker.workers] == ["invoices"]
    [warning] = ctx.sql("SELECT type, data FROM pgboss.warning")
    assert warning.type == "queue_backlog" and warning.data["queuedCount"] == 3
    [point] = ns["points"]
    assert point.queued_count == 3 and [p.queued_count for p in ns["hourly"]] == [3]
    assert ns["report"].recorded == ("reports",)


def metrics_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    return {}


def dashboard_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    return {}


def metrics_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    assert b"alkstore_queue_oldest_ready_job_age_seconds" in ns["body"]
    assert ns["content_type"].startswith("text/plain")
    labels = {"schema": "pgboss", "queue": "emails"}
    registry = ns["worker_registry"]
    assert registry.get_sample_value("alkstore_worker_jobs_completed_total", labels) == 1
    assert registry.get_sample_value("alkstore_worker_jobs_claimed_total", labels) == 1
    assert [j.state for j in ctx.jobs("emails")] == ["completed"]


def logging_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    library = logging.getLogger("alkstore_sa")
    ctx.notes["logger"] = (library.level, list(library.handlers))
    return {}


def logging_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    first, last = ns["failures"]
    assert (first["level"], first["next"], first["attempt"]) == ("WARNING", "retry", 1)
    assert (last["level"], last["next"], last["attempt"]) == ("WARNING", "dead_letter", 2)
    assert (last["queue"], last["dead_letter"]) == ("payments", "payments-dlq")
    assert "traceback" not in first and "ConnectionError" in last["traceback"]
    assert [j.state for j in ctx.jobs("payments")] == ["failed"]


def logging_cleanup(ctx: Ctx) -> None:
    # The page added a handler to the library's logger: put the logger back as it was.
    if "logger" in ctx.notes:
        library = logging.getLogger("alkstore_sa")
        level, handlers = ctx.notes["logger"]
        library.setLevel(level)
        library.handlers[:] = handlers


def dashboard_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    assert 'data-schema="pgboss"' in ns["overview"].text
    assert ns["page"].headers["x-frame-options"] == "DENY"


MYAPP = '''
"""Stand-in for the reader's application, as testing.md assumes it."""
from sqlalchemy import select
from sqlalchemy.orm import Session
from alkstore_sa import QueueService
from test_docs_examples import Order


class EmailTaken(Exception):
    pass


def signup(session, email):
    if email.startswith("taken@"):
        raise EmailTaken(email)
    QueueService(session).send("emails", {"to": email})


def signup_with(jobs, email):
    jobs.send("emails", {"to": email})


def send_email(job):
    return {"sent": True}


def place_order(engine, item):
    with Session(engine) as session, session.begin():
        order = Order(item=item)
        session.add(order)
        session.flush()
        QueueService(session).send("orders.ship", {"order": order.id})


def shipped_orders(engine):
    with Session(engine) as session:
        return list(session.scalars(select(Order.item).where(Order.shipped).order_by(Order.id)))
'''

MYAPP_JOBS = """
from sqlalchemy import create_engine
from alkstore_sa import Worker
from test_docs_examples import Order

worker = Worker(create_engine({url!r}))


@worker.handler("orders.ship", transactional=True)
def ship(job, session):
    session.get(Order, job.data["order"]).shipped = True
"""


def apptests_prelude(ctx: Ctx) -> dict[str, Any]:
    # The doc's engine fixture installs the queue schema; the app's tables are the app's.
    AppBase.metadata.create_all(ctx.engine)
    app = ctx.tmp_path / "myapp"
    app.mkdir()
    (app / "__init__.py").write_text(MYAPP)
    (app / "jobs.py").write_text(MYAPP_JOBS.format(url=ctx.url))
    header = (
        "from myapp import EmailTaken, Order, place_order, send_email, shipped_orders, signup,"
        " signup_with\n"
    )
    return {"__header__": header}


def apptests_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    assert [row.shipped for row in ctx.sql("SELECT shipped FROM orders")] == [True]


def tutorial_prelude(ctx: Ctx) -> dict[str, Any]:
    require_module("fastapi", "the tutorial (the examples extra)")
    require_module("jinja2", "the tutorial's dashboard (the dashboard extra)")
    return {}  # the page installs everything itself, as its reader does


def tutorial_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    project: Project = ctx.notes["project"]
    log = "\n".join(project.log)
    assert (ns["receipt"].state, ns["receipt"].output) == (
        "completed",
        {"sent_to": "ada@example.com"},
    )
    assert ns["failed"].state == "failed" and ns["failed"].retry_count == 2
    assert ns["copy"].data == {"order": ns["bad"]["order"]}
    assert (ns["report"].cron, ns["report"].timezone) == ("0 6 * * *", "Europe/Paris")
    assert "mail to ada@example.com: Your book is on its way" in log
    assert "4 passed" in log, log
    # The tests cleaned up after the walkthrough: only what their last test left.
    assert [j.data for j in ctx.jobs("receipts-dlq")] == [
        {"order": row.id} for row in ctx.sql("SELECT id FROM orders")
    ]


def heartbeats_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    parts: list[Any] = []
    ctx.notes["parts"] = parts
    return {"build_part": lambda data, part: parts.append((data["month"], part))}


def heartbeats_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    assert ctx.notes["parts"] == [("2026-11", 0), ("2026-11", 1), ("2026-11", 2)]
    [job] = ctx.jobs("reports")
    assert (job.state, job.output) == ("completed", {"parts": 3})
    [(seconds, beat_after_start)] = ctx.sql(
        "SELECT heartbeat_seconds, heartbeat_on > started_on FROM pgboss.job"
    )
    assert (seconds, beat_after_start) == (30, True)  # touched after the fetch


def backends_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    with Session(ctx.engine) as session, session.begin():
        QueueService(session).create_queue("emails")
    return {}


def backends_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [job] = ctx.jobs("emails")
    assert job.data == {"to": "ada@example.com"}
    assert ns["worker"].backend.name == "citus"


def pgbouncer_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    return {}


def pgbouncer_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [job] = ctx.jobs("emails")
    assert (job.state, job.data) == ("created", {"to": "ada@example.com"})
    # The URL it gave went through PgBouncer, on a port of its own.
    assert make_url(ns["pooled_url"]).port != make_url(ctx.url).port


def rrule_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    return {}


def rrule_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    rows = ctx.sql("SELECT key, kind, timezone FROM pgboss.schedule ORDER BY key")
    assert [tuple(r) for r in rows] == [
        ("fortnightly", "rrule", "Europe/Paris"),
        ("weekdays", "rrule", "Europe/Paris"),
    ]
    assert ns["report"].fired == ("reports__weekdays",)
    [(slot,)] = ctx.sql("SELECT singleton_on FROM pgboss.job WHERE name = '__pgboss__send-it'")
    assert slot == dt.datetime(2030, 6, 5, 7, 0)
    [job] = ctx.jobs("reports")  # the refusal left the transaction usable
    assert job.data == {"still": "usable"}


def batch_results_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)

    def setup(jobs: QueueService) -> None:
        jobs.create_queue("thumbnails", retry_limit=0)
        jobs.send_many("thumbnails", [{"data": {"file": f}} for f in ("a", "b", "")])

    ctx.service(setup)
    lost: list[Any] = []
    ctx.notes["lost"] = lost
    return {"log_lost": lost.append}


def batch_results_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    states = sorted((j.data["file"], j.state, j.output) for j in ctx.jobs("thumbnails"))
    assert states == [
        ("", "failed", {"error": "no file"}),
        ("a", "completed", {"thumb": "a.png"}),
        ("b", "completed", {"thumb": "b.png"}),
    ]
    outcomes = ns["done"].outcomes + ns["failed"].outcomes
    assert [o.settled for o in outcomes] == [True, True, True]
    assert ctx.notes["lost"] == []


def dead_letters_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    return {}


def fastapi_prelude(ctx: Ctx) -> dict[str, Any]:
    require_module("fastapi", "the FastAPI page (the examples extra)")
    install_schema(ctx)
    ctx.notes["mailer"] = mailer = AsyncFakeMailer()
    return {"Signup": Signup, "mailer": mailer}


def fastapi_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    assert [row.email for row in ctx.sql("SELECT email FROM signups")] == ["ada@example.com"]
    [job] = ctx.jobs("welcome-emails")
    assert (job.state, job.data, job.retry_limit) == ("completed", {"email": "ada@example.com"}, 5)
    assert ctx.notes["mailer"].sent == ["ada@example.com"]
    assert ns["worker"].stats()["welcome-emails"].completed == 1


def flask_prelude(ctx: Ctx) -> dict[str, Any]:
    require_module("flask_sqlalchemy", "the Flask-SQLAlchemy page (the examples extra)")
    install_schema(ctx)
    ctx.notes["mailer"] = mailer = FakeMailer()
    return {"mailer": mailer}


def flask_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    assert [row.email for row in ctx.sql("SELECT email FROM signup")] == ["ada@example.com"]
    [job] = ctx.jobs("welcome-emails")
    assert (job.state, job.data, job.retry_limit) == ("completed", {"email": "ada@example.com"}, 5)
    with ns["app"].app_context():
        ns["db"].engine.dispose()


def keys_prelude(ctx: Ctx) -> dict[str, Any]:
    install_schema(ctx)
    return {}


def fifo_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    states = {(j.singleton_key, j.data["amount"]): j.state for j in ctx.jobs("ledger")}
    assert states == {
        ("account-7", 100): "active",
        ("account-7", -30): "created",
        ("account-7", 5): "created",
        ("account-8", 1): "active",
    }


def upserts_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    jobs = ctx.jobs("reports")
    assert [(j.state, j.data, j.singleton_key) for j in jobs] == [
        ("active", {"since": "2026-02-01"}, "acme"),
        ("created", {"since": "2026-03-01"}, "acme"),
    ]
    [waiting] = ctx.sql(
        "SELECT start_after - created_on AS wait FROM pgboss.job"
        " WHERE name = 'reports' AND state = 'created'"
    )
    assert dt.timedelta(hours=1) <= waiting.wait < dt.timedelta(hours=2)


def dead_letters_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    assert ctx.jobs("orders-dlq") == []
    states = sorted(j.state for j in ctx.jobs("orders"))
    assert states == ["created", "failed"]  # the original failed, the redriven job waits


def http_api_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    from starlette.testclient import TestClient

    client = TestClient(ns["api"], base_url="http://127.0.0.1")
    token = {"authorization": "Bearer a-long-random-token"}
    assert client.get("/api/get_queues").status_code == 401
    assert client.get("/api/get_queues", headers=token).json() == {"ok": True, "result": []}
    assert client.get("/openapi.json").json()["openapi"] == "3.1.0"
    both = TestClient(ns["ops"], base_url="http://127.0.0.1")
    answer = both.get("/queue/api/get_queues", headers=token)
    assert answer.json() == {"ok": True, "result": []}
    assert both.get("/admin/queues/").status_code == 401  # the dashboard asks for its login
    assert both.get("/admin/queues/", auth=("ops", "s3cret")).status_code == 200


def attempts_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    [job] = ctx.jobs("invoices")
    assert job.state == "retry"
    rows = ctx.sql(
        "SELECT attempt, cause, error->>'name' FROM pgboss.alkstore_job_attempt"
        " WHERE job_id = :j ORDER BY id",
        j=job.id,
    )
    assert [tuple(r) for r in rows] == [
        (1, "failed", "TimeoutError"),
        (2, "failed", "TimeoutError"),
    ]
    assert [
        a.attempt
        for a in ns["QueueService"](Session(ctx.engine)).get_job_attempts("invoices", job.id)
    ] == [1, 2]


def flows_check(ctx: Ctx, ns: dict[str, Any]) -> None:
    ran = ns["ran"]
    assert sorted(ran[:2]) == ["eu", "us"] and ran[2:] == ["report", "mail"]
    times = {
        r.id: (r.started_on, r.completed_on)
        for r in ctx.sql("SELECT id, started_on, completed_on FROM pgboss.job")
    }
    ids = ns["ids"]
    for child, parents in {"report": ["eu", "us"], "mail": ["report"]}.items():
        assert all(times[ids[p]][1] <= times[ids[child]][0] for p in parents)
    [mail] = ctx.jobs("mail-report")
    assert (mail.state, mail.retry_limit) == ("completed", 5)
    listed = {(p.name, p.id, p.state) for p in ns["parents"]}
    assert listed == {("fetch-prices", ids[r], "completed") for r in ("eu", "us")}
    assert [(c.name, c.id, c.state) for c in ns["children"]] == [
        ("mail-report", ids["mail"], "completed")
    ]


PAGES: dict[str, Page] = {
    "README.md": Page(readme_prelude, readme_check, before_block={1: readme_five_minutes_pass}),
    "docs/quickstart.md": Page(quickstart_prelude, quickstart_check),
    "docs/how-to/enqueue-in-transaction.md": Page(enqueue_prelude, enqueue_check),
    "docs/how-to/workers.md": Page(workers_prelude, workers_check),
    "docs/how-to/supervision.md": Page(supervision_prelude, supervision_check),
    "docs/how-to/node-interop.md": Page(interop_prelude, interop_check),
    "docs/how-to/group-concurrency.md": Page(groups_prelude, groups_check),
    "docs/how-to/upgrade-alongside-node.md": Page(upgrade_prelude, upgrade_check),
    "docs/how-to/observability.md": Page(observability_prelude, observability_check),
    "docs/how-to/tracing.md": Page(tracing_prelude, tracing_check, cleanup=tracing_cleanup),
    "docs/how-to/testing.md": Page(apptests_prelude, apptests_check, pytest_tests=6),
    "docs/concepts/limits.md": Page(limits_prelude, limits_check, cleanup=limits_cleanup),
    "docs/how-to/key-strict-fifo.md": Page(keys_prelude, fifo_check),
    "docs/how-to/upserts.md": Page(keys_prelude, upserts_check),
    "docs/how-to/heartbeats.md": Page(heartbeats_prelude, heartbeats_check),
    "docs/how-to/rrule-schedules.md": Page(rrule_prelude, rrule_check),
    "docs/how-to/batch-results.md": Page(batch_results_prelude, batch_results_check),
    "docs/how-to/dead-letters.md": Page(dead_letters_prelude, dead_letters_check),
    "docs/concepts/attempt-history.md": Page(keys_prelude, attempts_check),
    "docs/how-to/http-api.md": Page(keys_prelude, http_api_check),
    "docs/how-to/flows.md": Page(keys_prelude, flows_check),
    "docs/how-to/metrics.md": Page(metrics_prelude, metrics_check),
    "docs/how-to/dashboard.md": Page(dashboard_prelude, dashboard_check),
    "docs/how-to/logging.md": Page(logging_prelude, logging_check, cleanup=logging_cleanup),
    "docs/how-to/fastapi.md": Page(fastapi_prelude, fastapi_check),
    "docs/how-to/flask.md": Page(flask_prelude, flask_check),
    "docs/how-to/pgbouncer.md": Page(pgbouncer_prelude, pgbouncer_check),
    "docs/how-to/backends.md": Page(backends_prelude, backends_check),
    "docs/tutorial.md": Page(
        tutorial_prelude,
        tutorial_check,
        project=True,
        background=frozenset({"python -m shop.worker"}),
    ),
}


# ---------------------------------------------------------------- running a page


def workers_in(ns: dict[str, Any]) -> list[Worker | AsyncWorker]:
    return [v for v in ns.values() if isinstance(v, Worker | AsyncWorker)]


def due_unfinished(ctx: Ctx, queues: list[str]) -> int:
    [row] = ctx.sql(
        "SELECT count(*) FROM pgboss.job WHERE name = ANY(:queues)"
        " AND (state = 'active' OR (state < 'active' AND start_after <= now()))",
        queues=queues,
    )
    return int(row[0])


class WorkerStopper:
    """Stops the workers a block starts with ``run()`` once their due jobs are finished."""

    def __init__(self, ctx: Ctx, ns: dict[str, Any]) -> None:
        self.ctx = ctx
        self.ns = ns
        self.before = {id(w) for w in workers_in(ns)}
        self.done = threading.Event()
        self.stopped: list[Worker | AsyncWorker] = []
        self.thread = threading.Thread(target=self._watch, name="docs-stopper", daemon=True)

    def __enter__(self) -> WorkerStopper:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(WORKER_DEADLINE + 10)

    def _watch(self) -> None:
        deadline = time.monotonic() + WORKER_DEADLINE
        while not self.done.wait(0.1):
            for worker in workers_in(self.ns):
                if id(worker) in self.before or worker in self.stopped:
                    continue
                fetched = sum(c.fetched for c in worker.stats().values())
                try:
                    idle = fetched > 0 and due_unfinished(self.ctx, list(worker.specs)) == 0
                except Exception:  # the deadline still stops it; the check will say why
                    idle = False
                if idle or time.monotonic() > deadline:
                    self.stopped.append(worker)
                    self._stop(worker)

    def _stop(self, worker: Worker | AsyncWorker) -> None:
        if isinstance(worker, Worker):
            worker.stop()
        else:
            asyncio.run_coroutine_threadsafe(worker.stop(), self.ctx.loop).result(60)


def run_blocks(ctx: Ctx, page: str, ns: dict[str, Any]) -> None:
    spec = PAGES[page]
    for index, block in enumerate(b for b in blocks_of(page) if b.not_run is None):
        if index in spec.before_block:
            spec.before_block[index](ctx)
        code = compiled(block, ctx.url)
        with WorkerStopper(ctx, ns):
            if code.co_flags & inspect.CO_COROUTINE:
                ctx.loop.run_until_complete(types.FunctionType(code, ns)())
            else:
                exec(code, ns)


def run_as_pytest_module(ctx: Ctx, page: str, header: str, expected: int) -> None:
    """Write the page's blocks into a test module and run it with an inner pytest."""
    code = [with_database(b.code, ctx.url) for b in blocks_of(page) if b.not_run is None]
    module = ctx.tmp_path / "test_page.py"
    module.write_text(header + "\n" + "\n\n".join(code))
    (ctx.tmp_path / "pytest.ini").write_text(
        "[pytest]\nasyncio_default_fixture_loop_scope = function\n"
    )

    outcomes: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}

    class Outcomes:
        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            if report.when == "call" or report.outcome != "passed":
                outcomes[report.outcome].append(report.nodeid)

    sys.path.insert(0, str(ROOT / "tests"))
    sys.path.insert(0, str(ctx.tmp_path))
    try:
        code_ = pytest.main(
            [str(module), "-q", "-p", "no:cacheprovider", "--import-mode=importlib"],
            plugins=[Outcomes()],
        )
    finally:
        sys.path.remove(str(ctx.tmp_path))
        sys.path.remove(str(ROOT / "tests"))
        for name in [m for m in sys.modules if m == "myapp" or m.startswith("myapp.")]:
            jobs = sys.modules.pop(name)
            engine = getattr(getattr(jobs, "worker", None), "engine", None)
            if isinstance(engine, Engine):
                engine.dispose()
    assert code_ == pytest.ExitCode.OK, f"{page}: the examples' tests failed: {outcomes}"
    assert len(outcomes["passed"]) == expected, outcomes


# ---------------------------------------------------------------- a project page

FENCE_ANY = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
FILE_LINE = re.compile(r"^# (?P<path>[\w./-]+\.py)\s*$")
SETTLE_DEADLINE = 60.0
"""Seconds a project's background worker may take to register and finish the due jobs."""


@dataclass(frozen=True)
class Fence:
    """One fenced block of a project page, of any language."""

    lang: str
    line: int
    code: str
    not_run: str | None


def fences_of(page: str) -> list[Fence]:
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    found: list[Fence] = []
    i = 0
    while i < len(lines):
        match = FENCE_ANY.match(lines[i])
        if match is None:
            i += 1
            continue
        marker = NOT_RUN.match(lines[i - 1]) if i > 0 else None
        end = i + 1
        while end < len(lines) and not FENCE_CLOSE.match(lines[end]):
            end += 1
        code = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Fence(match["lang"], i + 2, code, marker["reason"] if marker else None))
        i = end + 1
    return found


@dataclass
class Project:
    """The reader's project folder, its commands' outputs and its background processes."""

    ctx: Ctx
    root: Path
    background: frozenset[str]
    running: list[tuple[str, subprocess.Popen[bytes], Path]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
        env["PYTHONUNBUFFERED"] = "1"
        env.pop("PYTHONPATH", None)  # the project is importable as its reader's is
        return env

    def command(self, line: str) -> None:
        self.stop_background()
        words = shlex.split(line)
        if words[0] in ("alembic", "pytest"):
            words[:1] = [sys.executable, "-m", words[0]]
        elif words[0] == "python":
            words[0] = sys.executable
        else:  # mkdir, touch
            words = ["sh", "-c", line]
        if line in self.background:
            out = self.root / f".background-{len(self.running)}.log"
            with out.open("wb") as sink:
                proc = subprocess.Popen(
                    words, cwd=self.root, env=self.env(), stdout=sink, stderr=subprocess.STDOUT
                )
            self.running.append((line, proc, out))
            return
        done = subprocess.run(
            words,
            cwd=self.root,
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=300,
        )
        self.log.append(f"$ {line}\n{done.stdout}{done.stderr}")
        assert done.returncode == 0, "\n".join(self.log)

    def stop_background(self) -> None:
        while self.running:
            line, proc, out = self.running.pop()
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(60)
            except Exception:
                proc.kill()
                proc.wait()
                raise
            self.log.append(f"$ {line} (stopped)\n{out.read_text()}")
            assert code == 0, "\n".join(self.log)

    def settle(self) -> None:
        """Wait until the background worker registered and the due jobs are done."""
        if not self.running:
            return
        deadline = time.monotonic() + SETTLE_DEADLINE
        while True:
            for line, proc, out in self.running:
                assert proc.poll() is None, f"$ {line} exited:\n{out.read_text()}"
            [(registered, unfinished)] = self.ctx.sql(
                "SELECT (SELECT count(*) FROM pgboss.instance WHERE stopped_on IS NULL),"
                " (SELECT count(*) FROM pgboss.job WHERE state < 'completed'"
                "  AND start_after < now() + interval '1 minute'"
                "  AND name NOT IN (SELECT dead_letter FROM pgboss.queue"
                "                   WHERE dead_letter IS NOT NULL))"
            )
            if registered and not unfinished:
                return
            assert time.monotonic() < deadline, [out.read_text() for _, _, out in self.running]
            time.sleep(0.1)

    def write(self, fence: Fence) -> None:
        first = fence.code.partition("\n")[0]
        match = FILE_LINE.match(first)
        assert match is not None
        path = self.root / match["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(with_database(fence.code, self.ctx.url))

    def set_ini(self, fence: Fence) -> None:
        wanted = configparser.ConfigParser(interpolation=None)
        wanted.read_string(with_database(fence.code, self.ctx.url))
        ini = configparser.ConfigParser(interpolation=None)
        ini.read(self.root / "alembic.ini")
        for section in wanted.sections():
            for key, value in wanted[section].items():
                ini[section][key] = value
        with (self.root / "alembic.ini").open("w") as out:
            ini.write(out)


def run_project(ctx: Ctx, page: str, ns: dict[str, Any]) -> None:
    spec = PAGES[page]
    root = ctx.tmp_path / "project"
    root.mkdir()
    project = Project(ctx, root, spec.background)
    ctx.notes["project"] = project
    sys.path.insert(0, str(root))
    try:
        for fence in fences_of(page):
            if fence.not_run is not None or fence.lang == "text":
                continue
            if fence.lang == "console":
                for line in fence.code.splitlines():
                    if line.startswith("$ "):
                        project.command(line.removeprefix("$ "))
            elif fence.lang == "ini":
                project.set_ini(fence)
            elif fence.lang == "python" and FILE_LINE.match(fence.code.partition("\n")[0]):
                project.write(fence)
            elif fence.lang == "python":
                project.settle()
                code = compiled(Block(page, fence.line, fence.code, None), ctx.url)
                exec(code, ns)
            else:
                raise AssertionError(f"{page}:{fence.line}: a {fence.lang!r} block")
        project.stop_background()
    finally:
        for _, proc, _ in project.running:
            proc.kill()
            proc.wait()
        sys.path.remove(str(root))
        # The project's modules the page imported (its engines with them).
        mine = [
            name
            for name, module in sys.modules.items()
            if str(getattr(module, "__file__", None) or "").startswith(str(root))
        ]
        for name in mine:
            module = sys.modules.pop(name)
            engine = getattr(module, "engine", None)
            if isinstance(engine, Engine):
                engine.dispose()


def dispose_engines(ctx: Ctx, ns: dict[str, Any]) -> None:
    engines = [v for v in ns.values() if isinstance(v, Engine | AsyncEngine)]
    engines += [w.engine for w in workers_in(ns)]
    for engine in engines:
        if isinstance(engine, AsyncEngine):
            ctx.loop.run_until_complete(engine.dispose())
        else:
            engine.dispose()


FAST_TIER_PAGES = frozenset({"README.md", "docs/quickstart.md"})
"""The pages a newcomer reads first run in the fast tier; every other page is ``docs_page``
(the slow tier)."""


def page_params() -> list[Any]:
    return [
        pytest.param(page, marks=() if page in FAST_TIER_PAGES else pytest.mark.docs_page)
        for page in pages_with_examples()
    ]


@pytest.mark.parametrize("page", page_params())
def test_the_python_examples_of_the_page_run(page: str, page_url: str, tmp_path: Path) -> None:
    spec = PAGES.get(page)
    assert spec is not None, f"{page} has Python examples: give it an entry in PAGES"
    loop = asyncio.new_event_loop()
    ctx = Ctx(page_url, create_engine(page_url), tmp_path, loop)
    ns: dict[str, Any] = {"__name__": "__docs__"}
    try:
        ns.update(spec.prelude(ctx))
        if spec.pytest_tests is not None:
            run_as_pytest_module(ctx, page, ns.pop("__header__", ""), spec.pytest_tests)
        elif spec.project:
            run_project(ctx, page, ns)
        else:
            run_blocks(ctx, page, ns)
        spec.check(ctx, ns)
    finally:
        # A block that failed may leave a worker running; stop() is safe on any worker.
        for worker in workers_in(ns):
            if isinstance(worker, Worker):
                worker.stop(0)
            else:
                loop.run_until_complete(worker.stop(0))
        if spec.cleanup is not None:
            spec.cleanup(ctx)
        dispose_engines(ctx, ns)
        ctx.engine.dispose()
        loop.close()


# ---------------------------------------------------------------- the collector itself


def test_every_page_with_python_examples_is_run_and_every_entry_is_a_page() -> None:
    assert sorted(pages_with_examples()) == sorted(PAGES)


def test_the_url_rule_replaces_only_database_url_literals() -> None:
    code = 'create_engine("postgresql+psycopg://app@db/app", echo=True)  # postgresql://x\n'
    assert with_database(code, "postgresql+psycopg://u@h:5/docs_x") == (
        'create_engine("postgresql+psycopg://u@h:5/docs_x", echo=True)  # postgresql://x\n'
    )


def test_a_block_marked_not_run_is_collected_with_its_reason(tmp_path: Path) -> None:
    md = textwrap.dedent(
        """\
        <!-- not-run: needs Node -->
        ```python
        boss.start()
        ```

        ```python
        x = 1
        ```
        """
    )
    page = tmp_path / "page.md"
    page.write_text(md)
    found = blocks_of(str(page))  # an absolute path: ROOT / it is the path itself
    assert [(b.line, b.not_run, b.code) for b in found] == [
        (3, "needs Node", "boss.start()\n"),
        (7, None, "x = 1\n"),
    ]
