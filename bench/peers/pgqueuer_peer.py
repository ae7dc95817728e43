"""The PgQueuer peer of ``python -m bench --peers``: a process driven over stdin/stdout.

``python -m bench.peers.pgqueuer_peer '{"dsn": "...", "entrypoint": "bench"}'`` with
``PGQUEUER_SCHEMA`` and ``PGQUEUER_PREFIX`` set by the caller, so PgQueuer installs its own
tables (and its NOTIFY channel) apart from everything else. The protocol is the one of
``bench/peers/pgboss.mjs``: first line ``{"ready": true}``, then one JSON command per line
(``drain``, ``latency``, ``send``, ``send_many``), one JSON answer per command.

PgQueuer's own worker is its ``QueueManager``: ``run(batch_size=10)`` (its default batch) with
the entrypoint's ``concurrency_limit=10``; it runs on uvloop when uvloop is installed, as
PgQueuer's ``pgq run`` command line does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from datetime import timedelta
from typing import Any

import asyncpg  # type: ignore[import-untyped]
from pgqueuer import AsyncpgDriver, Queries, QueueManager
from pgqueuer.models import Job

CONCURRENCY = 10
BATCH = 10
COMMANDS = frozenset({"drain", "latency", "send", "send_many"})


def _write(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


class Peer:
    """One PgQueuer installation and the commands the bench sends it."""

    def __init__(self, dsn: str, entrypoint: str) -> None:
        self.dsn, self.entrypoint = dsn, entrypoint

    async def open(self) -> None:
        self.conn = await asyncpg.connect(self.dsn)
        self.queries = Queries(AsyncpgDriver(self.conn))
        await self.queries.install()
        self.table = self.queries.qbe.settings.qualified.queue_table

    async def close(self) -> None:
        await self.conn.close()

    async def reset(self) -> None:
        """An empty, vacuumed queue table, as every measured segment of ours starts from."""
        await self.queries.clear_queue()
        await self.conn.execute(f"VACUUM ANALYZE {self.table}")

    async def remaining(self) -> int:
        return int(await self.conn.fetchval(f"SELECT count(*) FROM {self.table}"))

    async def prefill(self, n: int) -> None:
        for start in range(0, n, 1000):
            size = min(1000, n - start)
            payloads: list[bytes | None] = [
                json.dumps({"n": start + i}).encode() for i in range(size)
            ]
            await self.queries.enqueue([self.entrypoint] * size, payloads, [0] * size)
        await self.conn.execute(f"ANALYZE {self.table}")

    async def _manager(self, on_job: Any) -> tuple[QueueManager, asyncpg.Connection]:
        conn = await asyncpg.connect(self.dsn)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint(self.entrypoint, concurrency_limit=CONCURRENCY)
        async def handler(job: Job) -> None:
            on_job(job)

        return qm, conn

    async def drain(self, n: int) -> dict[str, Any]:
        await self.reset()
        await self.prefill(n)
        handled = 0
        all_handled = asyncio.Event()

        def on_job(job: Job) -> None:
            nonlocal handled
            handled += 1
            if handled >= n:
                all_handled.set()

        qm, conn = await self._manager(on_job)
        started = time.perf_counter()
        task = asyncio.create_task(qm.run(batch_size=BATCH))
        await all_handled.wait()
        # The handlers have run; their completions (a buffered delete) follow within 0.1 s.
        while await self.remaining():
            await asyncio.sleep(0.002)
        seconds = time.perf_counter() - started
        qm.shutdown.set()
        await task
        await conn.close()
        return {"jobs_per_s": n / seconds}

    async def latency(self, n: int, gap_ms: float) -> dict[str, Any]:
        await self.reset()
        committed: dict[int, float] = {}
        started: dict[int, float] = {}
        all_started = asyncio.Event()

        def on_job(job: Job) -> None:
            now = time.perf_counter()
            k = int(json.loads(job.payload or b"{}")["k"])
            started.setdefault(k, now)
            if len(started) >= n:
                all_started.set()

        qm, conn = await self._manager(on_job)
        task = asyncio.create_task(qm.run(batch_size=BATCH, dequeue_timeout=timedelta(seconds=30)))
        await asyncio.sleep(0.2)  # idle, listening
        for k in range(n):
            # One INSERT in autocommit: when it returns, it has committed.
            await self.queries.enqueue(self.entrypoint, json.dumps({"k": k}).encode())
            committed[k] = time.perf_counter()
            await asyncio.sleep(gap_ms / 1000)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_started.wait(), 10)
        qm.shutdown.set()
        await task
        await conn.close()
        return {
            "latencies_ms": [1000 * (started[k] - t) for k, t in committed.items() if k in started]
        }

    async def send(self, n: int) -> dict[str, Any]:
        await self.reset()
        for k in range(20):  # warm-up
            await self.queries.enqueue(self.entrypoint, json.dumps({"n": k}).encode())
        t0 = time.perf_counter()
        for k in range(n):
            await self.queries.enqueue(self.entrypoint, json.dumps({"n": k}).encode())
        return {"jobs_per_s": n / (time.perf_counter() - t0)}

    async def send_many(self, batches: int, size: int) -> dict[str, Any]:
        await self.reset()

        def make(b: int) -> list[bytes | None]:
            return [json.dumps({"n": b * size + i}).encode() for i in range(size)]

        names, priorities = [self.entrypoint] * size, [0] * size
        await self.queries.enqueue(names, make(0), priorities)  # warm-up
        all_batches = [make(b) for b in range(batches)]
        t0 = time.perf_counter()
        for payloads in all_batches:
            await self.queries.enqueue(names, payloads, priorities)
        return {"jobs_per_s": batches * size / (time.perf_counter() - t0)}


async def serve(config: dict[str, Any]) -> None:
    peer = Peer(config["dsn"], config.get("entrypoint", "bench"))
    try:
        await peer.open()
    except Exception as exc:
        _write({"fatal": repr(exc)})
        raise SystemExit(1) from exc
    _write({"ready": True})
    loop = asyncio.get_running_loop()
    try:
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            if not line.strip():
                continue
            request = json.loads(line)
            args = {k: v for k, v in request.items() if k != "cmd"}
            try:
                if request.get("cmd") not in COMMANDS:
                    raise ValueError(f"no command {request.get('cmd')!r}")
                _write(await getattr(peer, request["cmd"])(**args))
            except Exception as exc:
                _write({"error": repr(exc)})
    finally:
        await peer.close()


def main() -> None:
    config = json.loads(sys.argv[1])
    try:
        import uvloop
    except ImportError:
        asyncio.run(serve(config))
    else:
        uvloop.run(serve(config))


if __name__ == "__main__":
    main()
