"""``Worker``: sync handlers in thread pools, one fetch loop per queue."""

from __future__ import annotations

import functools
import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InvalidOptionsError
from ..names import DEFAULT_SCHEMA
from ..service import QueueService
from . import _signals
from ._attempt import RUNNING, SETTLING, Attempt, ErrorCallback, Pending, group
from ._backoff import Backoff
from ._base import WorkerBase, listen_conninfo, monotonic
from ._threads import Completer, Pool
from .config import DEFAULT_SHUTDOWN_TIMEOUT, HandlerSpec
from .listener import Listener, Subscription

log = logging.getLogger("alkstore_sa.worker")

TICK = 0.2
"""Seconds between checks of leases and deadlines."""


class _Lost(Exception):
    """A transactional handler's job was taken away: roll its writes back."""


class _QueueState:
    def __init__(self, spec: HandlerSpec) -> None:
        self.spec = spec
        self.wake = threading.Event()
        self.in_flight = 0
        self.backlog = False
        self.lock = threading.Lock()
        self.pool = Pool(spec.queue, spec.concurrency)
        self.thread: threading.Thread | None = None


class Worker(WorkerBase):
    """Runs sync handlers for queued jobs, in a thread pool per queue.

    Example::

        worker = Worker(engine, schema="pgboss", concurrency=4)
        @worker.handler("emails", batch_size=4)
        def send_email(job):                    # returns -> completed, raises -> failed
            return mailer.send(**job.data)
        @worker.handler("invoices", transactional=True)
        def bill(job, session):                 # commits with the job's completion
            session.add(Invoice(order_id=job.data["order"]))
        worker.run()                            # until SIGINT/SIGTERM

    :param bind: an :class:`~sqlalchemy.engine.Engine` or a
        :class:`~sqlalchemy.orm.sessionmaker` bound to one (its settings are used
        for transactional handlers).
    :param schema: the queue schema.
    :param handlers: ``{queue: fn or HandlerSpec}``, as an alternative to
        :meth:`handler`.
    :param concurrency: default for every handler, as are the next five
        (see :class:`~alkstore_sa.worker.HandlerSpec`).
    :param batch_size: default for every handler.
    :param poll_interval: default for every handler.
    :param extend_lease: default for every handler.
    :param timeout: default for every handler.
    :param priority: default for every handler.
    :param shutdown_timeout: seconds :meth:`stop` lets running jobs finish.
    :param listen: wake up on ``NOTIFY`` (polling remains the floor).
    :param listen_dsn: connection string of the listening connection, if the
        engine's URL is not enough (e.g. a password given in ``connect_args``).
    :param supervise: run the supervisor (expiration, deletion, counters, cron)
        with the worker; ``supervisor_options`` are passed to it.
    :param on_error: ``on_error(exc, job_or_None)``, called for handler errors and
        for errors of the worker's own loops.
    :param flush_interval: how long a finished job waits for others to be
        completed in the same statement.
    """

    def __init__(
        self,
        bind: Engine | sessionmaker[Session],
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
    ) -> None:
        if isinstance(bind, Engine):
            self.engine = bind
            self.sessions: sessionmaker[Session] = sessionmaker(bind)
        elif isinstance(bind, sessionmaker) and isinstance(bind.kw.get("bind"), Engine):
            self.engine = bind.kw["bind"]
            self.sessions = bind
        else:
            raise InvalidOptionsError("bind", "expected an Engine or a sessionmaker bound to one")
        settings = {k: v for k, v in locals().items() if k not in ("self", "bind", "__class__")}
        super().__init__(**settings)
        self._queues: dict[str, _QueueState] = {}
        self._stopping = threading.Event()
        self._stop_requested = threading.Event()
        self._force = threading.Event()
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._started = False
        self._completer = Completer(self._flush, self.flush_interval)
        self._completer.on_error = lambda exc, delay: self._loop_error("settle", None, exc, delay)
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        self._subscription: Subscription | None = None
        self._supervisor = self._make_supervisor("Supervisor", self.engine)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start fetching and running jobs in background threads; returns at once."""
        if self._started:
            raise RuntimeError("a Worker can be started once")
        if not self._specs:
            raise InvalidOptionsError("handlers", "register at least one handler before starting")
        self._started = True
        self._completer.start()
        if self.listen:
            self._listener = Listener.acquire(self.listen_dsn or listen_conninfo(self.engine.url))
            self._subscription = self._listener.subscribe(self.channel, self._notified)
            if not self._listener.wait_listening(self.channel, 2.0):
                log.warning(
                    "not listening yet; relying on polling until the listener connects",
                    extra={"action": "listener_pending", "worker": self.name},
                )
        for spec in self._specs.values():
            state = self._queues[spec.queue] = _QueueState(spec)
            state.thread = threading.Thread(
                target=self._loop, args=(state,), name=f"alkstore-fetch-{spec.queue}", daemon=True
            )
            state.thread.start()
        self._keeper = threading.Thread(target=self._keep, name="alkstore-keeper", daemon=True)
        self._keeper.start()
        if self._supervisor is not None:
            self._supervisor.start()
        self._log_started()

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully: no more fetching, running jobs get ``timeout`` seconds.

        Jobs still running after that are failed with the output
        ``{"name": "WorkerShutdown", "message": "worker shut down while active"}``,
        so they are retried. ``timeout`` defaults to ``shutdown_timeout``; ``0``
        stops at once. Safe to call more than once and from any thread.
        """
        self._stop_requested.set()
        if not self._stop_lock.acquire(blocking=False):
            self._stopped.wait()
            return
        try:
            if self._started and not self._stopped.is_set():
                self._shutdown(self.shutdown_timeout if timeout is None else timeout)
        finally:
            self._stopped.set()
            self._stop_lock.release()

    def run(self, *, handle_signals: bool = True) -> None:
        """Start, block until SIGINT/SIGTERM (or :meth:`stop`), then stop gracefully.

        A second signal stops at once (running jobs are failed for retry).
        """
        self.start()
        with _signals.installed(self._signal if handle_signals else None):
            while not self._stop_requested.wait(0.2):
                pass
            self.stop()

    def _shutdown(self, timeout: float) -> None:
        self._log_stopping(timeout)
        self._stopping.set()
        for state in self._queues.values():
            state.wake.set()
        for state in self._queues.values():
            if state.thread is not None:
                # A fetch never waits on row locks (SKIP LOCKED); the bound is for
                # a database that stopped answering.
                state.thread.join(10.0)
        deadline = monotonic() + timeout
        while self._running() and monotonic() < deadline and not self._force.is_set():
            self._force.wait(min(0.05, max(0.0, deadline - monotonic())))
        for attempt in self._running():
            pending = self._abandon(attempt, "shutdown")
            if pending is not None:
                self._completer.put(pending)
        for state in self._queues.values():
            state.pool.shutdown()
        self._completer.stop(max(5.0, timeout))
        self._keeper_stop.set()
        if self._keeper is not None:
            self._keeper.join(5.0)
        if self._listener is not None and self._subscription is not None:
            self._listener.release(self._subscription)
        if self._supervisor is not None:
            try:
                self._supervisor.stop(timeout)
            except Exception as exc:
                log.exception("supervisor stop failed", extra={"action": "supervisor_error"})
                self._report(exc, None)
        self._log_stopped()

    # ------------------------------------------------------------ wake-ups

    def wake(self, queue: str | None = None) -> None:
        """Make ``queue``'s loop (or every loop) fetch now."""
        for name, state in self._queues.items():
            if queue is None or name == queue:
                state.wake.set()

    def _notified(self, payload: str | None) -> None:
        self.wake(payload)

    # ------------------------------------------------------------ fetching

    def _service(self, session: Session) -> QueueService:
        return QueueService(session, schema=self.schema, notify=False)

    def _loop(self, state: _QueueState) -> None:
        spec, backoff = state.spec, Backoff()
        while not self._stopping.is_set():
            with state.lock:
                free = spec.concurrency - state.in_flight
                threshold = spec.fetch_threshold(state.backlog)
            if free < threshold:
                state.wake.wait(spec.poll_interval)
                state.wake.clear()
                continue
            state.wake.clear()
            want = min(spec.fetch_size, free)
            fetched_at = monotonic()
            try:
                with self.sessions.begin() as session:
                    jobs = self._service(session).fetch(spec.queue, want, priority=spec.priority)
            except Exception as exc:
                delay = backoff.next()
                self._loop_error("fetch", spec.queue, exc, delay)
                self._stopping.wait(delay)
                continue
            backoff.reset()
            with state.lock:
                state.in_flight += len(jobs)
                state.backlog = len(jobs) == want
            for job in jobs:
                attempt = self._begin(spec, job, fetched_at)
                state.pool.submit(functools.partial(self._execute, state, attempt))
            if len(jobs) < want:
                state.wake.wait(spec.poll_interval)

    # ------------------------------------------------------------ running

    def _execute(self, state: _QueueState, attempt: Attempt) -> bool:
        """Run one job's handler on a pool thread; ``True`` retires the thread."""
        attempt.handle = threading.current_thread()
        try:
            if attempt.spec.transactional:
                pending = self._run_transactional(attempt)
            else:
                try:
                    result = attempt.spec.fn(attempt.job)
                except BaseException as exc:
                    pending = self._finished(attempt, "fail", exc)
                else:
                    pending = self._finished(attempt, "complete", result)
            if pending is not None:
                self._completer.put(pending)
        finally:
            with state.lock:
                abandoned = attempt.status not in (RUNNING, SETTLING)
                if not abandoned:
                    state.in_flight -= 1
                wake = state.backlog
            if wake:
                state.wake.set()
        return abandoned

    def _run_transactional(self, attempt: Attempt) -> Pending | None:
        job, spec = attempt.job, attempt.spec
        try:
            with self.sessions() as session, session.begin():
                result = spec.fn(job, session)
                if not attempt.take(SETTLING):
                    raise _Lost  # abandoned meanwhile: its fail wins, roll back
                self._forget(attempt)
                done = self._service(session).complete_many(job.name, [attempt.settlement(result)])
                if not done.affected:
                    raise _Lost
        except _Lost:
            if attempt.status == SETTLING:
                self._lost(attempt, "could not be completed (handler writes rolled back)")
            return None
        except BaseException as exc:
            # The handler's writes (and the completion, if it ran) rolled back
            # together: fail the job so that it runs again.
            return self._finished(attempt, "fail", exc, taken=attempt.status == SETTLING)
        self._settled_inline(attempt)
        return None

    def _settled_inline(self, attempt: Attempt) -> None:
        self._count(attempt.job.name, "completed")
        log.debug("job %s completed", attempt.job.id, extra=self._extra("job_completed", attempt))

    # ------------------------------------------------------------ settling

    def _flush(self, batch: list[Pending]) -> None:
        for (queue, kind), items in group(batch).items():
            with self.sessions.begin() as session:
                svc = self._service(session)
                settlements = [p.attempt.settlement(p.output) for p in items]
                if kind == "complete":
                    result: Any = svc.complete_many(queue, settlements)
                else:
                    result = svc.fail_many(queue, settlements)
            # Written: never write these again, even if a later group fails.
            done = set(map(id, items))
            batch[:] = [p for p in batch if id(p) not in done]
            self._settled(items, result)
            if kind == "fail" and "retry" in result.states.values():
                self.wake(queue)  # a retry without delay is due at once

    # ------------------------------------------------------------ leases

    def _keep(self) -> None:
        """Renew leases of long jobs and abandon jobs past their timeout."""
        while not self._keeper_stop.wait(TICK):
            now = monotonic()
            due: dict[tuple[str, int], list[Attempt]] = defaultdict(list)
            for attempt in self._running():
                if attempt.deadline is not None and now >= attempt.deadline:
                    pending = self._abandon(attempt, "timeout")
                    if pending is not None:
                        self._completer.put(pending)
                        state = self._queues[attempt.job.name]
                        with state.lock:
                            state.in_flight -= 1
                        state.pool.replace()
                        state.wake.set()
                elif attempt.lease_due(now):
                    due[(attempt.job.name, attempt.job.expire_seconds)].append(attempt)
            for (queue, extend_by), attempts in due.items():
                self._extend(queue, extend_by, attempts)

    def _extend(self, queue: str, extend_by: int, attempts: list[Attempt]) -> None:
        started = monotonic()
        try:
            with self.sessions.begin() as session:
                kept = set(
                    self._service(session).extend_leases(
                        queue, [a.settlement() for a in attempts], extend_by
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
            elif attempt.status == RUNNING:
                self._lost(attempt, "could not renew its lease")
