"""Issue 25's schema-26 claim at scale: our claim against pg-boss 11.1.2's fetch, same rows.

``scale26: claim 10 of N ready`` (opt-in: ``--only "scale26:"``; our schema must be at 26,
the default ``--schema-version``): one queue of the bench's schema holds N ready jobs
(10,000, 100,000 and ``--scale-max``, 1,000,000), bulk-loaded once per run with
``INSERT ... SELECT generate_series`` (see :func:`.scale.bulk_load`). Each variant claims
10 jobs at a time, several times, and after every claim puts the claimed jobs back
(``state = 'created'``, ``started_on`` NULL: the row as it was), outside the timing, so
every claim of every variant sees the same backlog:

* ``pg-boss 11.1.2 fetch``: ``fetch(queue, {batchSize: 10})`` of a pg-boss 11.1.2 instance
  (``bench/peers/pgboss11.mjs``, Node on the PATH) pointed at the bench's schema with
  ``migrate``, ``supervise`` and ``schedule`` off, so it changes nothing but the rows it
  claims; timed in Node around the call.
* ``QueueService.fetch``: a ``Session``, ``fetch(queue, 10)``, ``commit()``.
* ``Worker claim (autocommit)``: the worker's claim, ``ops.fetch(..., autocommit=True)`` on
  an AUTOCOMMIT connection, as ``Worker`` runs it (one statement, no flush wait).

Reported per variant and round: the claims' median and p95 in ms; ours against pg-boss's
as the median of the per-round ratios. At the largest size the first round also prints
``EXPLAIN (ANALYZE, BUFFERS)`` of both statements (pg-boss's as pg-boss builds it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from alkstore_sa import QueueService
from alkstore_sa._engine_cache import execution_options
from alkstore_sa.ops import driver, working
from alkstore_sa.ops._core import Context

from .. import peers
from ..common import Config, Sample, percentile
from . import Variant
from .scale import top_up

BATCH = 10
PGBOSS = "pg-boss 11.1.2 fetch"
SERVICE = "QueueService.fetch"
WORKER = "Worker claim (autocommit)"

_loaded: set[tuple[str, str]] = set()
_explained: set[tuple[str, str]] = set()
_contexts: dict[str, Context] = {}


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def _queue(size: int) -> str:
    return f"s26_{size}"


def _ensure(cfg: Config, queue: str, size: int) -> None:
    """Load the queue's ``size`` ready jobs, once per run."""
    if (cfg.schema, queue) not in _loaded:
        seconds = top_up(cfg, queue, size)
        print(f"  loaded {size:,} ready jobs into {queue} in {seconds:.1f}s", flush=True)
        _loaded.add((cfg.schema, queue))


def _put_back(cfg: Config, queue: str, ids: list[Any]) -> None:
    """The claimed jobs ready again, as they were before the claim."""
    if not ids:
        raise RuntimeError(f"a claim on {queue} came back empty")
    cfg.exec(
        "UPDATE {s}.job SET state = 'created', started_on = NULL "
        "WHERE name = %s AND id = ANY(%s::uuid[])",
        (queue, [str(i) for i in ids]),
    )


def _service_claim(cfg: Config, queue: str) -> tuple[float, list[Any]]:
    with Session(cfg.engine) as session:
        t0 = time.perf_counter()
        jobs = QueueService(session, schema=cfg.schema).fetch(queue, BATCH)
        session.commit()
        seconds = time.perf_counter() - t0
    return seconds * 1000, [j.id for j in jobs]


def _worker_claim(cfg: Config, queue: str) -> tuple[float, list[Any]]:
    ctx = _contexts.setdefault(cfg.schema, Context(schema=cfg.schema, notify=False, version=26))
    auto = cfg.engine.execution_options(isolation_level="AUTOCOMMIT")
    options = execution_options(cfg.schema)
    t0 = time.perf_counter()
    with auto.connect() as conn:
        op = working.fetch(
            ctx, queue, BATCH, priority=True, ignore_start_after=False, autocommit=True
        )
        jobs = driver.run(conn, op, options, autocommit=True)
    return (time.perf_counter() - t0) * 1000, [j.id for j in jobs]


