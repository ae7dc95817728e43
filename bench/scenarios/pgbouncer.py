"""Pickup latency behind PgBouncer, against the same worker connected directly.

The latency scenario's measure (an idle ``Worker``, jobs sent one per transaction about
20 ms apart, from the sender's commit to the handler's start), with the worker's and the
senders' engine pointing at a PgBouncer the bench starts for each repetition
(:func:`alkstore_sa.testing.pgbouncer.run_pgbouncer`; skipped when ``pgbouncer`` is not
installed):

- ``Worker direct``: no PgBouncer, the reference;
- ``transaction pooling, listen_dsn direct``: the engine through transaction pooling, the
  worker listening on a direct connection (``listen_dsn``), as docs/how-to/pgbouncer.md
  advises; its goal is within 2x of the reference;
- ``transaction pooling, no listen URL``: the same without ``listen_dsn``: notifications do
  not reach the worker, which picks jobs up when it polls (every 2 s by default);
- ``session pooling``: ``LISTEN`` works as on a direct connection.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from alkstore_sa.testing.pgbouncer import (
    PgBouncerUnavailableError,
    pgbouncer_program,
    run_pgbouncer,
)

from ..common import Config, Sample, libpq_url, reset
from . import Variant, latency

SCENARIO = "pickup behind PgBouncer"
DIRECT = "Worker direct"


@contextmanager
def _through(cfg: Config, mode: str | None) -> Iterator[Config]:
    """``cfg`` with its engine through a PgBouncer in ``mode`` (``None``: as it is)."""
    if mode is None:
        yield cfg
        return
    with run_pgbouncer(libpq_url(cfg.url), mode) as url:
        pooled = dataclasses.replace(cfg, url=url)  # its own engine, through PgBouncer
        try:
            yield pooled
        finally:
            pooled.engine.dispose()


def _variant(name: str, mode: str | None, listen_direct: bool, n: int) -> Variant:
    def run(cfg: Config) -> list[Sample]:
        reset(cfg)
        settings: dict[str, Any] = {"listen_dsn": libpq_url(cfg.url)} if listen_direct else {}
        with _through(cfg, mode) as through:
            clock = latency.run_worker(through, n, settings=settings)
        return latency.samples(SCENARIO, name, clock)

    base = None if mode is None else DIRECT
    goal = ("<=", 2.0) if listen_direct else None
    notes = {
        "transaction": "polls: wake-ups do not pass transaction pooling",
        "session": "LISTEN through PgBouncer as well: one more hop each way",
    }
    note = "" if mode is None or listen_direct else notes[mode]
    return Variant(SCENARIO, name, run, base, note=note, target=goal)


def variants(cfg: Config) -> list[Variant]:
    try:
        pgbouncer_program()
    except PgBouncerUnavailableError as exc:
        print(f"{SCENARIO}: skipped ({exc})")
        return []
    n = cfg.size(100, 20)
    specs: list[tuple[str, str | None, bool]] = [
        (DIRECT, None, False),
        ("transaction pooling, listen_dsn direct", "transaction", True),
        ("transaction pooling, no listen URL", "transaction", False),
        ("session pooling", "session", False),
    ]
    return [_variant(name, mode, listen, n) for name, mode, listen in specs]
