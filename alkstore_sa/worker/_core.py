"""What every part of the worker stands on: its settings and bookkeeping, the
runtime's hooks, running an operation in the installed schema version, wake-ups,
the attempts in hand, counters and reporting (the "Architecture" page).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from sqlalchemy.engine import URL

from .. import ops
from .._engine_cache import Refusals, execution_options, make_context, version_due
from ..backends import Backend
from ..errors import InvalidOptionsError, SchemaVersionError, shown
from ..names import DEFAULT_SCHEMA, node_channel, notify_channel, validate_schema
from ..ops._core import may_be_schema_change
from ..options import check_bool
from ..records import Job
from ..steps import Invoke, Run, Steps
from ._attempt import (
    ABANDONED,
    RUNNING,
    Attempt,
    ErrorCallback,
    Inbox,
    Pending,
    QueueCounts,
    shutdown_output,
    timeout_output,
)
from ._queue_state import QueueState
from ._registry import DEFAULT_HEARTBEAT_SECONDS, Registration, check_heartbeat
from .config import (
    DEFAULT_SHUTDOWN_TIMEOUT,
    LIVENESS_SECONDS,
    MIN_LIVENESS_SECONDS,
    HandlerSpec,
    Registry,
)
from .listener import Listener, Subscription

if TYPE_CHECKING:
    from ..metrics import WorkerMetrics

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")
T = TypeVar("T")


class WorkerCore(Registry, Generic[B]):
    """Settings, bookkeeping and what every part of the worker uses: the runtime
    hooks, running an operation, wake-ups, counters, the attempts in hand and
    reporting. The loops are in the mixins above it (see :class:`WorkerBase`
    in the ``_base`` module).

    A runtime provides ``_bind``, ``_event``, ``_answer`` (steps), ``_start_runner``,
    ``_cut_loose`` and ``_spawn``; the rest is here.
    """

    _supervisor_class: Any = None
    """The supervisor run alongside (``Supervisor`` or ``AsyncSupervisor``)."""

    _inline_jobs = False
    """Run the jobs of a queue with fast handlers on one runner, one after the other
    (see :data:`INLINE_SECONDS`): for a runtime whose hand-off costs more than that."""

    def __init__(
        self,
        bind: B,
        *,
        schema: str = DEFAULT_SCHEMA,
        handlers: Mapping[str, Callable[..., Any] | HandlerSpec] | None = None,
        concurrency: int | None = None,
        batch_size: int | None = None,
        prefetch: int | None = None,
        poll_interval: float | None = None,
        extend_lease: bool | None = None,
        timeout: float | None = None,
        priority: bool | None = None,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
        listen: bool = True,
        listen_dsn: str | None = None,
        supervise: bool = True,
        supervisor_options: Mapping[str, Any] | None = None,
        on_error: ErrorCallback | None = None,
        flush_interval: float = 0.005,
        name: str | None = None,
        register_instance: bool = True,
        instance_heartbeat_seconds: int = DEFAULT_HEARTBEAT_SECONDS,
        metrics: object = None,
        backend: str | Backend | None = None,
        liveness_seconds: int | None = LIVENESS_SECONDS,
    ) -> None:
        self.engine, self.sessions = self._bind(bind)
        super().__init__(
            handlers,
            concurrency=concurrency,
            batch_size=batch_size,
            prefetch=prefetch,
            poll_interval=poll_interval,
            extend_lease=extend_lease,
            timeout=timeout,
            priority=priority,
        )
        # Only None means the default: an empty name is a mistake, not a wish for it.
        self.schema = validate_schema(DEFAULT_SCHEMA if schema is None else schema)
        self.channel = notify_channel(self.schema)
        self.node_channel = node_channel(self.schema)
        self.shutdown_timeout = _seconds("shutdown_timeout", shutdown_timeout, allow_zero=True)
        self.flush_interval = _seconds("flush_interval", flush_interval, allow_zero=True)
        self.listen = check_bool("listen", listen)
        self.listen_dsn = listen_dsn
        self.supervise = check_bool("supervise", supervise)
        self.supervisor_options = dict(supervisor_options or {})
        self.on_error = on_error
        self.liveness_seconds = _liveness(liveness_seconds)
        # Schema 26: the id our claims record (models/claims.py), renewed by the keeper.
        self._claimer_id = uuid.uuid4()
        self._claims_off_said = False
        self.name = name or type(self).__name__
        self._metrics = _worker_metrics(metrics, self.schema)
        # The instance registry (schema 46): registered at start, a heartbeat every
        # instance_heartbeat_seconds, stopped_on at stop; only a given name is recorded.
        self.register_instance = check_bool("register_instance", register_instance)
        self._registration = Registration(
            name or None, check_heartbeat(instance_heartbeat_seconds), list(self._specs)
        )
        self._registrar_stop = self._event()
        self._registrar: Any = None
        self._deregistered = False
        sync_engine = getattr(self.engine, "sync_engine", self.engine)
        self._ctx, engine_state = make_context(
            self.schema, notify=False, engine=sync_engine, backend=backend
        )
        self.backend = self._ctx.backend
        if self.backend.has("noListenNotify"):
            self.listen = False  # nothing would ever be heard: poll
        assert engine_state is not None  # an engine was given
        self._engine_state = engine_state
        self._options = execution_options(self.schema)
        # Claims and settlements outside a handler's transaction: one statement,
        # one round trip each, on a pooled connection in autocommit.
        self._autocommit = self.engine.execution_options(isolation_level="AUTOCOMMIT")
        self._attempts: dict[Any, Attempt] = {}
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self._book = threading.Lock()
        self._listener: Listener | None = None
        self._subscription: Subscription | None = None
        # Node pg-boss 12's channel, listened on once the schema is seen at 46.
        self._node_subscription: Subscription | None = None
        self._released = False
        self._queues: dict[str, QueueState] = {}
        self._refusals = Refusals(log, f"worker {self.name}", "stopped fetching", worker=self.name)
        self._refused_versions: set[int | None] = set()  # reported to on_error once each
        self._stopping = self._event()
        self._stop_requested = self._event()
        self._force = self._event()
        self._keeper_stop = self._event()
        self._give_up = self._event()
        self._inbox = Inbox(self._event())
        self._closing = self._event()  # no more settlements will come
        self._helpers: list[Any] = []  # the completer's and the keeper's thread or task
        # Built now, so that a bad supervisor option is refused with the worker.
        self._supervisor = (
            self._supervisor_class(
                self.engine,
                schema=self.schema,
                **{"backend": self.backend, **self.supervisor_options},
            )
            if self.supervise
            else None
        )

    # ------------------------------------------------------------ runtime hooks

    def _bind(self, bind: B) -> tuple[Any, Any]:
        """``(engine, sessionmaker)`` from the ``bind`` argument, or InvalidOptionsError."""
        raise NotImplementedError

    def _event(self) -> Any:
        """A new event of the runtime's kind."""
        raise NotImplementedError

    def _start_runner(self, state: QueueState, attempt: Attempt) -> None:
        """Run :meth:`_handling` from ``attempt`` on a handler thread or task."""
        raise NotImplementedError

    def _cut_loose(self, attempt: Attempt) -> None:
        """The attempt was abandoned: stop its handler if the runtime can."""
        raise NotImplementedError

    def _spawn(self, steps: Steps[Any], name: str) -> Any:
        """Run ``steps`` on a thread or task of their own; return its handle."""
        raise NotImplementedError

    # ------------------------------------------------------------ properties

    @property
    def metrics_registry(self) -> Any:
        """The ``prometheus_client`` registry this worker counts into (``None``: metrics
        off); see the ``metrics`` option and the "Export Prometheus metrics" page."""
        return None if self._metrics is None else self._metrics.registry

    @property
    def listener(self) -> Listener | None:
        """The process's shared :class:`Listener` this worker subscribed to, once started."""
        return self._listener

    # ------------------------------------------------------------ wake-ups

    def wake(self, queue: str | None = None) -> None:
        """Make ``queue``'s loop (or every loop) fetch now.

        Invoke it from any thread with a :class:`~alkstore_sa.Worker`, from the
        event loop's thread with an :class:`~alkstore_sa.AsyncWorker`.
        """
        for name, state in self._queues.items():
            if queue is None or name == queue:
                state.wake.set()

    def _notified(self, payload: str | None) -> None:
        self.wake(payload)

    # ------------------------------------------------------------ operations

    def _op(self, op: ops.Op[T], session: Any = None, *, autocommit: bool = False) -> Steps[T]:
        """Run ``op`` in the installed schema version's statements: on ``session``,
        or with ``autocommit`` each statement on its own, or in a transaction.

        The version is read as the services read it (once per engine, again every
        SCHEMA_RECHECK_SECONDS). A statement failing as a changed schema makes it
        fail expires that reading; its transaction rolled back, so the loop that
        asked retries it (a claim after its backoff, a settlement with the batch)
        and then speaks the version found.
        """
        due = version_due(self._ctx, self._engine_state)
        if due is not None:
            yield Run(due)  # a change is logged once per engine (schema_version_changed)
        if self._ctx.has("Node's notify channel") and self._node_subscription is None:
            yield from self._listening_to_node()
        try:
            result: T = yield Run(op, session, autocommit=autocommit)
            return result
        except Exception as exc:
            if may_be_schema_change(exc):
                self._engine_state.expire(self.schema)
            raise

    def _listening_to_node(self) -> Steps[None]:
        """At schema 46, LISTEN on Node pg-boss's channel too (same connection).

        Node 12 sends ``pg_notify(pgboss_<sha224(schema)[:24]>, queue)`` for queues
        created with ``notify``, never on our channel; without this an idle worker
        would see Node's jobs only when it polls. Done once, when the version is
        first seen at 46 (at start, or live after an upgrade); then every queue is
        looked at once, for a notification sent before the LISTEN took effect.
        """
        listener = self._listener
        if listener is None:
            return
        with self._book:
            if self._node_subscription is not None or self._released:
                return
            self._node_subscription = listener.subscribe(self.node_channel, self._notified)
        log.debug(
            "worker %s listens on Node pg-boss's channel %s too (schema %r at version %d)",
            self.name,
            self.node_channel,
            self.schema,
            self._ctx.version,
            extra={
                "action": "listen_node_channel",
                "worker": self.name,
                "channel": self.node_channel,
            },
        )
        yield Invoke(listener.wait_listening, (self.node_channel, 2.0), blocking=True)
        self.wake()

    # ------------------------------------------------------------ statistics

    def stats(self) -> dict[str, QueueCounts]:
        """Counters per queue since the worker was created.

        Example::

            worker.stats()["emails"].completed
            # -> 42
        """
        with self._book:
            running: dict[str, int] = defaultdict(int)
            buffered: dict[str, int] = defaultdict(int)
            for a in self._attempts.values():
                (buffered if a.started is None else running)[a.job.name] += 1
            return {
                q: QueueCounts(
                    fetched=self._counts[q]["fetched"],
                    completed=self._counts[q]["completed"],
                    failed=self._counts[q]["failed"],
                    lost=self._counts[q]["lost"],
                    running=running[q],
                    claims=self._counts[q]["claims"],
                    buffered=buffered[q],
                )
                for q in self._specs
            }

    def _count(self, queue: str, key: str, n: int = 1) -> None:
        with self._book:
            self._counts[queue][key] += n
        if key in ("completed", "failed"):
            self._registration.stamp(queue, "ended")
            if key == "failed":
                self._registration.stamp(queue, "error")

    # ------------------------------------------------------------ attempts

    def _begin(self, spec: HandlerSpec, jobs: list[Job], fetched_at: float) -> list[Attempt]:
        """The attempts of the jobs one claim brought, in hand from now."""
        attempts = [
            Attempt(
                job,
                spec,
                lease_start=fetched_at,
                deadline=None,
                lease_seconds=float(job.expire_seconds),
            )
            for job in jobs
        ]
        if not attempts:
            return attempts
        with self._book:
            for attempt in attempts:
                self._attempts[attempt.job.id] = attempt
            self._counts[spec.queue]["fetched"] += len(attempts)
        self._registration.stamp(spec.queue, "fetched")
        if log.isEnabledFor(logging.DEBUG):
            for job in jobs:
                log.debug(
                    "job %s started",
                    job.id,
                    extra={"action": "job_started", "queue": job.name, "job_id": str(job.id)},
                )
        return attempts

    def _forget(self, attempt: Attempt) -> None:
        with self._book:
            if self._attempts.get(attempt.job.id) is attempt:
                del self._attempts[attempt.job.id]

    def _running(self) -> list[Attempt]:
        with self._book:
            return [a for a in self._attempts.values() if a.status == RUNNING]

    def _abandon(self, attempt: Attempt, reason: Literal["timeout", "shutdown", "lost"]) -> bool:
        """Give up on a running handler, whoever notices first (keeper or shutdown).

        Its slot is given back at once and its handler cut loose (cancelled, or
        left to finish on a thread of its own with its result ignored). A timeout
        or shutdown fails the job with a clear output; a lost lease writes
        nothing, since the job is no longer this attempt's.
        """
        if not attempt.take(ABANDONED):
            return False
        self._forget(attempt)
        state = self._queues[attempt.job.name]
        state.dropped(attempt)
        if reason == "lost":
            self._lost(attempt, "could not renew its lease; handler abandoned")
        else:
            if reason == "timeout":
                timeout = attempt.spec.job_timeout(attempt.job.expire_seconds) or 0
                output, action = timeout_output(timeout), "job_timeout"
            else:
                output, action = shutdown_output(), "job_abandoned"
            # A timeout is said at WARNING by the record of the fail it becomes
            # (the "Logging" page); shutdown is said here, as the stop is not clean.
            log.log(
                logging.DEBUG if reason == "timeout" else logging.INFO,
                "job %s of %r %s",
                attempt.job.id,
                attempt.job.name,
                "timed out" if reason == "timeout" else "was still running at shutdown",
                extra=self._extra(action, attempt),
            )
            ran = None if attempt.started is None else monotonic() - attempt.started
            self._inbox.put(Pending("fail", attempt, output, reason, None, ran))
        if attempt.started is not None:
            self._cut_loose(attempt)
        state.wake.set()
        return True

    # ------------------------------------------------------------ reporting

    def _lost(self, attempt: Attempt, what: str) -> None:
        if attempt.lost:
            return
        attempt.lost = True
        self._count(attempt.job.name, "lost")
        if self._metrics is not None:
            self._metrics.lost(attempt.job.name)
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

    def _refused(self, exc: SchemaVersionError) -> float:
        """The installed version was refused: said once; the seconds to wait."""
        if exc.found not in self._refused_versions:
            self._refused_versions.add(exc.found)
            self._report(exc, None)
        return self._refusals.refused(exc, self._engine_state, self.schema)

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


