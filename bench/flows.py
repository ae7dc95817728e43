"""Flows at schema 46: what sending a flow and releasing its children cost.

``python -m bench.flows [--database-url URL] [--reps N]``

- ``flow of 100 jobs``: one committed transaction per ``QueueService.flow`` of 100
  jobs (10 roots, 90 children with 1 to 3 parents among them), beside ``send_many``
  of 100 plain jobs in the same queue, interleaved;
- ``release 10,000 parents``: 10,000 completed parents (each with one child, sent
  as flows of 1,000 pairs), released by one supervision pass (the flow turn, 10
  statements of 1,000 parents), beside the same pass with nothing to release.

Results in bench/README.md ("Flows").
"""

from __future__ import annotations

import argparse
import os
import time

from sqlalchemy import text
from sqlalchemy.orm import Session

from alkstore_sa import FlowJob, JobSpec, QueueService, migrate
from alkstore_sa.supervision import Supervisor

from .common import DEFAULT_URL, median, new_schema, sa_url


def flow_of_100(queue: str) -> list[FlowJob]:
    jobs: list[FlowJob] = [{"ref": f"r{i}", "name": queue} for i in range(10)]
    for i in range(90):
        parents = sorted({f"r{i % 10}", f"r{(i * 3) % 10}", f"r{(i * 7) % 10}"})
        jobs.append({"ref": f"c{i}", "name": queue, "data": {"i": i}, "depends_on": parents})
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--database-url", default=os.environ.get("ALKSTORE_DATABASE_URL", DEFAULT_URL)
    )
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    from sqlalchemy import create_engine

    engine = create_engine(sa_url(args.database_url))
    schema = new_schema()
    migrate.upgrade(engine, schema, schema_version=46)
    try:
        with Session(engine) as s, s.begin():
            QueueService(s, schema=schema).create_queue("flows")

        def reset() -> None:
            with engine.begin() as conn:
                conn.execute(text(f'DELETE FROM "{schema}".job'))
                conn.execute(text(f'DELETE FROM "{schema}".job_dependency'))
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text(f'VACUUM ANALYZE "{schema}".job_common'))

        graph = flow_of_100("flows")
        plain: list[JobSpec] = [{"data": {"i": i}} for i in range(100)]
        flow_ms: list[float] = []
        send_ms: list[float] = []
        for _ in range(args.reps):
            reset()
            for _ in range(50):
                t = time.perf_counter()
                with Session(engine) as s, s.begin():
                    QueueService(s, schema=schema).flow(graph)
                flow_ms.append((time.perf_counter() - t) * 1000)
                t = time.perf_counter()
                with Session(engine) as s, s.begin():
                    QueueService(s, schema=schema).send_many("flows", plain)
                send_ms.append((time.perf_counter() - t) * 1000)
        print(
            f"flow of 100 jobs (234 dependencies): {median(flow_ms):.1f} ms per transaction; "
            f"send_many of 100: {median(send_ms):.1f} ms"
        )

        supervisor = Supervisor(engine, schema=schema, schedule=False, bam=False)
        release_ms: list[float] = []
        idle_ms: list[float] = []
        for _ in range(args.reps):
            reset()
            for chunk in range(10):
                pairs: list[FlowJob] = []
                for i in range(1000):
                    n = chunk * 1000 + i
                    pairs.append({"ref": f"p{n}", "name": "flows"})
                    pairs.append({"ref": f"c{n}", "name": "flows", "depends_on": [f"p{n}"]})
                with Session(engine) as s, s.begin():
                    QueueService(s, schema=schema).flow(pairs)
            with engine.begin() as conn:
                conn.execute(
                    text(
                        f"UPDATE \"{schema}\".job SET state = 'completed', "
                        "started_on = now(), completed_on = now() WHERE blocking"
                    )
                )
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text(f'VACUUM ANALYZE "{schema}".job_common'))
            t = time.perf_counter()
            report = supervisor.run_once(force=True)
            release_ms.append((time.perf_counter() - t) * 1000)
            assert report.released == 10_000, report
            t = time.perf_counter()
            supervisor.run_once(force=True)
            idle_ms.append((time.perf_counter() - t) * 1000)
        print(
            f"supervision pass releasing 10,000 children of 10,000 completed parents: "
            f"{median(release_ms):.0f} ms; the same pass with nothing to release: "
            f"{median(idle_ms):.0f} ms"
        )
    finally:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        engine.dispose()


if __name__ == "__main__":
    main()
