"""The peer scenarios (``python -m bench --peers``): pg-boss 12.38 and PgQueuer beside us.

Interleaved per round with the ceiling and our ``Worker``/``AsyncWorker``, as every
other scenario:

- ``peers: drain c=10``: 10,000 pre-filled no-op jobs (3,000 with ``--quick``) drained
  by each system's own worker at concurrency 10 with its default batch or the
  equivalent: ours at their defaults (batch = concurrency = 10), PgQueuer's
  ``QueueManager`` at its default ``batch_size=10``, pg-boss with ``localConcurrency:
  10, batchSize: 10, burstWhenBatchFull: true`` (its default batch of 1 polls every
  2 s after each fetch); the ceiling is 10 threads fetching 10 at a time.
- ``peers: pickup latency``: an idle worker (same settings), jobs sent one per
  transaction 20 ms apart; latency = handler start - the sender's commit returned,
  one clock per process. pg-boss runs with ``useListenNotify`` and a ``notify`` queue
  (without them it only polls, every 2 s); PgQueuer and we LISTEN by default.
- ``peers: send 1 job/tx`` and ``peers: send_many 1000/tx``: committed enqueues, one
  job per transaction and 1,000 per transaction (pg-boss ``send`` / ``insert``,
  PgQueuer ``enqueue`` with a scalar / with lists). Our async ``send_many`` is compared
  with our sync one (its "vs" column), not with the ceiling.

Peers are compared with the ceiling; ours with the ceiling and with the best peer
(see ``run.summarise``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .. import peers
from ..common import QUEUE, Config, Sample, percentile, preload, reset
from . import Variant, drain, latency, send

CEILING = "ceiling"
DRAIN = "peers: drain c=10"
PICKUP = "peers: pickup latency"
PGBOSS_IN_FLIGHT = 100
"""Jobs pg-boss's worker here holds at once: localConcurrency 10 x batchSize 10."""
IN_FLIGHT_SYNC = f"Worker c={PGBOSS_IN_FLIGHT}"
IN_FLIGHT_ASYNC = f"AsyncWorker c={PGBOSS_IN_FLIGHT}"
SEND1 = "peers: send 1 job/tx"
SEND1000 = "peers: send_many 1000/tx"


def _jobs(
    scenario: str, name: str, fn: Callable[[Config], float]
) -> Callable[[Config], list[Sample]]:
    return lambda cfg: [Sample(scenario, name, "jobs/s", fn(cfg))]


def _latency_samples(name: str, lat: list[float], n: int) -> list[Sample]:
    if len(lat) < n:
        raise RuntimeError(f"{name}: only {len(lat)} of {n} jobs were picked up")
    return [
        Sample(PICKUP, name, f"p{p} ms", percentile(lat, p), {"jobs": float(len(lat))})
        for p in (50, 95, 99)
    ]


# ------------------------------------------------------------------ ours and the ceiling


def _drain_ceiling(n: int) -> Callable[[Config], float]:
    def run(cfg: Config) -> float:
        reset(cfg)
        preload(cfg, QUEUE, n)
        rate = drain.ceiling_sync(cfg, n, 10)
        drain._check(cfg, n)
        return rate

    return run


def _drain_worker(
    n: int, *, asynchronous: bool, concurrency: int = drain.CONCURRENCY
) -> Callable[[Config], float]:
    def run(cfg: Config) -> float:
        import asyncio

        reset(cfg)

        def prepare() -> None:
            preload(cfg, QUEUE, n)

        if asynchronous:
            rate = asyncio.run(drain.worker_async(cfg, n, {}, prepare, None, concurrency))
        else:
            rate = drain.worker_sync(cfg, n, {}, prepare, None, concurrency)
        drain._check(cfg, n)
        return rate

    return run


def _pickup(body: Callable[[Config, int], latency.Clock], name: str, n: int) -> Any:
    def run(cfg: Config) -> list[Sample]:
        reset(cfg)
        return _latency_samples(name, body(cfg, n).latencies_ms(), n)

    return run


def _send(body: Any, n_batches: int, size: int) -> Callable[[Config], float]:
    timed = send._timed(body, n_batches, size)

    def run(cfg: Config) -> float:
        reset(cfg)
        return timed(cfg)

    return run


def _asend(n: int, size: int = 1) -> Callable[[Config], float]:
    timed = send._atimed("alkstore", n, size)

    def run(cfg: Config) -> float:
        reset(cfg)
        return timed(cfg)

    return run


# ------------------------------------------------------------------ peers


def _peer_jobs(name: str, cmd: str, **args: Any) -> Callable[[Config], float]:
    return lambda cfg: float(peers.peer(cfg, name).call(cmd, **args)["jobs_per_s"])


def _peer_pickup(name: str, n: int) -> Callable[[Config], list[Sample]]:
    def run(cfg: Config) -> list[Sample]:
        got = peers.peer(cfg, name).call("latency", n=n, gap_ms=latency.GAP * 1000)
        return _latency_samples(name, [float(x) for x in got["latencies_ms"]], n)

    return run


