"""CPU per job of a draining worker: ``python -m bench.cpu [sync|async] [--jobs N] ...``.

Drains ``--jobs`` pre-filled no-op jobs with a ``Worker`` (or ``AsyncWorker``) at its
default settings, ``--reps`` times, each on a fresh job table, and prints the drain
rate and the process's CPU time (user + system, every thread: fetch loop, runners,
completer, keeper, supervisor, listener) divided by the jobs drained. The jobs are
inserted by the server (``INSERT ... SELECT``), so the client's share of that is
small; it is counted too. Run it at two commits back to back to compare them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
from typing import Any

from .common import DEFAULT_URL, QUEUE, Config, drop, install, new_schema, preload, reset
from .scenarios import drain


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu", description=__doc__)
    parser.add_argument("flavour", choices=["sync", "async"], nargs="?", default="sync")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=drain.CONCURRENCY)
    parser.add_argument("--schema-version", type=int, choices=[26, 46], default=46)
    parser.add_argument("--settings", default="{}", help="worker options as JSON")
    parser.add_argument("--database-url", default=DEFAULT_URL)
    args = parser.parse_args(argv)
    settings: dict[str, Any] = json.loads(args.settings)
    cfg = Config(
        args.database_url, new_schema(), True, args.reps, schema_version=args.schema_version
    )
    install(cfg)
    try:
        for _ in range(args.reps):
            reset(cfg)

            def prepare() -> None:
                preload(cfg, QUEUE, args.jobs)

            before = _cpu()
            if args.flavour == "sync":
                rate = drain.worker_sync(cfg, args.jobs, settings, prepare, None, args.concurrency)
            else:
                rate = asyncio.run(
                    drain.worker_async(cfg, args.jobs, settings, prepare, None, args.concurrency)
                )
            cpu_us = (_cpu() - before) * 1e6 / args.jobs
            print(
                f"{args.flavour} c={args.concurrency} {settings or 'defaults'} at "
                f"{args.schema_version}: {rate:,.0f} jobs/s, {cpu_us:.0f} us of CPU per job",
                flush=True,
            )
    finally:
        drop(cfg)
        cfg.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
