"""``python -m bench --soak``: a worker's memory under a long, steady load.

A worker process (the threaded ``Worker`` or the ``AsyncWorker``, concurrency
10, no-op handler, default settings) drains one queue while this process sends
``--soak-rate`` jobs per second to it in batches of a tenth of a second. Every
``--soak-every`` seconds it records the worker's resident set size (``VmRSS``
from ``/proc``), the jobs it has completed and the backlog.

The first ``--soak-warmup`` seconds are warm-up (connection pools fill,
SQLAlchemy's statement cache fills); the baseline is the median RSS of the
minute after it. The worker's memory is *flat* when every later sample lies
within 10 % of that baseline. Nothing here is a pass/fail test: it is run by
hand and its numbers go to ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from alkstore_sa import QueueService

from .common import QUEUE, Config, median, sa_url

RESULTS = Path(__file__).resolve().parent / "results"
TOLERANCE = 0.10


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--soak", action="store_true", help="run the memory soak instead of the scenarios"
    )
    p.add_argument("--soak-minutes", type=float, default=30.0, help="default %(default)s")
    p.add_argument("--soak-rate", type=float, default=1000.0, help="jobs/s (default %(default)s)")
    p.add_argument("--soak-every", type=float, default=10.0, help="seconds between samples")
    p.add_argument("--soak-warmup", type=float, default=60.0, help="seconds of warm-up")
    p.add_argument(
        "--soak-worker", choices=("sync", "async"), default="sync", help="default %(default)s"
    )


def rss_kib(pid: int) -> int:
    """The resident set size of ``pid`` in KiB (Linux ``/proc``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def _noop(job: Any) -> None:
    return None


async def _anoop(job: Any) -> None:
    return None


def _sync_worker(url: str, schema: str, stop: Any) -> None:
    from alkstore_sa import Worker

    engine = create_engine(sa_url(url))
    worker = Worker(engine, schema=schema, concurrency=10)
    worker.register(QUEUE, _noop)
    worker.start()
    try:
        stop.wait()
    finally:
        worker.stop()
        engine.dispose()


def _async_worker(url: str, schema: str, stop: Any) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from alkstore_sa import AsyncWorker

    async def main() -> None:
        engine = create_async_engine(sa_url(url))
        worker = AsyncWorker(engine, schema=schema, concurrency=10)
        worker.register(QUEUE, _anoop)
        await worker.start()
        try:
            while not stop.is_set():
                await asyncio.sleep(0.2)
        finally:
            await worker.stop()
            await engine.dispose()

    asyncio.run(main())


def _counts(cfg: Config) -> tuple[int, int]:
    """(completed, backlog) of the soak queue."""
    with cfg.raw(autocommit=True) as conn:
        row = conn.execute(
            cfg.q(
                "SELECT count(*) FILTER (WHERE state = 'completed'), "
                "count(*) FILTER (WHERE state < 'active') FROM {s}.job WHERE name = %s"
            ),
            (QUEUE,),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _send(cfg: Config, rate: float, stop: threading.Event, sent: list[int]) -> None:
    """Send ``rate`` jobs/s in batches every 0.1 s, one transaction each, on schedule."""
    per_tick = max(1, round(rate / 10))
    tick = per_tick / rate
    due = time.monotonic()
    with Session(cfg.engine) as session:
        service = QueueService(session, schema=cfg.schema)
        n = 0
        while not stop.is_set():
            with session.begin():
                service.send_many(QUEUE, [{"data": {"n": n + i}} for i in range(per_tick)])
            n += per_tick
            sent[0] = n
            due += tick
            pause = due - time.monotonic()
            if pause > 0:
                stop.wait(pause)


def run(cfg: Config, args: argparse.Namespace) -> dict[str, Any]:
    """Run the soak and return its record (also printed as it goes)."""
    ctx = mp.get_context("spawn")
    stop_worker = ctx.Event()
    target = _sync_worker if args.soak_worker == "sync" else _async_worker
    proc = ctx.Process(target=target, args=(cfg.url, cfg.schema, stop_worker), daemon=True)
    proc.start()
    assert proc.pid is not None
    stop_sending = threading.Event()
    sent = [0]
    sender = threading.Thread(target=_send, args=(cfg, args.soak_rate, stop_sending, sent))
    samples: list[dict[str, float]] = []
    started = time.monotonic()
    sender.start()
    try:
        end = started + args.soak_minutes * 60
        while (now := time.monotonic()) < end:
            time.sleep(min(args.soak_every, max(0.0, end - now)))
            if not proc.is_alive():
                raise RuntimeError(f"the worker process died (exit code {proc.exitcode})")
            completed, backlog = _counts(cfg)
            s = {
                "t": round(time.monotonic() - started, 1),
                "rss_kib": rss_kib(proc.pid),
                "sent": sent[0],
                "completed": completed,
                "backlog": backlog,
            }
            samples.append(s)
            print(
                f"t={s['t']:7.1f}s rss={s['rss_kib'] / 1024:7.1f} MiB sent={s['sent']:>9,} "
                f"completed={completed:>9,} backlog={backlog:>7,}",
                flush=True,
            )
    finally:
        stop_sending.set()
        sender.join()
        stop_worker.set()
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return summarise(samples, args)


def summarise(samples: list[dict[str, float]], args: argparse.Namespace) -> dict[str, Any]:
    """Baseline (median RSS of the minute after warm-up), extremes after it, verdict."""
    warm = args.soak_warmup
    base = [s["rss_kib"] for s in samples if warm <= s["t"] < warm + 60]
    later = [s["rss_kib"] for s in samples if s["t"] >= warm]
    if not base or not later:
        raise RuntimeError("the soak was too short to have a baseline after its warm-up")
    baseline = median(base)
    lo, hi = min(later), max(later)
    last = samples[-1]
    elapsed = last["t"] - samples[0]["t"]
    rate = (last["completed"] - samples[0]["completed"]) / elapsed if elapsed else 0.0
    return {
        "worker": args.soak_worker,
        "minutes": args.soak_minutes,
        "offered_rate": args.soak_rate,
        "completed_rate": rate,
        "completed": last["completed"],
        "max_backlog": max(s["backlog"] for s in samples),
        "baseline_rss_mib": baseline / 1024,
        "min_rss_mib": lo / 1024,
        "max_rss_mib": hi / 1024,
        "deviation_pct": [100 * (lo / baseline - 1), 100 * (hi / baseline - 1)],
        "flat": lo >= baseline * (1 - TOLERANCE) and hi <= baseline * (1 + TOLERANCE),
        "samples": samples,
    }


def report(record: dict[str, Any], path: Path | None) -> Path:
    """Print the verdict and write the record as JSON."""
    lo, hi = record["deviation_pct"]
    print(
        f"\n{record['worker']} worker, {record['minutes']:g} min at {record['offered_rate']:g} "
        f"jobs/s offered: completed {record['completed']:,} ({record['completed_rate']:,.0f}/s), "
        f"max backlog {record['max_backlog']:,}\n"
        f"RSS baseline {record['baseline_rss_mib']:.1f} MiB, range "
        f"{record['min_rss_mib']:.1f}-{record['max_rss_mib']:.1f} MiB ({lo:+.1f} % / {hi:+.1f} %)"
        f": {'flat' if record['flat'] else 'NOT flat'} (tolerance ±{TOLERANCE:.0%})"
    )
    if path is None:
        RESULTS.mkdir(exist_ok=True)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
        path = RESULTS / f"soak-{record['worker']}-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    print(f"results: {path}")
    return path


__all__ = ["add_arguments", "report", "rss_kib", "run", "summarise"]