def available() -> list[str]:
    """The peers that can run here; a note on stderr for each that cannot."""
    out = []
    for name in (peers.PGBOSS, peers.PGQUEUER):
        why = peers.missing(name)
        if why:
            print(f"note: peer {name} skipped: {why}", file=sys.stderr)
        else:
            out.append(name)
    return out


def variants(cfg: Config) -> list[Variant]:
    names = available()
    n_drain = cfg.size(10_000, 3_000)
    n_pickup = cfg.size(150, 40)
    rounds = cfg.size(5, 2)
    n_send = cfg.size(1500, 200) // rounds
    n_many = max(1, cfg.size(60_000, 6_000) // 1000 // rounds)
    drain_goal = (("jobs/s", ">=", 1.2),)
    pickup_goal = (("p50 ms", "<=", 1.0), ("p95 ms", "<=", 1.2))
    many_goal = (("jobs/s", ">=", 0.9),)

    def ceiling(scenario: str, run: Callable[[Config], list[Sample]], r: int = 1) -> Variant:
        return Variant(scenario, CEILING, run, rounds=r, kind="ceiling")

    def ours(
        scenario: str,
        name: str,
        run: Callable[[Config], list[Sample]],
        goals: tuple[tuple[str, str, float], ...] = (),
        r: int = 1,
    ) -> Variant:
        return Variant(scenario, name, run, CEILING, rounds=r, kind="ours", peer_targets=goals)

    def peer(
        scenario: str, name: str, run: Callable[[Config], list[Sample]], r: int = 1
    ) -> Variant:
        return Variant(scenario, name, run, CEILING, rounds=r, kind="peer")

    out = [
        ceiling(DRAIN, _jobs(DRAIN, CEILING, _drain_ceiling(n_drain))),
        ours(
            DRAIN,
            "Worker",
            _jobs(DRAIN, "Worker", _drain_worker(n_drain, asynchronous=False)),
            drain_goal,
        ),
        ours(
            DRAIN,
            "AsyncWorker",
            _jobs(DRAIN, "AsyncWorker", _drain_worker(n_drain, asynchronous=True)),
            drain_goal,
        ),
    ]
    # pg-boss's worker here holds 100 jobs in flight (10 loops, each handed a batch
    # of 10); ours at the same number in flight, per-job handlers still:
    for name, asynchronous in ((IN_FLIGHT_SYNC, False), (IN_FLIGHT_ASYNC, True)):
        fn = _drain_worker(n_drain, asynchronous=asynchronous, concurrency=PGBOSS_IN_FLIGHT)
        out.append(ours(DRAIN, name, _jobs(DRAIN, name, fn), drain_goal))
    out += [peer(DRAIN, p, _jobs(DRAIN, p, _peer_jobs(p, "drain", n=n_drain))) for p in names]

    out += [
        ceiling(PICKUP, _pickup(latency.run_ceiling, CEILING, n_pickup)),
        ours(
            PICKUP,
            "Worker",
            _pickup(lambda c, n: latency.run_worker(c, n, 10), "Worker", n_pickup),
            pickup_goal,
        ),
        ours(
            PICKUP,
            "AsyncWorker",
            _pickup(lambda c, n: latency.run_async_worker(c, n, 10), "AsyncWorker", n_pickup),
            pickup_goal,
        ),
    ]
    out += [peer(PICKUP, p, _peer_pickup(p, n_pickup)) for p in names]

    out += [
        ceiling(SEND1, _jobs(SEND1, CEILING, _send(send.ceiling_sync, n_send, 1)), rounds),
        ours(
            SEND1,
            "alkstore sync",
            _jobs(SEND1, "alkstore sync", _send(send.alkstore_sync, n_send, 1)),
            r=rounds,
        ),
        ours(SEND1, "alkstore async", _jobs(SEND1, "alkstore async", _asend(n_send)), r=rounds),
    ]
    out += [peer(SEND1, p, _jobs(SEND1, p, _peer_jobs(p, "send", n=n_send)), rounds) for p in names]

    out += [
        ceiling(SEND1000, _jobs(SEND1000, CEILING, _send(send.ceiling_sync, n_many, 1000)), rounds),
        ours(
            SEND1000,
            "alkstore sync",
            _jobs(SEND1000, "alkstore sync", _send(send.alkstore_sync, n_many, 1000)),
            many_goal,
            rounds,
        ),
        # Compared with our sync send_many (target >= 0.95), and with the best peer.
        Variant(
            SEND1000,
            "alkstore async",
            _jobs(SEND1000, "alkstore async", _asend(n_many, 1000)),
            "alkstore sync",
            target=(">=", 0.95),
            rounds=rounds,
            kind="ours",
            peer_targets=many_goal,
        ),
    ]
    out += [
        peer(
            SEND1000,
            p,
            _jobs(SEND1000, p, _peer_jobs(p, "send_many", batches=n_many, size=1000)),
            rounds,
        )
        for p in names
    ]
    return out
