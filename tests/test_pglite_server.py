"""The ``pglite`` profile on PGlite itself: PostgreSQL 18 in WebAssembly, served over the wire
protocol by ``pglite-server`` (npm ``@electric-sql/pglite-socket``, ``tests/pglite``).

One server runs for the session (``support.pglite``); each test installs a schema of its own
with ``migrate.upgrade(backend="pglite")`` through an engine of one connection, which is all
the server serves at a time. Through it: the install, sends, a ``Worker(backend="pglite")``
working jobs exactly once, a supervision pass (expiry, deletion), a cron schedule under a
:class:`FakeClock`, the "Testing against PGlite" example of ``docs/how-to/backends.md``, and
the catalog of our install beside the one Node pg-boss 12.38 builds there with
``backend: 'pglite'``. All slow tier: each starts Node (the server, or pg-boss too).
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support import catalog
from support.node import NodeBoss46, node46_modules
from support.pglite import (
    HANDOVER_SECONDS,
    node_url,
    pglite_engine,
    pglite_modules,
    pglite_url,
)

from alkstore_sa import QueueService, Worker, migrate
from alkstore_sa.clock import FakeClock
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.supervision import Supervisor

__all__ = ["node46_modules", "pglite_modules", "pglite_url"]  # fixtures used below

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
BACKENDS_PAGE = ROOT / "docs" / "how-to" / "backends.md"


class OnPGlite(NamedTuple):
    engine: Engine
    schema: str

    def service(self, fn: Callable[[QueueService], Any]) -> Any:
        """``fn`` on a ``pglite``-profile service in a transaction of its own, committed."""
        with Session(self.engine) as session, session.begin():
            return fn(QueueService(session, schema=self.schema, backend="pglite"))

    def sql(self, statement: str, **params: Any) -> list[Any]:
        with self.engine.connect() as conn:
            found = conn.execute(text(statement.format(s=f'"{self.schema}"')), params)
            return list(found)

    def now(self) -> dt.datetime:
        [(now,)] = self.sql("SELECT now()")
        assert isinstance(now, dt.datetime)
        return now


def drop_schema(engine: Engine, schema: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture
def on_pglite(pglite_url: str) -> Iterator[OnPGlite]:
    """A schema installed under the ``pglite`` profile through the PGlite server."""
    engine = pglite_engine(pglite_url)
    schema = f"pgl_{uuid.uuid4().hex[:10]}"
    migrate.upgrade(engine, schema, backend="pglite")
    try:
        yield OnPGlite(engine, schema)
    finally:
        drop_schema(engine, schema)
        engine.dispose()


def wait_until(predicate: Callable[[], bool], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


# ------------------------------------------------------------------ the server and install


def test_the_install_runs_on_pglite_which_serves_one_connection_at_a_time(
    on_pglite: OnPGlite, pglite_url: str
) -> None:
    [(version,)] = on_pglite.sql("SELECT version()")
    assert "PGlite" in version  # not a stock PostgreSQL
    assert on_pglite.sql("SELECT version FROM {s}.version") == [(46,)]
    assert on_pglite.sql("SELECT to_regclass('{s}.job_common') IS NOT NULL") == [(True,)]
    # While the pool's one connection is open, the server refuses another: hence the pool.
    with on_pglite.engine.connect() as held:
        held.execute(text("SELECT 1"))
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(node_url(pglite_url), connect_timeout=5).close()


# ------------------------------------------------------------------ send and work


def test_a_pglite_worker_of_one_connection_works_every_job_exactly_once(
    on_pglite: OnPGlite,
) -> None:
    on_pglite.service(lambda q: q.create_queue("q"))
    sent = on_pglite.service(lambda q: [q.send("q", {"n": n}) for n in range(200)])
    assert len(set(sent)) == 200
    runs: Counter[uuid.UUID] = Counter()
    lock = threading.Lock()

    def handle(job: Any) -> dict[str, int]:
        with lock:
            runs[job.id] += 1
        return {"twice": job.data["n"] * 2}

    worker = Worker(
        on_pglite.engine,
        schema=on_pglite.schema,
        backend="pglite",
        listen=False,  # a listener needs a second connection, which PGlite refuses
        handlers={"q": handle},
        concurrency=4,
        batch_size=10,
        poll_interval=0.1,
    )
    worker.start()
    try:
        assert wait_until(
            lambda: (
                on_pglite.sql(
                    "SELECT count(*) FROM {s}.job WHERE name = 'q' AND state = 'completed'"
                )
                == [(200,)]
            )
        )
    finally:
        worker.stop(timeout=10)
    assert runs == Counter(dict.fromkeys(sent, 1))
    outputs = on_pglite.sql("SELECT data, output FROM {s}.job WHERE name = 'q'")
    assert all(output == {"twice": data["n"] * 2} for data, output in outputs)
    assert worker.backend.name == "pglite"


# ------------------------------------------------------------------ supervision and cron


def test_a_supervision_pass_expires_and_deletes_under_pglite(on_pglite: OnPGlite) -> None:
    on_pglite.service(lambda q: q.create_queue("slow", expire_seconds=1, retry_limit=0))
    on_pglite.service(lambda q: q.create_queue("done", deletion_seconds=60))
    stuck = on_pglite.service(lambda q: q.send("slow", {"n": 1}))
    finished = on_pglite.service(lambda q: q.send("done", {"n": 2}))
    assert [j.id for j in on_pglite.service(lambda q: q.fetch("slow"))] == [stuck]
    [job] = on_pglite.service(lambda q: q.fetch("done"))
    on_pglite.service(lambda q: q.complete("done", job.id))
    clock = FakeClock(on_pglite.now() + dt.timedelta(seconds=120))
    report = Supervisor(
        on_pglite.engine, schema=on_pglite.schema, clock=clock, backend="pglite", schedule=False
    ).run_once(force=True)
    assert report.expired == {"slow": 1}
    assert report.deleted == {"done": 1}
    assert not report.errors
    assert on_pglite.sql("SELECT id, state FROM {s}.job WHERE name = 'slow'") == [(stuck, "failed")]
    assert on_pglite.sql("SELECT id FROM {s}.job WHERE id = :i", i=finished) == []


def test_a_cron_schedule_fires_once_a_minute_under_pglite(on_pglite: OnPGlite) -> None:
    on_pglite.service(lambda q: q.create_queue("reports"))
    on_pglite.service(lambda q: q.schedule("reports", "* * * * *", {"kind": "minutely"}))
    # Three minutes of fake time, in the past: the send-it jobs the timekeeper files are due
    # at the minute they fired, and their claim reads the database's own clock.
    start = (on_pglite.now() - dt.timedelta(minutes=10)).replace(second=5, microsecond=0)
    clock = FakeClock(start)
    supervisor = Supervisor(
        on_pglite.engine, schema=on_pglite.schema, clock=clock, backend="pglite", supervise=False
    )
    while clock.now() <= start + dt.timedelta(seconds=170):
        supervisor.run_once()
        clock.advance(20)
    slots = on_pglite.sql(
        "SELECT singleton_on FROM {s}.job WHERE name = :q ORDER BY singleton_on", q=SEND_IT_QUEUE
    )
    minute = start.replace(second=0)
    assert [s.replace(tzinfo=dt.UTC) for (s,) in slots] == [
        minute + dt.timedelta(minutes=m) for m in range(3)
    ]
    assert (
        on_pglite.sql("SELECT data FROM {s}.job WHERE name = 'reports'")
        == [({"kind": "minutely"},)] * 3
    )


# ------------------------------------------------------------------ the docs' example


def pglite_example() -> str:
    """The Python block of the backends page's "Testing against PGlite" section."""
    page = BACKENDS_PAGE.read_text(encoding="utf-8")
    section = page.split("## Testing against PGlite", 1)[1]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    return str(block)