def _pgboss_claim(cfg: Config, queue: str) -> tuple[float, list[Any]]:
    answer = peers.peer(cfg, peers.PGBOSS11).call("fetch", queue=queue, batch=BATCH)
    return float(answer["ms"]), list(answer["ids"])


def _explain(cfg: Config, queue: str) -> None:
    """Print EXPLAIN (ANALYZE, BUFFERS) of our claim (the worker's statement, as built
    for a standard queue) and of pg-boss 11.1.2's fetch, each rolled back."""
    ctx = Context(schema=cfg.schema, notify=False, version=26)
    stmt = ctx.sql.claim(
        policy="standard", priority=True, ignore_start_after=False, relaxed=True, groups=None
    )
    params = {"qname": queue, "limit": BATCH, "cached_policy": "standard"}

    seen: list[tuple[str, Any]] = []

    def _capture(conn: Any, cursor: Any, text: str, parameters: Any, *args: Any) -> None:
        seen.append((text, parameters))

    with cfg.engine.connect() as conn:
        # The statement as SQLAlchemy hands it to psycopg (run once, rolled back), then
        # the same text and parameters under EXPLAIN on the driver's connection.
        event.listen(conn, "before_cursor_execute", _capture)
        try:
            conn.execution_options(**execution_options(cfg.schema)).execute(stmt, params).all()
        finally:
            event.remove(conn, "before_cursor_execute", _capture)
            conn.rollback()
        text, parameters = seen[-1]
        raw = conn.connection.driver_connection
        assert raw is not None
        lines = [r[0] for r in raw.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, parameters)]
        conn.rollback()
    theirs = peers.peer(cfg, peers.PGBOSS11).call("explain", queue=queue, batch=BATCH)
    for who, plan in (("ours (worker claim)", lines), ("pg-boss 11.1.2 fetch", theirs["plan"])):
        print(f"  EXPLAIN (ANALYZE, BUFFERS), {who}, {queue}:")
        for line in plan:
            print("    " + line)


def _variant(
    scenario: str,
    name: str,
    claim: Callable[[Config, str], tuple[float, list[Any]]],
    size: int,
    claims: int,
    base: str | None,
    explain: bool = False,
) -> Variant:
    queue = _queue(size)

    def run(c: Config) -> list[Sample]:
        _ensure(c, queue, size)
        if explain and (c.schema, queue) not in _explained:
            _explained.add((c.schema, queue))
            _explain(c, queue)
        ms = []
        for _ in range(claims):
            took, ids = claim(c, queue)
            _put_back(c, queue, ids)
            if len(ids) != BATCH:
                raise RuntimeError(f"{name} claimed {len(ids)} of {BATCH} on {queue}")
            ms.append(took)
        return [
            Sample(scenario, name, "p50 ms", percentile(ms, 50), {"claims": float(len(ms))}),
            Sample(scenario, name, "p95 ms", percentile(ms, 95)),
        ]

    return Variant(
        scenario,
        name,
        run,
        base,
        f"claims of {BATCH} on {size:,} ready jobs, each put back ({claims} per round)",
        ("<=", 1.1) if base else None,
        ("p50 ms",),
    )


def variants(cfg: Config) -> list[Variant]:
    if cfg.schema_version != 26:
        print("scale26: skipped, it needs our schema at 26 (--schema-version 26)")
        return []
    if (why := peers.missing(peers.PGBOSS11)) is not None:
        print(f"scale26: skipped, {why}")
        return []
    full = (10_000, 100_000, cfg.scale_max)
    sizes = sorted({s for s in cfg.size(full, (2_000, 20_000)) if s <= cfg.scale_max})
    out: list[Variant] = []
    for size in sizes:
        scenario = f"scale26: claim {BATCH} of {_label(size)} ready"
        claims = 20 if size <= 10_000 else 10 if size <= 100_000 else 5
        out += [
            _variant(scenario, PGBOSS, _pgboss_claim, size, claims, None, size == sizes[-1]),
            _variant(scenario, SERVICE, _service_claim, size, claims, PGBOSS),
            _variant(scenario, WORKER, _worker_claim, size, claims, PGBOSS),
        ]
    return out
