"""The worker, written once: settings, fetch loops, handlers, settling, leases, shutdown.

Every decision (how many jobs to claim, when a lease is due, what a lost or
timed-out attempt becomes, what to write and when) is made here, in generators
that yield steps (:mod:`alkstore_sa.steps`). :class:`~alkstore_sa.Worker` answers
them with threads and :class:`~alkstore_sa.AsyncWorker` with asyncio tasks; those
two modules hold only how to wait, how to run a handler and how to start things.
See the "Architecture" page.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from sqlalchemy.engine import URL

from .. import ops, tracing
from .._engine_cache import (
    Refusals,
    execution_options,
    make_context,
    version_due,
)
from ..errors import InvalidOptionsError, SchemaVersionError, shown
from ..models.enums import JobState
from ..names import DEFAULT_SCHEMA, notify_channel, validate_schema
from ..ops import observe46, working
from ..ops._core import may_be_schema_change
from ..options import check_bool
from ..records import FailResult, Job, Settled
from ..sql.v46 import node_channel
from ..steps import Call, Join, Run, Steps, Wait
from ._attempt import (
    ABANDONED,
    RUNNING,
    SETTLING,
    Attempt,
    ErrorCallback,
    Kind,
    Pending,
    QueueCounts,
    group,
    prepare_output,
    shutdown_output,
    timeout_output,
)
from ._backoff import Backoff
from ._registry import DEFAULT_HEARTBEAT_SECONDS, Registration, check_heartbeat
from .config import DEFAULT_SHUTDOWN_TIMEOUT, HandlerSpec, Registry, spec_group_limits
from .listener import Listener, Subscription

if TYPE_CHECKING:
    from ..metrics import WorkerMetrics

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")
T = TypeVar("T")

TICK = 0.2
"""Seconds between checks of leases and deadlines."""

FETCH_JOIN_SECONDS = 10.0
"""How long shutdown waits for a fetch loop. A fetch never waits on row locks
(SKIP LOCKED); the bound is for a database that stopped answering."""

INLINE_SECONDS = 0.001
"""A runtime that hands jobs to other threads (``Worker``) runs the jobs it claimed
on its fetch thread instead, one after the other, while the queue's handlers take
less than this on average: waking a pool thread costs about half a millisecond."""

INLINE_OVERDUE = 0.05
"""A job run on the fetch thread for longer than this is left to that thread as a
handler thread: a new fetch loop takes over the queue and the batch's other jobs
are handed off (checked by the keeper, every :data:`TICK`)."""


class _Lost(Exception):
    """A transactional handler's job was taken away: roll its writes back."""


class QueueState:
    """One queue's slots: how many of its jobs run, and whether it has a backlog."""

    def __init__(self, spec: HandlerSpec, wake: Any) -> None:
        self.spec = spec
        self.wake = wake
        self.in_flight = 0
        self.backlog = False
        self.lock = threading.Lock()
        self.runner: Any = None  # the fetch loop's thread or task
        self.generation = 0  # which fetch loop is the queue's (see WorkerBase._detaching)
        self.inline: Attempt | None = None  # the job its fetch loop runs itself, if any
        self.inline_since = 0.0
        self.pending: deque[Attempt] = deque()  # claimed, to run on the fetch loop next
        self.run_seconds: float | None = None  # moving average of the handlers' run time
        # local_group_concurrency: the group of each of our running jobs that has one.
        self.grouped: dict[Any, str] = {}

    def group_counts(self) -> dict[str, int] | None:
        """Our running jobs per group, for a ``local_group_concurrency`` claim (else None)."""
        if self.spec.local_group_concurrency is None:
            return None
        with self.lock:
            counts: dict[str, int] = {}
            for group in self.grouped.values():
                counts[group] = counts.get(group, 0) + 1
            return counts

    def group_started(self, job: Job) -> None:
        if self.spec.local_group_concurrency is not None and job.group_id is not None:
            with self.lock:
                self.grouped[job.id] = job.group_id

    def group_ended(self, job: Job) -> None:
        """The job's handler returned (or will never run): its group place is free.
        A handler abandoned on a thread keeps its place until it returns."""
        if self.grouped:
            with self.lock:
                self.grouped.pop(job.id, None)

    def ran(self, seconds: float) -> None:
        """A handler of the queue ran for ``seconds`` (not abandoned)."""
        with self.lock:
            avg = self.run_seconds
            self.run_seconds = seconds if avg is None else avg + 0.2 * (seconds - avg)

    def runs_inline(self) -> bool:
        """Whether claimed jobs are cheaper to run on the fetch loop than to hand off."""
        avg = self.run_seconds
        return avg is not None and avg < INLINE_SECONDS

    def want(self) -> int:
        """Jobs to claim now (0: wait for free slots)."""
        with self.lock:
            free = self.spec.concurrency - self.in_flight
            if free < self.spec.fetch_threshold(self.backlog):
                return 0
        return min(self.spec.fetch_size, free)

    def claimed(self, got: int, wanted: int) -> None:
        with self.lock:
            self.in_flight += got
            self.backlog = got == wanted

    def free(self) -> bool:
        """Give a slot back; whether the loop should look for more jobs at once."""
        with self.lock:
            self.in_flight -= 1
            return self.backlog