def test_the_docs_pglite_example_runs_through_pglite(pglite_url: str) -> None:
    code = re.sub(r"postgresql\+psycopg://[^\s\"']+", pglite_url, pglite_example())
    ns: dict[str, Any] = {}

    def stop_when_done() -> None:
        # run() blocks until SIGINT/SIGTERM; stop it, as the page's reader would, once done.
        assert wait_until(lambda: bool(ns.get("reports")) and "pglite_worker" in ns)
        ns["pglite_worker"].stop()

    stopper = threading.Thread(target=stop_when_done, daemon=True)
    stopper.start()
    time.sleep(HANDOVER_SECONDS)  # the example's engine connects once, without retrying
    exec(compile(code, str(BACKENDS_PAGE), "exec"), ns)
    stopper.join(10)
    assert ns["reports"] == [{"month": "2026-11"}]
    engine = pglite_engine(pglite_url)
    try:
        with engine.connect() as conn:
            assert "PGlite" in conn.execute(text("SELECT version()")).scalar_one()
            states = conn.execute(text("SELECT state FROM pgboss.job WHERE name = 'reports'"))
            assert list(states.scalars()) == ["completed"]
    finally:
        drop_schema(engine, "pgboss")
        engine.dispose()


# ------------------------------------------------------------------ beside Node pg-boss 12.38