def _worker_metrics(option: object, schema: str) -> WorkerMetrics | None:
    """The worker's ``metrics`` option: ``None`` counts when ``prometheus_client`` is
    installed, ``True`` requires it, ``False`` counts nothing, a registry counts there.
    :mod:`alkstore_sa.metrics` (and ``prometheus_client``) is imported only here."""
    if option is False:
        return None
    try:
        from .. import metrics
    except ImportError as exc:
        if exc.name != "prometheus_client":
            raise
        if option is None:
            return None
        raise InvalidOptionsError(
            "metrics", "needs prometheus-client: pip install 'alkstore_sa[metrics]'"
        ) from None
    return metrics.worker_metrics(option, schema)


def listen_conninfo(url: URL) -> str:
    """A libpq URL for the listening connection, from an engine's URL."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def _seconds(option: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise InvalidOptionsError(option, f"must be a number of seconds, not {shown(value)}")
    if value == 0 and not allow_zero:
        raise InvalidOptionsError(option, "must be positive")
    return float(value)


def _liveness(value: object) -> int | None:
    """``liveness_seconds``: None (off) or an integer from 10 to 3600."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_LIVENESS_SECONDS <= value <= 3600
    ):
        raise InvalidOptionsError(
            "liveness_seconds",
            f"must be None or an integer from {MIN_LIVENESS_SECONDS} to 3600, not {shown(value)}",
        )
    return value


def monotonic() -> float:
    """The clock of leases, deadlines and flushes (patchable in tests)."""
    return time.monotonic()
