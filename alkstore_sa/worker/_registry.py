"""A worker's row in the instance registry (schema 46; the "Observe queues, warnings and
workers" page).

As a Node pg-boss 12.38 instance does, a worker registers at start, refreshes its
row every ``instance_heartbeat_seconds`` (30) and stamps ``stopped_on`` at a
graceful stop; a crashed worker's row goes quiet after three missed heartbeats
and supervision (ours or Node's) deletes it after 7 days. What the row holds is
built here; :class:`~alkstore_sa.worker._base.WorkerBase` runs the statements.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import socket
import threading
import time
import uuid
from collections import defaultdict
from typing import Any

from .._version import __version__
from ..errors import InvalidOptionsError, shown

DEFAULT_HEARTBEAT_SECONDS = 30
"""pg-boss's default ``instanceHeartbeatSeconds``."""


def check_heartbeat(value: object) -> int:
    """``instance_heartbeat_seconds``: an integer from 1 to 3600, as pg-boss accepts."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 3600:
        raise InvalidOptionsError(
            "instance_heartbeat_seconds", f"must be an integer from 1 to 3600, not {shown(value)}"
        )
    return value


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    at = dt.datetime.fromtimestamp(epoch, dt.UTC)
    return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def _rss() -> int | None:
    # Resident set size now (Linux: /proc/self/statm), not the peak getrusage reports.
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _total_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError, AttributeError):
        return None


def _allowed_cpus() -> int:
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return len(affinity(0))
    return os.cpu_count() or 1


class Vitals:
    """The process's resource sample for the ``metrics`` column, in pg-boss's keys.

    Host limits only (``cgroup`` null: a container's limits are not read); ``cpu``
    is the cores used since the previous sample (null on the first); what Node
    measures of its V8 heap and event loop has no Python counterpart (null).
    """

    def __init__(self) -> None:
        self._last: tuple[float, float] | None = None

    def sample(self) -> dict[str, Any] | None:
        """One sample, or ``None`` where the host's memory cannot be read."""
        wall, used = time.monotonic(), time.process_time()
        cpu = None
        if self._last is not None and wall > self._last[0]:
            cpu = round((used - self._last[1]) / (wall - self._last[0]), 3)
        self._last = (wall, used)
        memory = _total_memory()
        if memory is None:
            return None
        return {
            "cgroup": None,
            "cpu": cpu,
            "cpuLimit": _allowed_cpus(),
            "cpuThrottled": None,
            "rss": _rss(),
            "heapUsed": None,
            "heapLimit": None,
            "memoryUsed": None,
            "memoryLimit": memory,
            "loopDelay": None,
            "loopDelayMax": None,
            "loopUtilization": None,
        }


def process_start() -> dt.datetime:
    """When this process started (Linux: from /proc; elsewhere, when this module
    was imported, a later time that still precedes any registration)."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as proc:
            boot = next(int(line.split()[1]) for line in proc if line.startswith("btime "))
        return dt.datetime.fromtimestamp(boot + ticks / os.sysconf("SC_CLK_TCK"), dt.UTC)
    except (OSError, ValueError, IndexError, StopIteration):
        return _IMPORTED


_IMPORTED = dt.datetime.now(dt.UTC)


class Registration:
    """One worker's identity in the registry and what its heartbeats report."""

    def __init__(self, name: str | None, heartbeat_seconds: int, queues: list[str]) -> None:
        self.id = uuid.uuid4()
        self.name = name
        self.heartbeat_seconds = heartbeat_seconds
        self.started_on: dt.datetime | None = None
        self.process_start = process_start()
        self.work_ids = {q: str(uuid.uuid4()) for q in queues}
        self._stamps: dict[str, dict[str, float]] = defaultdict(dict)
        self._lock = threading.Lock()
        self._vitals = Vitals()

    def stamp(self, queue: str, what: str) -> None:
        """Note that ``what`` (``fetched``, ``ended``, ``error``) happened on ``queue`` now."""
        with self._lock:
            self._stamps[queue][what] = time.time()

    def workers(self, specs: Any, in_flight: dict[str, int]) -> list[dict[str, Any]]:
        """One entry per handler, with pg-boss's keys for a ``work()`` call."""
        out = []
        with self._lock:
            stamps = {q: dict(s) for q, s in self._stamps.items()}
        for spec in specs:
            mine = stamps.get(spec.queue, {})
            # Only options pg-boss records too, under its names.
            options: dict[str, Any] = {"transactional": True} if spec.transactional else {}
            out.append(
                {
                    "id": self.work_ids.setdefault(spec.queue, str(uuid.uuid4())),
                    "queue": spec.queue,
                    "localConcurrency": spec.concurrency,
                    "batchSize": spec.batch_size or 1,
                    "pollingIntervalSeconds": spec.poll_interval,
                    "active": in_flight.get(spec.queue, 0),
                    "lastFetchedOn": _iso(mine.get("fetched")),
                    "lastJobEndedOn": _iso(mine.get("ended")),
                    "lastErrorOn": _iso(mine.get("error")),
                    "options": options,
                }
            )
        return out

    def values(
        self,
        *,
        supervisor_settings: Any,
        pool: Any,
        workers: list[dict[str, Any]],
        listen: bool,
    ) -> dict[str, Any]:
        """The parameters of the register and heartbeat statements."""
        s = supervisor_settings
        counts = _pool_counts(pool)
        config: dict[str, Any] = {
            "adapter": "sqlalchemy",
            "client": "alkstore_sa",
            "instanceHeartbeatSeconds": self.heartbeat_seconds,
            "useListenNotify": listen,
            "supervise": bool(s is not None and s.supervise),
            "schedule": bool(s is not None and s.schedule),
            "migrate": False,
        }
        if counts["pool_max"] is not None:
            config["max"] = counts["pool_max"]
        if s is not None:
            config.update(
                superviseIntervalSeconds=s.supervise_interval,
                monitorIntervalSeconds=s.monitor_interval,
                maintenanceIntervalSeconds=s.maintenance_interval,
                cronMonitorIntervalSeconds=s.cron_monitor_interval,
                cronWorkerIntervalSeconds=s.cron_worker_interval,
                clockMonitorIntervalSeconds=s.clock_monitor_interval,
                warningQueueSize=s.warning_queue_size,
                persistWarnings=s.persist_warnings,
                warningRetentionDays=s.warning_retention_days,
                persistQueueStats=s.persist_queue_stats,
                queueStatRetentionDays=s.queue_stats_retention_days,
            )
        return {
            "id": self.id,
            "name": self.name,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "version": f"alkstore_sa {__version__}",
            "node_version": f"Python {platform.python_version()}",
            "heartbeat_seconds": self.heartbeat_seconds,
            "supervise": config["supervise"],
            "schedule": config["schedule"],
            "migrate": False,
            "persist_queue_stats": bool(s is not None and s.persist_queue_stats),
            "persist_warnings": bool(s is not None and s.persist_warnings),
            **counts,
            "workers": json.dumps(workers),
            "metrics": json.dumps(self._vitals.sample()),
            "config": json.dumps(config),
        }


def _pool_counts(pool: Any) -> dict[str, int | None]:
    """SQLAlchemy's pool counts in pg-boss's columns (``None`` where a pool has none)."""
    counts: dict[str, int | None] = dict.fromkeys(
        ("pool_max", "pool_total", "pool_idle", "pool_waiting")
    )
    try:
        size, idle, out = pool.size(), pool.checkedin(), pool.checkedout()
    except (AttributeError, NotImplementedError):
        return counts
    overflow = getattr(pool, "_max_overflow", None)
    counts["pool_max"] = size + overflow if isinstance(overflow, int) and overflow >= 0 else None
    counts["pool_total"] = idle + out
    counts["pool_idle"] = idle
    return counts


__all__ = ["DEFAULT_HEARTBEAT_SECONDS", "Registration", "check_heartbeat"]
