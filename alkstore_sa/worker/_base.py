"""What the threaded and the asyncio worker share: attempts, outcomes, statistics, logs.

The two runtimes differ only in how they wait and run handlers; everything that
decides *what* happens to a job (its output, fencing, counting, logging) lives
here, so the two cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from sqlalchemy.engine import URL

from ..errors import InvalidOptionsError
from ..names import DEFAULT_SCHEMA, notify_channel, validate_schema
from ..ops import FailResult
from ..options import check_bool
from ..records import Job, Settled
from ._attempt import (
    ABANDONED,
    RUNNING,
    SETTLING,
    Attempt,
    ErrorCallback,
    Kind,
    Pending,
    QueueCounts,
    prepare_output,
    shutdown_output,
    timeout_output,
)
from .config import HandlerSpec, Registry
from .listener import Listener

log = logging.getLogger("alkstore_sa.worker")


def listen_conninfo(url: URL) -> str:
    """A libpq URL for the listening connection, from an engine's URL."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def load_supervisor(class_name: str) -> Any:
    """The supervisor class, or ``None`` if this installation has none."""
    try:
        module = importlib.import_module(f"{__package__}.supervisor")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.supervisor":
            raise
        log.warning(
            "supervisor not available; running without it",
            extra={"action": "supervisor_unavailable"},
        )
        return None
    return getattr(module, class_name)


