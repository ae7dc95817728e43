"""Run a call that must wait on another client's open transaction, without timing.

The call runs on a thread; the other client's transaction is committed only once the
call is seen waiting for it (read from ``pg_blocking_pids``), so the test proves the
wait happened instead of hoping a sleep was long enough.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine


@dataclass
class Blocked:
    """What happened: whether the call waited on ``other``, and its result or error."""

    waited: bool
    result: Any = None
    error: BaseException | None = None
    stack: str = ""
    sessions: list[tuple[Any, ...]] = field(default_factory=list)
    """When the call was never seen waiting but was still running: every other
    session's state and wait, to say what it waited on instead."""


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
                # Waiting on ``other`` directly, or on a session that waits on it
                # (the call's statement may queue behind another lock waiter).
                outcome.waited = bool(
                    probe.exec_driver_sql(
                        "WITH RECURSIVE chain(pid) AS ("
                        " SELECT pid FROM pg_stat_activity"
                        f" WHERE {other_pid} = ANY(pg_blocking_pids(pid))"
                        " UNION"
                        " SELECT a.pid FROM pg_stat_activity a JOIN chain c"
                        " ON c.pid = ANY(pg_blocking_pids(a.pid)))"
                        " SELECT count(*) FROM chain"
                    ).scalar_one()
                )
                if outcome.waited or not thread.is_alive():
                    break
                time.sleep(0.025)
            if not outcome.waited and thread.is_alive():
                # Where the call stands in Python, and what every other session of the
                # database waits on, for the report.
                frame = sys._current_frames().get(thread.ident or 0)
                outcome.stack = "".join(traceback.format_stack(frame)) if frame else ""
                outcome.sessions = [
                    tuple(r)
                    for r in probe.exec_driver_sql(
                        "SELECT pid, state, wait_event_type, wait_event,"
                        " pg_blocking_pids(pid), left(query, 120) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                ]
        other.commit()
    finally:
        thread.join(30)
    return outcome
