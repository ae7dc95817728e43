"""Run a call that must wait on another client's open transaction, without timing.

The call runs on a thread; the other client's transaction is committed only once the
call is seen waiting for it (read from ``pg_blocking_pids``), so the test proves the
wait happened instead of hoping a sleep was long enough.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine


@dataclass
class Blocked:
    """What happened: whether the call waited on ``other``, and its result or error."""

    waited: bool
    result: Any = None
    error: BaseException | None = None


def run_blocked(engine: Engine, other: Connection, call: Callable[[], Any]) -> Blocked:
    """Run ``call`` on a thread, commit ``other`` once ``call`` waits on it, and report."""
    other_pid = int(other.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
    outcome = Blocked(waited=False)

    def run() -> None:
        try:
            outcome.result = call()
        except BaseException as exc:  # reported to the test
            outcome.error = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        with engine.connect() as probe:
            # Up to a minute: on a loaded machine a first call (schema check, catalog
            # reads) took longer than the ten seconds this waited before.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                outcome.waited = bool(
                    probe.exec_driver_sql(
                        "SELECT count(*) FROM pg_stat_activity "
                        f"WHERE {other_pid} = ANY(pg_blocking_pids(pid))"
                    ).scalar_one()
                )
                if outcome.waited or not thread.is_alive():
                    break
                time.sleep(0.025)
        other.commit()
    finally:
        thread.join(30)
    return outcome
