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
  the lock waits on our schema seen in ``pg_stat_activity`` during it. Beside it,
  interleaved, pg-boss 12.38's own pass (``supervise()``, every queue made due) over
  the same queues and jobs in its schema, under the same claiming thread; ours is
  compared with it (``pass ms``, target <= 1.0).
* ``drain transactional`` -- the same drain with a ``transactional=True`` handler
  (it gets the job's Session and writes nothing) against the no-op handler.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict
from typing import Any

from psycopg import sql
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session

from alkstore_sa import QueueService
from alkstore_sa.supervision import Supervisor
from alkstore_sa.worker import Worker

from .. import peers
from ..common import Config, Sample, Stopwatch, percentile, sa_url
from . import Variant

CONCURRENCY = 10
DRAINED = 10_000
"""Jobs drained per measurement, at every backlog size (the smallest backlog's size)."""

SUP_QUEUES = 1_000
SUP_CLAIM_QUEUE = "sup_claim"
_SUP_LIKE = {"p": "sup\\_q%"}

_LOAD_CHUNK = 100_000


def _columns(version: int) -> tuple[str, str]:
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
    if version >= 46:
        cols += ["heartbeat_seconds", "blocked", "blocking", "pending_dependencies"]
        vals += ["q.heartbeat_seconds", "false", "false", "0"]
    return ", ".join(cols), ", ".join(vals)


def bulk_load(
    cfg: Config, queue: str, count: int, *, schema: str | None = None, version: int | None = None
) -> None:
    """Insert ``count`` ready jobs into ``queue`` in SQL, 100,000 rows a statement (into
    ``schema`` at ``version``: ours by default)."""
    cols, vals = _columns(cfg.schema_version if version is None else version)
    statement = (
        f"INSERT INTO {{s}}.job ({cols}) SELECT {vals} "
        "FROM {s}.queue q, generate_series(1, %(n)s) g WHERE q.name = %(q)s"
    )
    with cfg.raw() as conn:
        left = count
        while left > 0:
            n = min(left, _LOAD_CHUNK)
            conn.execute(_q(schema or cfg.schema, statement), {"q": queue, "n": n})
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


def _q(schema: str, statement: str) -> sql.Composed:
    return sql.SQL(statement).format(s=sql.Identifier(schema))


def _exec(cfg: Config, schema: str, statement: str, params: Any = None) -> None:
    with cfg.raw(autocommit=True) as conn:
        conn.execute(_q(schema, statement), params)


def _seed_supervision(cfg: Config, schema: str, version: int, per_queue: int) -> None:
    """Per queue of ``schema``: ``per_queue`` ready jobs, as many expired active and old
    completed."""
    cols, vals = _columns(version)
    ready = (
        f"INSERT INTO {{s}}.job ({cols}) SELECT {vals} "
        "FROM {s}.queue q, generate_series(1, %(n)s) g WHERE q.name LIKE %(p)s"
    )
    mine = _SUP_LIKE
    _exec(cfg, schema, "DELETE FROM {s}.job WHERE name LIKE %(p)s", mine)
    _exec(cfg, schema, ready, {"n": per_queue * 3, **mine})
    # A third of them active past their expiry, a third completed long ago.
    _exec(
        cfg,
        schema,
        "UPDATE {s}.job SET state = 'active', expire_seconds = 1, "
        "started_on = now() - interval '1 hour' "
        "WHERE name LIKE %(p)s AND mod((data->>'n')::int, 3) = 1",
        mine,
    )
    _exec(
        cfg,
        schema,
        "UPDATE {s}.job SET state = 'completed', completed_on = now() - interval '30 days', "
        "keep_until = now() - interval '20 days' "
        "WHERE name LIKE %(p)s AND mod((data->>'n')::int, 3) = 2",
        mine,
    )
    _exec(cfg, schema, "VACUUM ANALYZE {s}.job")


def _drop_supervision_queues(cfg: Config, schema: str) -> None:
    """Delete the 1,000 queues, so that the next scenario's workers do not supervise them.

    Their jobs go first; the foreign-key checks of the queue rows are then skipped
    (``session_replication_role``): ``job.dead_letter`` has no index, so each deleted
    queue row would scan the whole job table, a million rows in the scale scenario.
    """
    with cfg.raw() as conn:
        conn.execute(_q(schema, "DELETE FROM {s}.job WHERE name LIKE %(p)s"), _SUP_LIKE)
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(_q(schema, "DELETE FROM {s}.queue WHERE name LIKE %(p)s"), _SUP_LIKE)
        conn.commit()


def _left_to_do(cfg: Config, schema: str) -> tuple[int, int]:
    """(old completed jobs, expired active jobs) of the 1,000 queues of ``schema``."""
    with cfg.raw(autocommit=True) as conn:
        row = conn.execute(
            _q(
                schema,
                "SELECT count(*) FILTER (WHERE state = 'completed'), "
                "count(*) FILTER (WHERE state = 'active') FROM {s}.job WHERE name LIKE %(p)s",
            ),
            _SUP_LIKE,
        ).fetchone()
    return (int(row[0]), int(row[1])) if row else (0, 0)


class _Load:
    """The load around a timed pass, the same for both systems: a thread claiming 10 jobs
    at a time (rolled back) on our ``sup_claim`` queue, and a sampler of lock waits on
    ``schema`` in ``pg_stat_activity``; :meth:`samples` splits the claims into those
    during the pass (``start`` to ``end``) and outside it."""

    def __init__(self, cfg: Config, schema: str) -> None:
        self.cfg, self.schema = cfg, schema
        self.stop = threading.Event()
        self.claims: list[tuple[float, float]] = []  # (start, latency s)
        self.waits: list[tuple[float, str, str]] = []
        self.threads = [
            threading.Thread(target=self._claimer),
            threading.Thread(target=self._sampler),
        ]

    def _claimer(self) -> None:
        cfg = self.cfg
        # Each claim is rolled back, so the queue never runs dry however long the pass.
        while not self.stop.is_set():
            t0 = time.perf_counter()
            with Session(cfg.engine) as session:
                QueueService(session, schema=cfg.schema).fetch(SUP_CLAIM_QUEUE, 10)
                session.rollback()
            self.claims.append((t0, time.perf_counter() - t0))

    def _sampler(self) -> None:
        probe = (
            "SELECT wait_event, left(query, 80) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database() "
            "AND position(%s in query) > 0 AND pid <> pg_backend_pid()"
        )
        with self.cfg.raw(autocommit=True) as conn:
            while not self.stop.is_set():
                now = time.perf_counter()
                for event, query in conn.execute(probe, (self.schema,)).fetchall():
                    self.waits.append((now, str(event), str(query)))
                time.sleep(0.005)

    def __enter__(self) -> _Load:
        for t in self.threads:
            t.start()
        time.sleep(1.5)  # claims outside the pass, before it
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            time.sleep(1.5)  # and after it
        self.stop.set()
        for t in self.threads:
            t.join()

    def samples(self, scenario: str, variant: str, start: float, end: float) -> list[Sample]:
        claims = self.claims
        # A claim overlapping the pass counts as during it.
        during = [lat * 1000 for t0, lat in claims if t0 <= end and t0 + lat >= start]
        outside = [lat * 1000 for t0, lat in claims if t0 > end or t0 + lat < start]
        seen = [(e, q) for t, e, q in self.waits if start <= t <= end]
        for e, q in sorted(set(seen))[:5]:
            print(f"  lock wait during the pass: {e}: {q}")
        out = []
        for label, lat in (("during", during), ("outside", outside)):
            out += [
                Sample(scenario, variant, f"claim p50 {label} ms", percentile(lat, 50)),
                Sample(scenario, variant, f"claim p95 {label} ms", percentile(lat, 95)),
                Sample(scenario, variant, f"claim max {label} ms", max(lat, default=float("nan"))),
                Sample(scenario, variant, f"claims {label}", float(len(lat))),
            ]
        out.append(Sample(scenario, variant, "lock-wait samples during", float(len(seen))))
        return out


def _sup_scenario(cfg: Config) -> str:
    return f"supervision: {SUP_QUEUES:,} queues at {cfg.schema_version}"


SUP_OURS = "run_once(force=True)"
SUP_PGBOSS = "pg-boss 12.38 supervise()"


def supervision_pass(cfg: Config, per_queue: int) -> list[Sample]:
    scenario = _sup_scenario(cfg)
    variant = SUP_OURS
    names = [f"sup_q{i:04d}" for i in range(SUP_QUEUES)]
    _ensure_queues(cfg, names)
    _seed_supervision(cfg, cfg.schema, cfg.schema_version, per_queue)
    top_up(cfg, SUP_CLAIM_QUEUE, 50_000)
    todo = _left_to_do(cfg, cfg.schema)

    # The supervisor on an engine of its own, whose statements are counted and timed.
    engine = create_engine(sa_url(cfg.url), pool_size=2)
    statements: dict[str, list[float]] = defaultdict(list)
    started: dict[int, float] = {}
    transactions = [0]

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        started[id(cursor)] = time.perf_counter()

    @event.listens_for(engine, "after_cursor_execute")
    def _after(conn: Any, cursor: Any, text: str, *args: Any) -> None:
        key = " ".join(text.split())[:70]
        statements[key].append(time.perf_counter() - started.pop(id(cursor), 0.0))

    @event.listens_for(engine, "begin")
    def _begin(conn: Any) -> None:
        transactions[0] += 1

    supervisor = Supervisor(engine, schema=cfg.schema)
    try:
        with _Load(cfg, cfg.schema) as load, Stopwatch() as w:
            t_start = time.perf_counter()
            report = supervisor.run_once(force=True)
            t_end = time.perf_counter()
    finally:
        engine.dispose()
        left = _left_to_do(cfg, cfg.schema)
        _drop_supervision_queues(cfg, cfg.schema)
    count = sum(len(v) for v in statements.values())
    print(
        f"  the pass ran {count:,} statements in {transactions[0]:,} transactions "
        f"(old completed, expired active: {todo} before, {left} after); "
        "the dearest kinds (count, total s):"
    )
    for key, times in sorted(statements.items(), key=lambda kv: -sum(kv[1]))[:6]:
        print(f"    {len(times):6,} {sum(times):7.2f}  {key}")
    errors = getattr(report, "errors", None)
    if errors:
        print(f"  supervision errors: {errors}")
    return [
        Sample(scenario, variant, "pass ms", w.seconds * 1000),
        Sample(scenario, variant, "statements", float(count)),
        # psycopg sends BEGIN and COMMIT as round trips of their own.
        Sample(scenario, variant, "round trips", float(count + 2 * transactions[0])),
        Sample(scenario, variant, "transactions", float(transactions[0])),
        *load.samples(scenario, variant, t_start, t_end),
    ]


def pgboss_supervision_pass(cfg: Config, per_queue: int) -> list[Sample]:
    """pg-boss 12.38's own pass (``supervise()``) over the same 1,000 queues and jobs in its
    schema, under the same load (a thread claiming on our schema)."""
    scenario = _sup_scenario(cfg)
    variant = SUP_PGBOSS
    boss = peers.peer(cfg, peers.PGBOSS)
    names = [f"sup_q{i:04d}" for i in range(SUP_QUEUES)]
    boss.call("create_queues", names=[*names, SUP_CLAIM_QUEUE])
    _seed_supervision(cfg, boss.schema, 46, per_queue)
    _exec(cfg, boss.schema, "DELETE FROM {s}.job WHERE name = %s", (SUP_CLAIM_QUEUE,))
    bulk_load(cfg, SUP_CLAIM_QUEUE, 50_000, schema=boss.schema, version=46)
    _exec(cfg, boss.schema, "VACUUM ANALYZE {s}.job")
    top_up(cfg, SUP_CLAIM_QUEUE, 50_000)  # our claimer's queue, as in our pass
    todo = _left_to_do(cfg, boss.schema)
    try:
        with _Load(cfg, boss.schema) as load:
            t_start = time.perf_counter()
            got = boss.call("supervise")
            t_end = time.perf_counter()
    finally:
        left = _left_to_do(cfg, boss.schema)
        _drop_supervision_queues(cfg, boss.schema)
    print(
        f"  pg-boss's pass: {got['statements']:,} statements, {got['round_trips']:,} round "
        f"trips, {got['transactions']:,} transactions "
        f"(old completed, expired active: {todo} before, {left} after)"
    )
    return [
        Sample(scenario, variant, "pass ms", float(got["seconds"]) * 1000),
        Sample(scenario, variant, "statements", float(got["statements"])),
        Sample(scenario, variant, "round trips", float(got["round_trips"])),
        Sample(scenario, variant, "transactions", float(got["transactions"])),
        *load.samples(scenario, variant, t_start, t_end),
    ]


def supervision_variants(cfg: Config) -> list[Variant]:
    per_queue = cfg.size(10, 3)
    scenario = _sup_scenario(cfg)
    with_peer = peers.missing(peers.PGBOSS) is None
    if not with_peer:
        print(f"note: {SUP_PGBOSS} skipped: {peers.missing(peers.PGBOSS)}", file=sys.stderr)
    shape = (
        f"{per_queue} ready, {per_queue} expired active, {per_queue} old completed "
        "jobs per queue; a thread claiming 10 at a time on another queue"
    )
    out = [
        Variant(
            scenario,
            SUP_OURS,
            lambda c: supervision_pass(c, per_queue),
            SUP_PGBOSS if with_peer else None,
            note=shape,
            target=("<=", 1.0) if with_peer else None,
            target_metrics=("pass ms",),
        )
    ]
    if with_peer:
        out.append(
            Variant(
                scenario,
                SUP_PGBOSS,
                lambda c: pgboss_supervision_pass(c, per_queue),
                note=shape + " (in pg-boss's schema; the claims on ours)",
            )
        )
    return out


def variants(cfg: Config) -> list[Variant]:
    return scale_variants(cfg) + supervision_variants(cfg) + transactional_variants(cfg)