class WorkerBase(Registry):
    """Settings, bookkeeping and reporting common to both workers."""

    def __init__(
        self,
        *,
        schema: str,
        handlers: Mapping[str, Callable[..., Any] | HandlerSpec] | None,
        concurrency: int | None,
        batch_size: int | None,
        poll_interval: float | None,
        extend_lease: bool | None,
        timeout: float | None,
        priority: bool | None,
        shutdown_timeout: float,
        listen: bool,
        listen_dsn: str | None,
        supervise: bool,
        supervisor_options: Mapping[str, Any] | None,
        on_error: ErrorCallback | None,
        flush_interval: float,
        name: str | None,
    ) -> None:
        super().__init__(
            handlers,
            concurrency=concurrency,
            batch_size=batch_size,
            poll_interval=poll_interval,
            extend_lease=extend_lease,
            timeout=timeout,
            priority=priority,
        )
        # Only None means the default: an empty name is a mistake, not a wish for it.
        self.schema = validate_schema(DEFAULT_SCHEMA if schema is None else schema)
        self.channel = notify_channel(self.schema)
        self.shutdown_timeout = _seconds("shutdown_timeout", shutdown_timeout, allow_zero=True)
        self.flush_interval = _seconds("flush_interval", flush_interval, allow_zero=True)
        self.listen = check_bool("listen", listen)
        self.listen_dsn = listen_dsn
        self.supervise = check_bool("supervise", supervise)
        self.supervisor_options = dict(supervisor_options or {})
        self.on_error = on_error
        self.name = name or type(self).__name__
        self._attempts: dict[Any, Attempt] = {}
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._book = threading.Lock()
        self._listener: Listener | None = None

    @property
    def listener(self) -> Listener | None:
        """The process's shared :class:`Listener` this worker subscribed to, once started."""
        return self._listener

    def _make_supervisor(self, class_name: str, engine: Any) -> Any:
        # Built here rather than at start, so a bad supervisor option is refused
        # when the worker is created; the module is imported lazily and may be
        # absent from a trimmed installation.
        if not self.supervise:
            return None
        cls = load_supervisor(class_name)
        if cls is None:
            return None
        return cls(engine, schema=self.schema, **self.supervisor_options)

    # ------------------------------------------------------------ lifecycle logs

    _stop_requested: Any
    _force: Any

    def _signal(self, signum: int) -> None:
        """SIGINT/SIGTERM: the first asks for a graceful stop, the second for an immediate one."""
        if self._stop_requested.is_set():
            log.warning("second signal: stopping now", extra={"action": "worker_force_stop"})
            self._force.set()
        else:
            log.info("signal %d: stopping", signum, extra={"action": "worker_signal"})
            self._stop_requested.set()

    def _log_started(self) -> None:
        log.info(
            "worker %s started on schema %r: %s",
            self.name,
            self.schema,
            ", ".join(f"{s.queue} (x{s.concurrency})" for s in self._specs.values()),
            extra={"action": "worker_started", "worker": self.name, "queues": list(self._specs)},
        )

    def _log_stopping(self, timeout: float) -> None:
        log.info(
            "worker %s stopping (up to %g s for running jobs)",
            self.name,
            timeout,
            extra={"action": "worker_stopping", "worker": self.name},
        )

    def _log_stopped(self) -> None:
        stats = {q: dataclasses.asdict(c) for q, c in self.stats().items()}
        log.info(
            "worker %s stopped: %s",
            self.name,
            stats,
            extra={"action": "worker_stopped", "worker": self.name, "stats": stats},
        )

    # ------------------------------------------------------------ statistics

    def stats(self) -> dict[str, QueueCounts]:
        """Counters per queue since the worker was created.

        Example::

            worker.stats()["emails"].completed
            # -> 42
        """
        with self._book:
            running: dict[str, int] = defaultdict(int)
            for a in self._attempts.values():
                running[a.job.name] += 1
            return {
                q: QueueCounts(
                    fetched=self._counts[q]["fetched"],
                    completed=self._counts[q]["completed"],
                    failed=self._counts[q]["failed"],
                    lost=self._counts[q]["lost"],
                    running=running[q],
                )
                for q in self._specs
            }

    def _count(self, queue: str, key: str, n: int = 1) -> None:
        with self._book:
            self._counts[queue][key] += n

    # ------------------------------------------------------------ attempts

    def _begin(self, spec: HandlerSpec, job: Job, fetched_at: float) -> Attempt:
        timeout = spec.job_timeout(job.expire_seconds)
        attempt = Attempt(
            job,
            spec,
            lease_start=fetched_at,
            deadline=None if timeout is None else fetched_at + timeout,
            lease_seconds=float(job.expire_seconds),
        )
        with self._book:
            self._attempts[job.id] = attempt
            self._counts[job.name]["fetched"] += 1
        log.debug(
            "job %s started",
            job.id,
            extra={"action": "job_started", "queue": job.name, "job_id": str(job.id)},
        )
        return attempt

    def _forget(self, attempt: Attempt) -> None:
        with self._book:
            if self._attempts.get(attempt.job.id) is attempt:
                del self._attempts[attempt.job.id]

    def _running(self) -> list[Attempt]:
        with self._book:
            return [a for a in self._attempts.values() if a.status == RUNNING]

    def _finished(
        self, attempt: Attempt, kind: Kind, value: Any, *, taken: bool = False
    ) -> Pending | None:
        """The handler returned (``complete``) or raised (``fail``).

        ``taken``: the caller already moved the attempt to ``settling``.
        """
        if not taken and not attempt.take(SETTLING):
            log.debug(
                "handler of abandoned job %s returned; result ignored",
                attempt.job.id,
                extra=self._extra("job_result_ignored", attempt),
            )
            return None
        self._forget(attempt)
        if kind == "fail" and isinstance(value, BaseException):
            self._report(value, attempt.job)
        kind, output = prepare_output(kind, value)
        return Pending(kind, attempt, output, "completed" if kind == "complete" else "failed")

    def _abandon(self, attempt: Attempt, reason: Literal["timeout", "shutdown"]) -> Pending | None:
        """Give up on a running handler; its job is failed with a clear output."""
        if not attempt.take(ABANDONED):
            return None
        self._forget(attempt)
        if reason == "timeout":
            output = timeout_output(attempt.spec.job_timeout(attempt.job.expire_seconds) or 0)
        else:
            output = shutdown_output()
        log.log(
            logging.WARNING if reason == "timeout" else logging.INFO,
            "job %s of %r %s",
            attempt.job.id,
            attempt.job.name,
            "timed out" if reason == "timeout" else "was still running at shutdown",
            extra=self._extra("job_timeout" if reason == "timeout" else "job_abandoned", attempt),
        )
        return Pending("fail", attempt, output, reason)

    # ------------------------------------------------------------ results

    def _settled(self, pendings: Sequence[Pending], result: Settled | FailResult) -> None:
        """Count and log what one complete/fail statement did."""
        if isinstance(result, FailResult):
            states = result.states
            affected = set(states)
        else:
            states = {}
            affected = set(result.affected)
        for p in pendings:
            job, attempt = p.attempt.job, p.attempt
            if job.id not in affected:
                verb = "completed" if p.kind == "complete" else "failed"
                self._lost(attempt, f"could not be {verb}")
                continue
            self._count(job.name, "completed" if p.kind == "complete" else "failed")
            if p.kind == "complete":
                log.debug("job %s completed", job.id, extra=self._extra("job_completed", attempt))
            else:
                log.debug(
                    "job %s failed (%s) -> %s",
                    job.id,
                    p.reason,
                    states.get(job.id),
                    extra=self._extra("job_failed", attempt, state=states.get(job.id)),
                )

    def _lost(self, attempt: Attempt, what: str) -> None:
        if attempt.lost:
            return
        attempt.lost = True
        self._count(attempt.job.name, "lost")
        log.warning(
            "job %s of %r %s: this attempt no longer owns it (expired, re-fetched, "
            "cancelled or deleted)",
            attempt.job.id,
            attempt.job.name,
            what,
            extra=self._extra("job_lost", attempt),
        )

    def _extra(self, action: str, attempt: Attempt, **more: Any) -> dict[str, Any]:
        return {
            "action": action,
            "worker": self.name,
            "queue": attempt.job.name,
            "job_id": str(attempt.job.id),
            **more,
        }

    def _report(self, exc: BaseException, job: Job | None) -> None:
        if self.on_error is None:
            return
        try:
            self.on_error(exc, job)
        except Exception:
            log.exception("on_error callback failed", extra={"action": "on_error_failed"})

    def _loop_error(self, where: str, queue: str | None, exc: BaseException, delay: float) -> None:
        log.warning(
            "%s failed (%s: %s); retrying in %.1f s",
            where,
            type(exc).__name__,
            str(exc).strip().splitlines()[0] if str(exc).strip() else "",
            delay,
            extra={"action": f"{where}_error", "worker": self.name, "queue": queue, "delay": delay},
        )
        self._report(exc, None)


def _seconds(option: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidOptionsError(option, f"must be a number of seconds, not {value!r}")
    if value == 0 and not allow_zero:
        raise InvalidOptionsError(option, "must be positive")
    return float(value)


def monotonic() -> float:
    """The clock of leases, deadlines and flushes (patchable in tests)."""
    return time.monotonic()
