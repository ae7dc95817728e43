"""Issue 13's scale scenarios: a large ready backlog, supervision over many queues,
transactional handlers.

* ``scale: N ready`` -- a ``Worker`` (concurrency 10, no-op handler, default
  settings) drains the first ``DRAINED`` jobs of a queue holding 10,000, (at
  schema 26) 100,000, and ``--scale-max`` (1,000,000) ready jobs; each size is
  compared with the 10,000 one of the same round. The jobs are bulk-loaded once
  with ``INSERT ... SELECT generate_series`` (the columns a send writes, with the
  queue's settings) and topped up between rounds, so the backlog is loaded once
  per run, not per round.
* ``supervision: 1,000 queues`` -- one ``Supervisor.run_once(force=True)`` over
  1,000 queues with a few jobs each (ready, expired active, old completed), while
  a thread claims on another queue; claim latency during and outside the pass, and
  the lock waits on our schema seen in ``pg_stat_activity`` during it.
* ``drain transactional`` -- the same drain with a ``transactional=True`` handler
  (it gets the job's Session and writes nothing) against the no-op handler.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session

from alkstore_sa import QueueService
from alkstore_sa.supervision import Supervisor
from alkstore_sa.worker import Worker

from ..common import Config, Sample, Stopwatch, percentile, sa_url
from . import Variant

CONCURRENCY = 10
DRAINED = 10_000
"""Jobs drained per measurement, at every backlog size (the smallest backlog's size)."""

SUP_QUEUES = 1_000
SUP_CLAIM_QUEUE = "sup_claim"
_SUP_LIKE = {"p": "sup\\_q%"}

_LOAD_CHUNK = 100_000


def _columns(cfg: Config) -> tuple[str, str]:
    """The job columns a send writes and the SELECT list taking them from the queue row."""
    cols = [
        "id",
        "name",
        "data",
        "priority",
        "start_after",
        "created_on",
        "keep_until",
        "retry_limit",
        "retry_delay",
        "retry_backoff",
        "retry_delay_max",
        "expire_seconds",
        "deletion_seconds",
        "dead_letter",
        "policy",
    ]
    vals = [
        "gen_random_uuid()",
        "q.name",
        "jsonb_build_object('n', g)",
        "0",
        "now() - interval '1 second'",
        "now() - interval '1 second'",
        "now() + make_interval(secs => q.retention_seconds)",
        "q.retry_limit",
        "q.retry_delay",
        "q.retry_backoff",
        "q.retry_delay_max",
        "q.expire_seconds",
        "q.deletion_seconds",
        "q.dead_letter",
        "q.policy",
    ]
    if cfg.schema_version >= 46:
        cols += ["heartbeat_seconds", "blocked", "blocking", "pending_dependencies"]
        vals += ["q.heartbeat_seconds", "false", "false", "0"]
    return ", ".join(cols), ", ".join(vals)


def bulk_load(cfg: Config, queue: str, count: int) -> None:
    """Insert ``count`` ready jobs into ``queue`` in SQL, 100,000 rows a statement."""
    cols, vals = _columns(cfg)
    statement = (
        f"INSERT INTO {{s}}.job ({cols}) SELECT {vals} "
        "FROM {s}.queue q, generate_series(1, %(n)s) g WHERE q.name = %(q)s"
    )
    with cfg.raw() as conn:
        left = count
        while left > 0:
            n = min(left, _LOAD_CHUNK)
            conn.execute(cfg.q(statement), {"q": queue, "n": n})
            left -= n
        conn.commit()


def _ensure_queues(cfg: Config, names: list[str]) -> None:
    with Session(cfg.engine) as session, session.begin():
        service = QueueService(session, schema=cfg.schema)
        for name in names:
            service.create_queue(name)


def top_up(cfg: Config, queue: str, ready: int) -> float:
    """Make ``queue`` hold exactly ``ready`` created jobs (and nothing else); seconds taken."""
    _ensure_queues(cfg, [queue])
    with Stopwatch() as w:
        cfg.exec("DELETE FROM {s}.job WHERE name = %s AND state <> 'created'", (queue,))
        with cfg.raw(autocommit=True) as conn:
            row = conn.execute(
                cfg.q("SELECT count(*) FROM {s}.job WHERE name = %s"), (queue,)
            ).fetchone()
        have = int(row[0]) if row else 0
        if have > ready:
            cfg.exec(
                "DELETE FROM {s}.job WHERE id IN (SELECT id FROM {s}.job WHERE name = %s LIMIT %s)",
                (queue, have - ready),
            )
        elif have < ready:
            bulk_load(cfg, queue, ready - have)
        cfg.exec("VACUUM ANALYZE {s}.job")
    return w.seconds


def _noop(job: Any) -> None:
    return None


def _noop_tx(job: Any, session: Session) -> None:
    return None


def drain_first(
    cfg: Config,
    queue: str,
    n: int,
    *,
    transactional: bool = False,
    cap: float = 60.0,
    engine: Engine | None = None,
) -> float:
    """Jobs/s of a ``Worker`` (concurrency 10, default settings) over its first ``n`` jobs,
    or over its first ``cap`` seconds if that comes first (schema 26 with a million ready
    jobs sorts them all at every claim)."""
    worker = Worker(engine or cfg.engine, schema=cfg.schema, concurrency=CONCURRENCY)
    if transactional:
        worker.register(queue, _noop_tx, transactional=True)
    else:
        worker.register(queue, _noop)
    worker.start()
    try:
        with Stopwatch() as w:
            worker.wake(queue)
            deadline = time.perf_counter() + cap
            while (done := worker.stats()[queue].completed) < n:
                if time.perf_counter() > deadline:
                    break
                time.sleep(0.002)
    finally:
        worker.stop(timeout=10)
    return done / w.seconds


# ------------------------------------------------------------------ scale


def _size_label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def scale_variants(cfg: Config) -> list[Variant]:
    small = cfg.size(10_000, 2_000)
    top = cfg.size(cfg.scale_max, min(cfg.scale_max, 100_000))
    sizes = [small, top] if cfg.schema_version >= 46 else [small, 100_000, top]
    sizes = sorted(set(sizes))
    drained = min(DRAINED, small)
    scenario = f"scale: ready backlog at {cfg.schema_version}"
    base = f"Worker, {_size_label(small)} ready"
    out: list[Variant] = []
    for size in sizes:
        queue = f"scale_{size}"
        name = f"Worker, {_size_label(size)} ready"

        def run(c: Config, queue: str = queue, size: int = size, name: str = name) -> list[Sample]:
            loaded = top_up(c, queue, size)
            rate = drain_first(c, queue, drained, cap=c.size(30.0, 10.0))
            return [Sample(scenario, name, "jobs/s", rate, {"load_s": loaded})]

        target = 0.8 if cfg.schema_version >= 46 else None
        out.append(
            Variant(
                scenario,
                name,
                run,
                None if size == small else base,
                f"first {drained:,} jobs drained (or first 30 s), default settings",
                (">=", target) if target is not None and size != small else None,
            )
        )
    return out


# ------------------------------------------------------------------ transactional


def transactional_variants(cfg: Config) -> list[Variant]:
    n = cfg.size(10_000, 2_000)
    scenario = f"drain transactional at {cfg.schema_version}"

    def make(queue: str, name: str, tx: bool, no_flush: bool = False) -> Variant:
        def run(c: Config) -> list[Sample]:
            top_up(c, queue, n)
            # A diagnostic: the same drain on an engine whose commits do not wait
            # for the WAL flush, to see how much of the cost is that wait.
            engine = (
                create_engine(
                    sa_url(c.url),
                    pool_size=24,  # as the shared engine's: no connection churn
                    max_overflow=8,
                    connect_args={"options": "-c synchronous_commit=off"},
                )
                if no_flush
                else None
            )
            try:
                rate = drain_first(c, queue, n, transactional=tx, engine=engine)
            finally:
                if engine is not None:
                    engine.dispose()
            return [Sample(scenario, name, "jobs/s", rate)]

        base = "Worker no-op" if tx else None
        return Variant(
            scenario,
            name,
            run,
            base,
            f"{n:,} ready jobs, concurrency 10, default settings",
            (">=", 0.8) if tx and not no_flush else None,
        )

    return [
        make("tx_noop", "Worker no-op", False),
        make("tx_handler", "Worker transactional", True),
        make("tx_no_flush", "transactional, synchronous_commit=off", True, no_flush=True),
    ]


# ------------------------------------------------------------------ supervision


def _seed_supervision(cfg: Config, per_queue: int) -> None:
    """Per queue: ``per_queue`` ready jobs, as many expired active and old completed."""
    cols, vals = _columns(cfg)
    ready = (
        f"INSERT INTO {{s}}.job ({cols}) SELECT {vals} "
        "FROM {s}.queue q, generate_series(1, %(n)s) g WHERE q.name LIKE %(p)s"
    )
    mine = _SUP_LIKE
    cfg.exec("DELETE FROM {s}.job WHERE name LIKE %(p)s", mine)
    cfg.exec(ready, {"n": per_queue * 3, **mine})
    # A third of them active past their expiry, a third completed long ago.
    cfg.exec(
        "UPDATE {s}.job SET state = 'active', expire_seconds = 1, "
        "started_on = now() - interval '1 hour' "
        "WHERE name LIKE %(p)s AND mod((data->>'n')::int, 3) = 1",
        mine,
    )
    cfg.exec(
        "UPDATE {s}.job SET state = 'completed', completed_on = now() - interval '30 days', "
        "keep_until = now() - interval '20 days' "
        "WHERE name LIKE %(p)s AND mod((data->>'n')::int, 3) = 2",
        mine,
    )
    cfg.exec("VACUUM ANALYZE {s}.job")


def _drop_supervision_queues(cfg: Config) -> None:
    """Delete the 1,000 queues, so that the next scenario's workers do not supervise them.

    Their jobs go first; the foreign-key checks of the queue rows are then skipped
    (``session_replication_role``): ``job.dead_letter`` has no index, so each deleted
    queue row would scan the whole job table, a million rows in the scale scenario.
    """
    with cfg.raw() as conn:
        conn.execute(cfg.q("DELETE FROM {s}.job WHERE name LIKE %(p)s"), _SUP_LIKE)
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(cfg.q("DELETE FROM {s}.queue WHERE name LIKE %(p)s"), _SUP_LIKE)
        conn.commit()


def supervision_pass(cfg: Config, per_queue: int) -> list[Sample]:
    scenario = f"supervision: {SUP_QUEUES:,} queues at {cfg.schema_version}"
    variant = "run_once(force=True)"
    names = [f"sup_q{i:04d}" for i in range(SUP_QUEUES)]
    _ensure_queues(cfg, names)
    _seed_supervision(cfg, per_queue)
    top_up(cfg, SUP_CLAIM_QUEUE, 50_000)

    stop = threading.Event()
    claims: list[tuple[float, float]] = []  # (start, latency s)
    waits: list[tuple[float, str, str]] = []

    def claimer() -> None:
        # Each claim is rolled back, so the queue never runs dry however long the pass.
        while not stop.is_set():
            t0 = time.perf_counter()
            with Session(cfg.engine) as session:
                QueueService(session, schema=cfg.schema).fetch(SUP_CLAIM_QUEUE, 10)
                session.rollback()
            claims.append((t0, time.perf_counter() - t0))

    def sampler() -> None:
        probe = (
            "SELECT wait_event, left(query, 80) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database() "
            "AND position(%s in query) > 0 AND pid <> pg_backend_pid()"
        )
        with cfg.raw(autocommit=True) as conn:
            while not stop.is_set():
                now = time.perf_counter()
                for event, query in conn.execute(probe, (cfg.schema,)).fetchall():
                    waits.append((now, str(event), str(query)))
                time.sleep(0.005)

    # The supervisor on an engine of its own, whose statements are counted and timed.
    engine = create_engine(sa_url(cfg.url), pool_size=2)
    statements: dict[str, list[float]] = defaultdict(list)
    started: dict[int, float] = {}

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        started[id(cursor)] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        key = " ".join(text.split())[:70]
        statements[key].append(time.perf_counter() - started.pop(id(cursor), 0.0))

    supervisor = Supervisor(engine, schema=cfg.schema)
    threads = [threading.Thread(target=claimer), threading.Thread(target=sampler)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.5)  # claims outside the pass, before it
        with Stopwatch() as w:
            t_start = time.perf_counter()
            report = supervisor.run_once(force=True)
            t_end = time.perf_counter()
        time.sleep(1.5)  # and after it
    finally:
        stop.set()
        for t in threads:
            t.join()
        engine.dispose()
        _drop_supervision_queues(cfg)
    count = sum(len(v) for v in statements.values())
    print(f"  the pass ran {count:,} statements; the dearest kinds (count, total s):")
    for key, times in sorted(statements.items(), key=lambda kv: -sum(kv[1]))[:6]:
        print(f"    {len(times):6,} {sum(times):7.2f}  {key}")
    errors = getattr(report, "errors", None)
    if errors:
        print(f"  supervision errors: {errors}")
    # A claim overlapping the pass counts as during it.
    during = [lat * 1000 for t0, lat in claims if t0 <= t_end and t0 + lat >= t_start]
    outside = [lat * 1000 for t0, lat in claims if t0 > t_end or t0 + lat < t_start]
    seen = [(e, q) for t, e, q in waits if t_start <= t <= t_end]
    for e, q in sorted(set(seen))[:5]:
        print(f"  lock wait during the pass: {e}: {q}")
    out = [
        Sample(scenario, variant, "pass ms", w.seconds * 1000),
        Sample(scenario, variant, "statements", float(count)),
    ]
    for label, lat in (("during", during), ("outside", outside)):
        out += [
            Sample(scenario, variant, f"claim p50 {label} ms", percentile(lat, 50)),
            Sample(scenario, variant, f"claim p95 {label} ms", percentile(lat, 95)),
            Sample(scenario, variant, f"claim max {label} ms", max(lat, default=float("nan"))),
            Sample(scenario, variant, f"claims {label}", float(len(lat))),
        ]
    out.append(Sample(scenario, variant, "lock-wait samples during", float(len(seen))))
    return out


def supervision_variants(cfg: Config) -> list[Variant]:
    per_queue = cfg.size(10, 3)
    scenario = f"supervision: {SUP_QUEUES:,} queues at {cfg.schema_version}"
    return [
        Variant(
            scenario,
            "run_once(force=True)",
            lambda c: supervision_pass(c, per_queue),
            note=f"{per_queue} ready, {per_queue} expired active, {per_queue} old completed "
            "jobs per queue; a thread claiming 10 at a time on another queue",
        )
    ]


def variants(cfg: Config) -> list[Variant]:
    return scale_variants(cfg) + supervision_variants(cfg) + transactional_variants(cfg)
