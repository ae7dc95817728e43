"""``AsyncWorker``: async handlers as asyncio tasks, one fetch loop per queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from ..errors import InvalidOptionsError
from ..names import DEFAULT_SCHEMA
from ..service_async import AsyncQueueService
from ._attempt import ABANDONED, RUNNING, SETTLING, Attempt, ErrorCallback, Pending, group
from ._backoff import Backoff
from ._base import WorkerBase, listen_conninfo, monotonic
from ._signals import SIGNALS
from .config import DEFAULT_SHUTDOWN_TIMEOUT, HandlerSpec
from .listener import Listener, Subscription

log = logging.getLogger("alkstore_sa.worker")

TICK = 0.2


class _Lost(Exception):
    pass


class _QueueState:
    def __init__(self, spec: HandlerSpec) -> None:
        self.spec = spec
        self.wake = asyncio.Event()
        self.in_flight = 0
        self.backlog = False
        self.task: asyncio.Task[None] | None = None


class AsyncWorker(WorkerBase):
    """Runs async handlers for queued jobs as asyncio tasks.

    Example::

        worker = AsyncWorker(async_engine, schema="pgboss", concurrency=20)
        @worker.handler("emails", batch_size=10)
        async def send_email(job):
            await mailer.send(**job.data)
        await worker.run()                      # until SIGINT/SIGTERM

    Same options and semantics as :class:`~alkstore_sa.Worker`, with an
    :class:`~sqlalchemy.ext.asyncio.AsyncEngine` or an ``async_sessionmaker``;
    transactional handlers get an ``AsyncSession``. A handler past its timeout
    (or still running when the shutdown timeout ends) is cancelled.
    """

    _async_handlers = True

    def __init__(
        self,
        bind: AsyncEngine | async_sessionmaker[AsyncSession],
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
        if isinstance(bind, AsyncEngine):
            self.engine = bind
            self.sessions: async_sessionmaker[AsyncSession] = async_sessionmaker(bind)
        elif isinstance(bind, async_sessionmaker) and isinstance(bind.kw.get("bind"), AsyncEngine):
            self.engine = bind.kw["bind"]
            self.sessions = bind
        else:
            raise InvalidOptionsError(
                "bind", "expected an AsyncEngine or an async_sessionmaker bound to one"
            )
        settings = {k: v for k, v in locals().items() if k not in ("self", "bind", "__class__")}
        super().__init__(**settings)
        self._queues: dict[str, _QueueState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = asyncio.Event()
        self._stop_requested = asyncio.Event()
        self._force = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stop_started = False
        self._pending: list[Pending] = []
        self._pending_event = asyncio.Event()
        self._flushing = False
        self._completer_stop = asyncio.Event()
        self._give_up = asyncio.Event()
        self._keeper_stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._job_tasks: set[asyncio.Task[None]] = set()
        self._subscription: Subscription | None = None
        self._supervisor = self._make_supervisor("AsyncSupervisor", self.engine)

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the fetch loops and helpers as tasks of the running loop; returns at once."""
        if self._loop is not None:
            raise RuntimeError("an AsyncWorker can be started once")
        if not self._specs:
            raise InvalidOptionsError("handlers", "register at least one handler before starting")
        self._loop = asyncio.get_running_loop()
        self._tasks.append(asyncio.create_task(self._complete_loop(), name="alkstore-completer"))
        if self.listen:
            conninfo = self.listen_dsn or listen_conninfo(self.engine.url)
            self._listener = Listener.acquire(conninfo)
            self._subscription = self._listener.subscribe(self.channel, self._notified)
            ready = await asyncio.to_thread(self._listener.wait_listening, self.channel, 2.0)
            if not ready:
                log.warning(
                    "not listening yet; relying on polling until the listener connects",
                    extra={"action": "listener_pending", "worker": self.name},
                )
        for spec in self._specs.values():
            state = self._queues[spec.queue] = _QueueState(spec)
            state.task = asyncio.create_task(self._fetch_loop(state), name=f"alkstore-{spec.queue}")
        self._tasks.append(asyncio.create_task(self._keep(), name="alkstore-keeper"))
        if self._supervisor is not None:
            await self._supervisor.start()
        self._log_started()

    async def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully; see :meth:`Worker.stop <alkstore_sa.Worker.stop>`.

        Handlers still running when ``timeout`` ends are cancelled and their jobs
        failed for retry.
        """
        self._stop_requested.set()
        if self._stop_started:
            await self._stopped.wait()
            return
        self._stop_started = True
        try:
            if self._loop is not None:
                await self._shutdown(self.shutdown_timeout if timeout is None else timeout)
        finally:
            self._stopped.set()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Start, wait for SIGINT/SIGTERM (or :meth:`stop`), then stop gracefully.

        A second signal stops at once.
        """
        await self.start()
        loop = asyncio.get_running_loop()
        installed = []
        if handle_signals:
            for sig in SIGNALS:
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self._signal, int(sig))
                    installed.append(sig)
        try:
            await self._stop_requested.wait()
            await self.stop()
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)

    async def _shutdown(self, timeout: float) -> None:
        self._log_stopping(timeout)
        self._stopping.set()
        for state in self._queues.values():
            state.wake.set()
        loops = [s.task for s in self._queues.values() if s.task is not None]
        if loops:
            await asyncio.wait(loops, timeout=10.0)
        deadline = monotonic() + timeout
        while self._running() and monotonic() < deadline and not self._force.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._force.wait(), min(0.05, deadline - monotonic()))
        handles = []
        for attempt in self._running():
            pending = self._abandon(attempt, "shutdown")
            if pending is not None:
                self._put(pending)
                handles.append(attempt.handle)
                attempt.handle.cancel()
        if handles:
            await asyncio.wait(handles, timeout=1.0)
        self._completer_stop.set()
        self._pending_event.set()
        completer = self._tasks[0]
        done, _ = await asyncio.wait([completer], timeout=max(5.0, timeout))
        if not done:
            self._give_up.set()
            await asyncio.wait([completer], timeout=1.0)
        self._keeper_stop.set()
        await asyncio.wait(self._tasks[1:], timeout=5.0)
        if self._listener is not None and self._subscription is not None:
            self._listener.release(self._subscription)
        if self._supervisor is not None:
            try:
                await self._supervisor.stop(timeout)
            except Exception as exc:
                log.exception("supervisor stop failed", extra={"action": "supervisor_error"})
                self._report(exc, None)
        self._log_stopped()

    # ------------------------------------------------------------ wake-ups

    def wake(self, queue: str | None = None) -> None:
        """Make ``queue``'s loop (or every loop) fetch now. Call it from the loop's thread."""
        for name, state in self._queues.items():
            if queue is None or name == queue:
                state.wake.set()

    def _notified(self, payload: str | None) -> None:
        # Called on the listener thread: hop onto the worker's loop.
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # loop closed
                self._loop.call_soon_threadsafe(self.wake, payload)

    # ------------------------------------------------------------ fetching

    def _service(self, session: AsyncSession) -> AsyncQueueService:
        return AsyncQueueService(session, schema=self.schema, notify=False)

    async def _fetch_loop(self, state: _QueueState) -> None:
        spec, backoff = state.spec, Backoff()
        while not self._stopping.is_set():
            free = spec.concurrency - state.in_flight
            if free < spec.fetch_threshold(state.backlog):
                await _wait(state.wake, spec.poll_interval)
                state.wake.clear()
                continue
            state.wake.clear()
            want = min(spec.fetch_size, free)
            fetched_at = monotonic()
            try:
                async with self.sessions.begin() as session:
                    svc = self._service(session)
                    jobs = await svc.fetch(spec.queue, want, priority=spec.priority)
            except Exception as exc:
                delay = backoff.next()
                self._loop_error("fetch", spec.queue, exc, delay)
                await _wait(self._stopping, delay)
                continue
            backoff.reset()
            state.in_flight += len(jobs)
            state.backlog = len(jobs) == want
            for job in jobs:
                attempt = self._begin(spec, job, fetched_at)
                task = asyncio.create_task(self._execute(state, attempt))
                # The loop keeps only weak references to tasks: hold them here.
                self._job_tasks.add(task)
                task.add_done_callback(self._job_tasks.discard)
                attempt.handle = task
            if len(jobs) < want:
                await _wait(state.wake, spec.poll_interval)

    # ------------------------------------------------------------ running

    async def _execute(self, state: _QueueState, attempt: Attempt) -> None:
        try:
            if attempt.spec.transactional:
                pending = await self._run_transactional(attempt)
            else:
                try:
                    result = await attempt.spec.fn(attempt.job)
                except asyncio.CancelledError as exc:
                    if attempt.status != RUNNING:
                        return  # cancelled by us (timeout, shutdown): already settled
                    if _task_cancelled():
                        raise  # this task itself is being cancelled: the loop is going away
                    # The handler let a CancelledError of its own escape (it awaited
                    # something cancelled elsewhere): that is a failure of the job.
                    pending = self._finished(attempt, "fail", exc)
                except Exception as exc:
                    pending = self._finished(attempt, "fail", exc)
                else:
                    pending = self._finished(attempt, "complete", result)
            if pending is not None:
                self._put(pending)
        finally:
            state.in_flight -= 1
            if state.backlog:
                state.wake.set()

    async def _run_transactional(self, attempt: Attempt) -> Pending | None:
        job, spec = attempt.job, attempt.spec
        try:
            async with self.sessions() as session, session.begin():
                result = await spec.fn(job, session)
                if not attempt.take(SETTLING):
                    raise _Lost
                self._forget(attempt)
                settlement = attempt.settlement(result)
                done = await self._service(session).complete_many(job.name, [settlement])
                if not done.affected:
                    raise _Lost
        except _Lost:
            if attempt.status == SETTLING:
                self._lost(attempt, "could not be completed (handler writes rolled back)")
            return None
        except asyncio.CancelledError as exc:
            if attempt.status != RUNNING:
                return None
            if _task_cancelled():
                raise
            return self._finished(attempt, "fail", exc)
        except Exception as exc:
            return self._finished(attempt, "fail", exc, taken=attempt.status == SETTLING)
        self._count(job.name, "completed")
        log.debug("job %s completed", job.id, extra=self._extra("job_completed", attempt))
        return None

    # ------------------------------------------------------------ settling

    def _put(self, pending: Pending) -> None:
        self._pending.append(pending)
        self._pending_event.set()

    async def _complete_loop(self) -> None:
        backoff = Backoff()
        while True:
            while not self._pending and not self._completer_stop.is_set():
                self._pending_event.clear()
                await self._pending_event.wait()
            if not self._pending:
                return
            if not self._completer_stop.is_set():
                # Gather the jobs that finish within the window into one batch.
                await asyncio.sleep(self.flush_interval)
            batch, self._pending = self._pending, []
            while batch:
                try:
                    await self._flush(batch)
                    backoff.reset()
                except Exception as exc:
                    delay = backoff.next()
                    self._loop_error("settle", None, exc, delay)
                    if await _wait(self._give_up, delay):
                        log.error(
                            "gave up settling %d job(s) at shutdown; they stay active until "
                            "they expire and are then retried",
                            len(batch),
                            extra={"action": "settle_abandoned", "count": len(batch)},
                        )
                        break

    async def _flush(self, batch: list[Pending]) -> None:
        for (queue, kind), items in group(batch).items():
            async with self.sessions.begin() as session:
                svc = self._service(session)
                settlements = [p.attempt.settlement(p.output) for p in items]
                if kind == "complete":
                    result: Any = await svc.complete_many(queue, settlements)
                else:
                    result = await svc.fail_many(queue, settlements)
            done = set(map(id, items))
            batch[:] = [p for p in batch if id(p) not in done]
            self._settled(items, result)
            if kind == "fail" and "retry" in result.states.values():
                self.wake(queue)

    # ------------------------------------------------------------ leases

    async def _keep(self) -> None:
        while not await _wait(self._keeper_stop, TICK):
            now = monotonic()
            due: dict[tuple[str, int], list[Attempt]] = defaultdict(list)
            for attempt in self._running():
                if attempt.deadline is not None and now >= attempt.deadline:
                    pending = self._abandon(attempt, "timeout")
                    if pending is not None:
                        self._put(pending)
                        attempt.handle.cancel()
                elif attempt.lease_due(now):
                    due[(attempt.job.name, attempt.job.expire_seconds)].append(attempt)
            for (queue, extend_by), attempts in due.items():
                await self._extend(queue, extend_by, attempts)

    async def _extend(self, queue: str, extend_by: int, attempts: list[Attempt]) -> None:
        started = monotonic()
        try:
            async with self.sessions.begin() as session:
                ids = await self._service(session).extend_leases(
                    queue, [a.settlement() for a in attempts], extend_by
                )
        except Exception as exc:
            self._loop_error("lease", queue, exc, TICK)
            return
        kept = set(ids)
        for attempt in attempts:
            if attempt.job.id in kept:
                attempt.lease_start, attempt.lease_seconds = started, float(extend_by)
                log.debug(
                    "lease of job %s extended by %d s",
                    attempt.job.id,
                    extend_by,
                    extra=self._extra("lease_extended", attempt),
                )
            elif attempt.take(ABANDONED):
                # The job is no longer ours (expired and failed, cancelled,
                # deleted): stop working on it.
                self._forget(attempt)
                self._lost(attempt, "could not renew its lease; handler cancelled")
                attempt.handle.cancel()


async def _wait(event: asyncio.Event, timeout: float) -> bool:
    """Wait for ``event`` at most ``timeout`` seconds; whether it was set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), timeout)
    return event.is_set()


def _task_cancelled() -> bool:
    """Whether the running task has a cancellation request pending (not merely a
    CancelledError raised by something it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
