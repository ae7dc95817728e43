"""The HTTP API (docs/how-to/http-api.md) against the service it serves.

``alkstore api`` runs in a process of its own, as a service in another runtime would reach
it, and a client with one kept-alive connection calls it one request at a time. The
reference is the same work done by ``QueueService`` in this process, one transaction per
call, so the ratio is what JSON over HTTP adds to each call:

- ``api send``: one job per request (``/api/send``) against ``QueueService.send`` in a
  transaction each;
- ``api fetch+complete b=10``: claim 10 and settle them fenced (``/api/fetch``, then
  ``/api/complete_many`` with each job's ``started_on``), against the same two calls of
  the service, until the queue is empty.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, Settlement

from ..common import QUEUE, Config, Sample, Stopwatch, preload, reset
from . import Variant

TOKEN = "bench-" + "t" * 32
SEND = "api send"
DRAIN = "api fetch+complete b=10"


@contextmanager
def _served(cfg: Config) -> Iterator[httpx.Client]:
    """``alkstore api`` on a free loopback port, and a client of it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    env["ALKSTORE_API_TOKENS"] = TOKEN
    argv = [sys.executable, "-m", "alkstore_sa.cli", "api", "--database-url", cfg.url]
    server = subprocess.Popen(
        [*argv, "--schema", cfg.schema, "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    headers = {"authorization": f"Bearer {TOKEN}"}
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=30)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.get("/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("alkstore api did not start")
            time.sleep(0.05)
        yield client
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=30)


def _call(client: httpx.Client, operation: str, body: dict[str, Any]) -> Any:
    answer = client.post(f"/api/{operation}", json=body).json()
    if not answer["ok"]:
        raise RuntimeError(f"{operation}: {answer['detail']}")
    return answer["result"]


def _send_http(cfg: Config, n: int) -> float:
    with _served(cfg) as client, Stopwatch() as w:
        for i in range(n):
            _call(client, "send", {"name": QUEUE, "data": {"n": i}})
    return n / w.seconds


def _send_direct(cfg: Config, n: int) -> float:
    with Stopwatch() as w:
        for i in range(n):
            with Session(cfg.engine) as session, session.begin():
                QueueService(session, schema=cfg.schema).send(QUEUE, {"n": i})
    return n / w.seconds


def _drain_http(cfg: Config, n: int) -> float:
    done = 0
    with _served(cfg) as client, Stopwatch() as w:
        while jobs := _call(client, "fetch", {"name": QUEUE, "batch_size": 10}):
            items = [{"id": j["id"], "started_on": j["started_on"]} for j in jobs]
            done += len(_call(client, "complete_many", {"name": QUEUE, "items": items})["affected"])
    if done != n:
        raise AssertionError(f"{done} of {n} jobs completed")
    return n / w.seconds


def _drain_direct(cfg: Config, n: int) -> float:
    done = 0
    with Stopwatch() as w:
        while True:
            with Session(cfg.engine) as session, session.begin():
                service = QueueService(session, schema=cfg.schema)
                jobs = service.fetch(QUEUE, 10)
            if not jobs:
                break
            with Session(cfg.engine) as session, session.begin():
                service = QueueService(session, schema=cfg.schema)
                items = [Settlement(j.id, None, j.started_on) for j in jobs]
                done += len(service.complete_many(QUEUE, items).affected)
    if done != n:
        raise AssertionError(f"{done} of {n} jobs completed")
    return n / w.seconds


def variants(cfg: Config) -> list[Variant]:
    n = cfg.size(600, 150)
    drained = cfg.size(3000, 600)

    def send_http(cfg: Config) -> list[Sample]:
        reset(cfg)
        return [Sample(SEND, "HTTP API", "jobs/s", _send_http(cfg, n))]

    def send_direct(cfg: Config) -> list[Sample]:
        reset(cfg)
        return [Sample(SEND, "QueueService", "jobs/s", _send_direct(cfg, n))]

    def drain_http(cfg: Config) -> list[Sample]:
        reset(cfg)
        preload(cfg, QUEUE, drained)
        return [Sample(DRAIN, "HTTP API", "jobs/s", _drain_http(cfg, drained))]

    def drain_direct(cfg: Config) -> list[Sample]:
        reset(cfg)
        preload(cfg, QUEUE, drained)
        return [Sample(DRAIN, "QueueService", "jobs/s", _drain_direct(cfg, drained))]

    note = "one request at a time on a kept-alive connection to alkstore api in its own process"
    return [
        Variant(SEND, "QueueService", send_direct),
        Variant(SEND, "HTTP API", send_http, "QueueService", note),
        Variant(DRAIN, "QueueService", drain_direct),
        Variant(DRAIN, "HTTP API", drain_http, "QueueService", note),
    ]