class Inbox:
    """Finished attempts waiting to be settled, in batches."""

    def __init__(self, event: Any) -> None:
        self.event = event
        self._items: list[Pending] = []
        self._lock = threading.Lock()

    def put(self, item: Pending) -> None:
        with self._lock:
            self._items.append(item)
        self.event.set()

    def take(self) -> list[Pending]:
        with self._lock:
            items, self._items = self._items, []
            return items

    def __bool__(self) -> bool:
        return bool(self._items)


class WorkerBase(Registry, Generic[B]):
    """Settings, bookkeeping and every loop common to both workers.

    A runtime provides ``_bind``, ``_event``, ``_answer`` (steps), ``_start_job``,
    ``_cut_loose`` and ``_spawn``; the rest is here.
    """

    _supervisor_class: Any = None
    """The supervisor run alongside (``Supervisor`` or ``AsyncSupervisor``)."""

    _inline_jobs = False
    """Run the claimed jobs of a queue with fast handlers on its fetch loop (see
    :data:`INLINE_SECONDS`): for a runtime whose hand-off costs more than that."""

    def __init__(
        self,
        bind: B,
        *,
        schema: str = DEFAULT_SCHEMA,
        handlers: Mapping[str, Callable[..., Any] | HandlerSpec] | None = None,
        concurrency: int | None = None,
        batch_size: int | None = None,
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
    ) -> None:
        self.engine, self.sessions = self._bind(bind)
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
        self.node_channel = node_channel(self.schema)
        self.shutdown_timeout = _seconds("shutdown_timeout", shutdown_timeout, allow_zero=True)
        self.flush_interval = _seconds("flush_interval", flush_interval, allow_zero=True)
        self.listen = check_bool("listen", listen)
        self.listen_dsn = listen_dsn
        self.supervise = check_bool("supervise", supervise)
        self.supervisor_options = dict(supervisor_options or {})
        self.on_error = on_error
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
        self._ctx, engine_state = make_context(self.schema, False, sync_engine)
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
            self._supervisor_class(self.engine, schema=self.schema, **self.supervisor_options)
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

    def _start_job(self, state: QueueState, attempt: Attempt) -> None:
        """Run :meth:`_executing` for ``attempt`` on a handler thread or task."""
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

    # ------------------------------------------------------------ starting

    def _starting(self) -> Steps[None]:
        if not self._specs:
            raise InvalidOptionsError("handlers", "register at least one handler before starting")
        if self.register_instance:
            # Registered before the first fetch, as Node registers in start() before work.
            yield from self._beat()
        self._helpers.append(self._spawn(self._completing(), "alkstore-completer"))
        if self.listen:
            conninfo = self.listen_dsn or listen_conninfo(self.engine.url)
            self._listener = Listener.acquire(conninfo)
            self._subscription = self._listener.subscribe(self.channel, self._notified)
            if not (yield Call(self._listener.wait_listening, (self.channel, 2.0), blocking=True)):
                log.warning(
                    "not listening yet; relying on polling until the listener connects",
                    extra={"action": "listener_pending", "worker": self.name},
                )
        for spec in self._specs.values():
            state = self._queues[spec.queue] = QueueState(spec, self._event())
            state.runner = self._spawn(self._fetching(state, 0), f"alkstore-fetch-{spec.queue}")
        self._helpers.append(self._spawn(self._keeping(), "alkstore-keeper"))
        if self._supervisor is not None:
            yield Call(self._supervisor.start)
        if self.register_instance:
            with self._book:  # not once a stop that raced this start has deregistered
                if not self._deregistered:
                    self._registrar = self._spawn(self._registering(), "alkstore-registrar")
        log.info(
            "worker %s started on schema %r: %s",
            self.name,
            self.schema,
            ", ".join(f"{s.queue} (x{s.concurrency})" for s in self._specs.values()),
            extra={"action": "worker_started", "worker": self.name, "queues": list(self._specs)},
        )

    def _signal(self, signum: int) -> None:
        """SIGINT/SIGTERM: the first asks for a graceful stop, the second for an immediate one."""
        if self._stop_requested.is_set():
            log.warning("second signal: stopping now", extra={"action": "worker_force_stop"})
            self._force.set()
        else:
            log.info("signal %d: stopping", signum, extra={"action": "worker_signal"})
            self._stop_requested.set()

    # ------------------------------------------------------------ stopping

    def _shutting_down(self, timeout: float) -> Steps[None]:
        log.info(
            "worker %s stopping (up to %g s for running jobs)",
            self.name,
            timeout,
            extra={"action": "worker_stopping", "worker": self.name},
        )
        self._stopping.set()
        self.wake()
        # A loop running a job itself is waited for as its job is, below.
        loops = [s.runner for s in self._queues.values() if s.inline is None]
        yield Join(loops, FETCH_JOIN_SECONDS)
        deadline = monotonic() + timeout
        while self._running() and monotonic() < deadline and not self._force.is_set():
            yield Wait(self._force, min(0.05, max(0.0, deadline - monotonic())))
        handles = [a.handle for a in self._running() if self._abandon(a, "shutdown")]
        yield Join(handles, 1.0)  # cancelled tasks; a sync handler's thread is not waited for
        self._closing.set()
        self._inbox.event.set()
        completer, keeper = self._helpers
        if not (yield Join([completer], max(5.0, timeout))):
            self._give_up.set()
            yield Join([completer], 1.0)
        self._keeper_stop.set()
        yield Join([keeper], 5.0)
        if self.register_instance:
            yield from self._deregistering()
        if self._listener is not None and self._subscription is not None:
            with self._book:
                self._released = True
                node_sub = self._node_subscription
            subs = [self._subscription] + ([node_sub] if node_sub is not None else [])
            self._listener.release(*subs)
        if self._supervisor is not None:
            try:
                yield Call(self._supervisor.stop, (timeout,))
            except Exception as exc:
                log.exception("supervisor stop failed", extra={"action": "supervisor_error"})
                self._report(exc, None)
        stats = {q: dataclasses.asdict(c) for q, c in self.stats().items()}
        log.info(
            "worker %s stopped: %s",
            self.name,
            stats,
            extra={"action": "worker_stopped", "worker": self.name, "stats": stats},
        )

    # ------------------------------------------------------------ wake-ups

    def wake(self, queue: str | None = None) -> None:
        """Make ``queue``'s loop (or every loop) fetch now.

        Call it from any thread with a :class:`~alkstore_sa.Worker`, from the
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
        if self._ctx.version >= 46 and self._node_subscription is None:
            yield from self._listening_to_node()
        try:
            result: T = yield Run(op, session, autocommit)
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
        log.info(
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
        yield Call(listener.wait_listening, (self.node_channel, 2.0), blocking=True)
        self.wake()

    # ------------------------------------------------------------ fetching

    def _fetching(self, state: QueueState, generation: int) -> Steps[None]:
        """The queue's fetch loop (number ``generation``); it ends at shutdown, or when
        a job it ran itself ran long and another loop took over (see _detaching)."""
        spec, backoff = state.spec, Backoff()
        while not self._stopping.is_set() and state.generation == generation:
            want = state.want()
            if not want:
                yield Wait(state.wake, spec.poll_interval)
                state.wake.clear()
                continue
            state.wake.clear()
            fetched_at = monotonic()
            try:
                jobs = yield from self._claiming(spec, want, state.group_counts())
            except SchemaVersionError as exc:
                # The schema is (now) at a version this release does not speak:
                # claim nothing and look again later (no crash loop; queued jobs
                # stay for a client that speaks it).
                yield Wait(self._stopping, self._refused(exc))
                continue
            except Exception as exc:
                delay = backoff.next()
                self._loop_error("fetch", spec.queue, exc, delay)
                yield Wait(self._stopping, delay)
                continue
            backoff.reset()
            self._refusals.clear()
            self._count(spec.queue, "claims")
            state.claimed(len(jobs), want)
            if jobs and self._metrics is not None:
                self._metrics.claimed(spec.queue, jobs)
            for job in jobs:
                state.group_started(job)
            attempts = [self._begin(spec, job, fetched_at) for job in jobs]
            if attempts and self._inline_jobs and state.runs_inline():
                yield from self._inline(state, attempts, generation)
                if state.generation != generation:
                    return  # one ran long: a new loop took over (see _detaching)
            else:
                for attempt in attempts:
                    self._start_job(state, attempt)
            if len(jobs) < want:
                yield Wait(state.wake, spec.poll_interval)

    def _claiming(
        self, spec: HandlerSpec, want: int, group_counts: dict[str, int] | None = None
    ) -> Steps[list[Job]]:
        """One claim: in autocommit (one round trip) unless the queue's policy
        locks keys, or its ``group_concurrency`` groups, which needs a transaction
        (as does a first, uncached claim). ``group_counts``: our running jobs per
        group, for a ``local_group_concurrency``."""
        groups = spec_group_limits(spec)
        options: dict[str, Any] = {}
        if groups is not None:
            options = {"group_concurrency": groups, "group_counts": group_counts}
        global_groups = groups is not None and group_counts is None
        if working.claims_in_autocommit(self._ctx, spec.queue, group_locks=global_groups):
            try:
                return (
                    yield from self._op(
                        ops.fetch(
                            self._ctx,
                            spec.queue,
                            want,
                            spec.priority,
                            False,
                            autocommit=True,
                            **options,
                        ),
                        autocommit=True,
                    )
                )
            except working.NeedsTransaction:
                pass
        return (
            yield from self._op(
                ops.fetch(self._ctx, spec.queue, want, spec.priority, False, **options)
            )
        )

    def _inline(self, state: QueueState, attempts: list[Attempt], generation: int) -> Steps[None]:
        """Run ``attempts`` on the fetch loop itself, one after the other (saves the
        hand-offs), until one runs long and the keeper hands the rest off."""
        with state.lock:
            state.pending.extend(attempts)
        while True:
            with state.lock:
                if state.generation != generation or not state.pending:
                    return
                if self._stopping.is_set():
                    # Shutdown waits for this loop: the rest run on pool threads.
                    rest = list(state.pending)
                    state.pending.clear()
                    break
                attempt = state.pending.popleft()
                attempt.inline = True
                state.inline, state.inline_since = attempt, monotonic()
            try:
                if attempt.status == RUNNING:  # not abandoned while it waited
                    yield from self._executing(state, attempt)
                else:
                    state.group_ended(attempt.job)
            finally:
                with state.lock:
                    if state.inline is attempt:
                        state.inline = None
        for attempt in rest:
            if attempt.status == RUNNING:
                attempt.inline = False
                self._start_job(state, attempt)

    def _detaching(self, state: QueueState, now: float) -> None:
        """The job the fetch loop runs itself has run past :data:`INLINE_OVERDUE`:
        leave that thread to it, start a new fetch loop, hand the rest off."""
        with state.lock:
            if state.inline is None or now - state.inline_since < INLINE_OVERDUE:
                return
            state.inline = None
            state.generation += 1
            generation = state.generation
            rest = list(state.pending)
            state.pending.clear()
        if not self._stopping.is_set():
            state.runner = self._spawn(
                self._fetching(state, generation), f"alkstore-fetch-{state.spec.queue}"
            )
        for attempt in rest:
            if attempt.status == RUNNING:
                attempt.inline = False
                self._start_job(state, attempt)

    # ------------------------------------------------------------ running

    def _executing(self, state: QueueState, attempt: Attempt) -> Steps[bool]:
        """Run one job's handler; ``True`` when it was abandoned (its thread may retire)."""
        try:
            started = monotonic()
            if attempt.spec.transactional:
                pending = yield from self._transactional(attempt)
            else:
                try:
                    result = yield Call(self._traced(attempt), (attempt.job,))
                except GeneratorExit:
                    raise
                except BaseException as exc:
                    pending = self._finished(attempt, "fail", exc)
                else:
                    pending = self._finished(attempt, "complete", result)
            if attempt.status != ABANDONED:
                seconds = monotonic() - started
                state.ran(seconds)
                if self._metrics is not None:
                    self._metrics.ran(attempt.job.name, seconds)
            if pending is not None:
                self._inbox.put(pending)
        finally:
            state.group_ended(attempt.job)
            # An abandoned attempt gave its slot back when it was abandoned.
            abandoned = attempt.status == ABANDONED
            if not abandoned and state.free():
                state.wake.set()
            elif (
                not abandoned
                and attempt.job.group_id is not None
                and spec_group_limits(attempt.spec)
            ):
                # A place of a limited group freed up: a claim may take its next job.
                state.wake.set()
        return abandoned

    def _traced(self, attempt: Attempt) -> Callable[..., Any]:
        """The handler, run in the job's ``process`` span (:mod:`alkstore_sa.tracing`)."""
        job = attempt.job
        return tracing.processing(
            attempt.spec.fn, job.name, job.id, job.retry_count, job.trace_context, self._ctx.schema
        )

    def _transactional(self, attempt: Attempt) -> Steps[Pending | None]:
        try:
            yield Call(self._in_transaction, (attempt,))
        except _Lost:
            if attempt.status == SETTLING:
                self._lost(attempt, "could not be completed (handler writes rolled back)")
            return None
        except GeneratorExit:
            raise
        except BaseException as exc:
            # The handler's writes (and the completion, if it ran) rolled back
            # together: fail the job so that it runs again.
            return self._finished(attempt, "fail", exc, taken=attempt.status == SETTLING)
        self._count(attempt.job.name, "completed")
        if self._metrics is not None:
            self._metrics.completed(attempt.job.name)
        log.debug("job %s completed", attempt.job.id, extra=self._extra("job_completed", attempt))
        return None

    def _in_transaction(self, attempt: Attempt) -> Any:
        """Open a session and a transaction, and run :meth:`_committing` in it."""
        raise NotImplementedError

    def _committing(self, attempt: Attempt, session: Any) -> Steps[None]:
        """The handler and the job's completion, in the handler's transaction."""
        job = attempt.job
        result = yield Call(self._traced(attempt), (job, session))
        if not attempt.take(SETTLING):
            raise _Lost  # abandoned meanwhile: its fail wins, roll back
        self._forget(attempt)
        done = yield from self._op(
            ops.complete_many(self._ctx, job.name, [attempt.settlement(result)]), session
        )
        if not done.affected:
            raise _Lost

    # ------------------------------------------------------------ settling

    def _completing(self) -> Steps[None]:
        """Settle finished attempts in batches; retry a failed batch with backoff.

        The first settlement waits ``flush_interval`` for others, so jobs finishing
        together are settled with one statement per queue. A repeated settlement is
        harmless (fencing), so a batch is retried until shutdown gives up.
        """
        backoff = Backoff()
        while True:
            while True:
                self._inbox.event.clear()
                if self._inbox or self._closing.is_set():
                    break
                yield Wait(self._inbox.event, None)
            if not self._inbox:
                return
            if not self._closing.is_set():
                yield Wait(self._closing, self.flush_interval)
            batch = self._inbox.take()
            while batch:
                try:
                    yield from self._flushing(batch)
                    backoff.reset()
                except Exception as exc:
                    if isinstance(exc, SchemaVersionError):
                        delay = self._refused(exc)  # kept, and written once it is spoken
                    else:
                        delay = backoff.next()
                        self._loop_error("settle", None, exc, delay)
                    if (yield Wait(self._give_up, delay)):
                        log.error(
                            "gave up settling %d job(s) at shutdown; they stay active until "
                            "they expire and are then retried",
                            len(batch),
                            extra={"action": "settle_abandoned", "count": len(batch)},
                        )
                        break

    def _flushing(self, batch: list[Pending]) -> Steps[None]:
        for (queue, kind), items in group(batch).items():
            settlements = [p.attempt.settlement(p.output) for p in items]
            if kind == "complete":
                op: ops.Op[Any] = ops.complete_many(self._ctx, queue, settlements)
            else:
                op = ops.fail_many(self._ctx, queue, settlements)
            result = yield from self._op(op, autocommit=True)
            # Written: never write these again, even if a later group fails.
            done = set(map(id, items))
            batch[:] = [p for p in batch if id(p) not in done]
            self._settled(items, result)
            if kind == "fail" and "retry" in result.states.values():
                self.wake(queue)  # a retry without delay is due at once
            elif any(p.attempt.job.group_id is not None for p in items) and spec_group_limits(
                items[0].attempt.spec
            ):
                self.wake(queue)  # places of limited groups are free now

    # ------------------------------------------------------------ leases

    def _keeping(self) -> Steps[None]:
        """Renew leases of long jobs, keep heartbeats fresh, abandon jobs past their timeout.

        One statement touches a job for both: ``extend_leases`` also stamps
        ``heartbeat_on`` at schema 46 (pg-boss's ``touch``), so a job is touched
        at half its lease or half its ``heartbeat_seconds``, whichever comes first.
        """
        while not (yield Wait(self._keeper_stop, TICK)):
            if self._listener is not None and self._node_subscription is None:
                yield from self._watching_version()
            now = monotonic()
            for state in self._queues.values():
                self._detaching(state, now)
            due: dict[tuple[str, int], list[Attempt]] = defaultdict(list)
            for attempt in self._running():
                if attempt.deadline is not None and now >= attempt.deadline:
                    self._abandon(attempt, "timeout")
                elif attempt.lease_due(now):
                    due[(attempt.job.name, attempt.extend_by(now))].append(attempt)
            for (queue, extend_by), attempts in due.items():
                yield from self._extending(queue, extend_by, attempts)

    def _watching_version(self) -> Steps[None]:
        """Read the schema version when the engine's reading is stale, so that an idle
        worker (a long ``poll_interval``, nothing due) whose schema moves to 46 starts
        listening on Node's channel within SCHEMA_RECHECK_SECONDS, not at its next poll."""
        due = version_due(self._ctx, self._engine_state)
        if due is not None:
            try:
                yield Run(due)
            except Exception as exc:
                # The fetch loops meet the same error on their next claim and report it.
                log.debug(
                    "version check failed: %s",
                    exc,
                    extra={"action": "version_check_error", "worker": self.name},
                )
                return
        if self._ctx.version >= 46:
            yield from self._listening_to_node()

    def _extending(self, queue: str, extend_by: int, attempts: list[Attempt]) -> Steps[None]:
        started = monotonic()
        items = [a.settlement() for a in attempts]
        try:
            kept = set(
                (
                    yield from self._op(
                        ops.extend_leases(self._ctx, queue, items, extend_by), autocommit=True
                    )
                )
            )
        except Exception as exc:
            self._loop_error("lease", queue, exc, TICK)
            return
        for attempt in attempts:
            if attempt.job.id in kept:
                attempt.lease_start, attempt.lease_seconds = started, float(extend_by)
                log.debug(
                    "lease of job %s extended by %d s",
                    attempt.job.id,
                    extend_by,
                    extra=self._extra("lease_extended", attempt),
                )
            else:
                # Expired and failed, cancelled or deleted: no longer ours. The
                # attempt is abandoned as a timed-out one is, without a settlement.
                self._abandon(attempt, "lost")

    # ------------------------------------------------------------ instance registry

    def _instance_values(self) -> dict[str, Any]:
        with self._book:
            in_flight: dict[str, int] = defaultdict(int)
            for a in self._attempts.values():
                in_flight[a.job.name] += 1
        reg = self._registration
        settings = self._supervisor.settings if self._supervisor is not None else None
        return reg.values(
            supervisor_settings=settings,
            pool=getattr(self.engine, "sync_engine", self.engine).pool,
            workers=reg.workers(self._specs.values(), in_flight),
            listen=self.listen,
        )

    def _beat(self) -> Steps[None]:
        """Register, or refresh the registration (an upsert: a row pruned meanwhile,
        or a schema upgraded to 46 since the start, is registered anew). A failure
        is logged and reported; the next beat tries again."""
        reg = self._registration
        try:
            op = observe46.heartbeat_instance(
                self._ctx, self._instance_values(), reg.started_on, reg.process_start
            )
            reg.started_on = yield from self._op(op, autocommit=True)
        except SchemaVersionError:
            pass  # a version this release does not speak: the fetch loops report it
        except Exception as exc:
            self._loop_error("instance_heartbeat", None, exc, float(reg.heartbeat_seconds))

    def _registering(self) -> Steps[None]:
        """The heartbeat loop, every ``instance_heartbeat_seconds`` until stop."""
        while not (yield Wait(self._registrar_stop, float(self._registration.heartbeat_seconds))):
            yield from self._beat()

    def _deregistering(self) -> Steps[None]:
        """End the heartbeats and stamp ``stopped_on`` (best effort: a worker that
        cannot reach the database goes quiet instead, as a crashed one does)."""
        with self._book:
            self._deregistered = True
            registrar = self._registrar
        self._registrar_stop.set()
        if registrar is not None:
            yield Join([registrar], 5.0)
        if self._registration.started_on is None:
            return  # never registered (schema 26, or the database was unreachable)
        try:
            yield from self._op(
                observe46.stop_instance(self._ctx, self._registration.id), autocommit=True
            )
        except Exception as exc:
            log.debug(
                "instance stop not recorded: %s",
                exc,
                extra={"action": "instance_stop_error", "worker": self.name},
            )

    @property
    def instance_id(self) -> uuid.UUID:
        """This worker's id in the instance registry (schema 46; listed by
        :meth:`~alkstore_sa.QueueService.get_instances`)."""
        return self._registration.id

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
                    claims=self._counts[q]["claims"],
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
        self._registration.stamp(job.name, "fetched")
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
        state.free()
        if reason == "lost":
            self._lost(attempt, "could not renew its lease; handler abandoned")
        else:
            if reason == "timeout":
                timeout = attempt.spec.job_timeout(attempt.job.expire_seconds) or 0
                output, action = timeout_output(timeout), "job_timeout"
            else:
                output, action = shutdown_output(), "job_abandoned"
            log.log(
                logging.WARNING if reason == "timeout" else logging.INFO,
                "job %s of %r %s",
                attempt.job.id,
                attempt.job.name,
                "timed out" if reason == "timeout" else "was still running at shutdown",
                extra=self._extra(action, attempt),
            )
            self._inbox.put(Pending("fail", attempt, output, reason))
        if not attempt.inline:
            # (A job run on a fetch thread is left to it; see _detaching.)
            self._cut_loose(attempt)
        state.wake.set()
        return True

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
            if self._metrics is not None:
                if p.kind == "complete":
                    self._metrics.completed(job.name)
                else:
                    self._metrics.failed(job.name, states.get(job.id) == JobState.RETRY)
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


def monotonic() -> float:
    """The clock of leases, deadlines and flushes (patchable in tests)."""
    return time.monotonic()
