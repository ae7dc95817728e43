"""The cost of a claim with group limits, against the same claim without.

    python -m bench.groups [--database-url URL] [--jobs N] [--groups G] [--reps R]
                           [--in-group-order]

On a fresh schema at 46, a backlog of ``N`` jobs spread over ``G`` groups (one job of
each group in turn, so a batch stays under the limit; ``--in-group-order``: each
group's jobs together, so a batch meets its group's limit at once) is drained by one loop of
``fetch(batch) -> complete_many`` in separate transactions, once without
``group_concurrency`` and once with ``group_concurrency=LIMIT``, alternately ``R``
times. It prints the median time per claim (the fetch's transaction, locks and
count included) and jobs per second for each. See bench/README.md, "Group concurrency".
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, migrate

from .common import DEFAULT_URL, Config, new_schema

QUEUE = "bench_groups"
LIMIT = 2
BATCH = 10


def load(cfg: Config, jobs: int, groups: int, *, in_group_order: bool) -> None:
    per_group = jobs // groups
    order = [(g, i) for g in range(groups) for i in range(per_group)]
    if not in_group_order:
        order.sort(key=lambda gi: (gi[1], gi[0]))
    with Session(cfg.engine) as session, session.begin():
        session.execute(text(f'TRUNCATE "{cfg.schema}".job'))
        QueueService(session, schema=cfg.schema).send_many(
            QUEUE, [{"data": {"i": i}, "group_id": f"g{g:04}"} for g, i in order]
        )
    with cfg.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'VACUUM ANALYZE "{cfg.schema}".job_common'))


def drain(cfg: Config, limits: Any) -> tuple[float, float, int]:
    """Claim and complete until empty; (median ms per claim, jobs/s, claims)."""
    claims: list[float] = []
    done = 0
    began = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        with Session(cfg.engine) as session, session.begin():
            jobs = QueueService(session, schema=cfg.schema).fetch(
                QUEUE, BATCH, group_concurrency=limits
            )
        claims.append(time.perf_counter() - t0)
        if not jobs:
            break
        with Session(cfg.engine) as session, session.begin():
            QueueService(session, schema=cfg.schema).complete_many(QUEUE, jobs)
        done += len(jobs)
    seconds = time.perf_counter() - began
    return statistics.median(claims) * 1000, done / seconds, len(claims)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("ALKSTORE_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--groups", type=int, default=50)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--in-group-order",
        action="store_true",
        help="send each group's jobs together (a batch then meets its limit at once)",
    )
    args = parser.parse_args()
    cfg = Config(args.database_url, new_schema(), quick=False, reps=args.reps, schema_version=46)
    migrate.upgrade(cfg.engine, cfg.schema, schema_version=46)
    try:
        with Session(cfg.engine) as session, session.begin():
            QueueService(session, schema=cfg.schema).create_queue(QUEUE)
        results: dict[str, list[tuple[float, float, int]]] = {"off": [], "on": []}
        for _ in range(args.reps):
            for label, limits in (("off", None), ("on", LIMIT)):
                load(cfg, args.jobs, args.groups, in_group_order=args.in_group_order)
                results[label].append(drain(cfg, limits))
        print(f"{args.jobs} jobs over {args.groups} groups, batch {BATCH}, limit {LIMIT}")
        for label, runs in results.items():
            ms = statistics.median(r[0] for r in runs)
            rate = statistics.median(r[1] for r in runs)
            claims = statistics.median(r[2] for r in runs)
            line = f"{ms:6.2f} ms/claim  {rate:8.0f} jobs/s  {claims:.0f} claims"
            print(f"group limits {label:>3}: {line}")
    finally:
        with cfg.engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{cfg.schema}" CASCADE'))
        cfg.close()


if __name__ == "__main__":
    main()