NOT_NULL_OF_JOB_COMMON = re.compile(r"^job_common: job_common_(\w+_not_null) \(n\)")


def as_node_names_them(catalog_: catalog.Catalog) -> catalog.Catalog:
    """``catalog_`` with ``job_common``'s NOT NULL constraints named as pg-boss names them.

    PostgreSQL 18 keeps NOT NULL constraints in its catalog, by name. pg-boss makes
    ``job_common`` with ``LIKE job``, which copies the parent's names (``job_id_not_null``);
    our first revision declares the table's columns, which PostgreSQL names after it
    (``job_common_id_not_null``). Nothing reads those names; every other fact must match.
    """
    shaped = dict(catalog_)
    shaped["constraints"] = sorted(
        NOT_NULL_OF_JOB_COMMON.sub(r"job_common: job_\1 (n)", line)
        for line in catalog_["constraints"]
    )
    return shaped


def test_our_pglite_install_is_node_pg_boss_s_on_the_same_server(
    pglite_url: str, node46_modules: None
) -> None:
    ours, theirs = f"pgl_ours_{uuid.uuid4().hex[:8]}", f"pgl_node_{uuid.uuid4().hex[:8]}"
    engine = pglite_engine(pglite_url)
    try:
        migrate.upgrade(engine, ours, backend="pglite")
        engine.dispose()  # the server's one connection goes to Node now
        time.sleep(HANDOVER_SECONDS)
        boss = NodeBoss46(
            node_url(pglite_url), theirs, backend="pglite", max=1, supervise=False, schedule=False
        )
        try:
            assert boss.call("getQueues") == []
        finally:
            boss.close()
        with engine.connect() as conn:
            [server] = conn.execute(text("SELECT version()")).scalars()
            # Tables of ours that pg-boss does not have (the attempt history, claims...).
            own = {
                name
                for (name,) in conn.execute(
                    text(
                        "SELECT tablename FROM pg_tables WHERE schemaname = :s"
                        " AND tablename LIKE 'alkstore\\_%'"
                    ),
                    {"s": ours},
                )
            }
            ignore = catalog.IGNORED_TABLES | own
            found = catalog.structural(catalog.snapshot(conn, ours, ignore), column_order=False)
            expected = catalog.structural(
                catalog.snapshot(conn, theirs, ignore), column_order=False
            )
            assert catalog.bam_rows(conn, ours) == catalog.bam_rows(conn, theirs) == []
        assert "PGlite" in server
        assert expected["version"] == ["46"]
        # The one known difference, on PostgreSQL 18 only: without the renaming it shows.
        assert catalog.diff(expected, found)
        catalog.assert_same(
            as_node_names_them(expected), as_node_names_them(found), ("node pglite", "ours")
        )
    finally:
        for schema in (ours, theirs):
            drop_schema(engine, schema)
        engine.dispose()
