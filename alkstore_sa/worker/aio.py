"""``AsyncWorker``: async handlers as asyncio tasks, one fetch task per queue.

The logic is :class:`~alkstore_sa.worker._base.WorkerBase`'s; this module answers
its steps by awaiting, and runs everything as tasks of the running loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from ..errors import InvalidOptionsError, shown
from ..ops import driver
from ..steps import Run, Steps, aanswering, adrive
from ..supervision import AsyncSupervisor
from ._attempt import Attempt
from ._base import QueueState, WorkerBase
from ._signals import SIGNALS


class AsyncWorker(WorkerBase[AsyncEngine | async_sessionmaker[AsyncSession]]):
    """Runs async handlers for queued jobs as asyncio tasks.

    Example::

        worker = AsyncWorker(async_engine, schema="pgboss", concurrency=20)
        @worker.handler("emails", batch_size=10)
        async def send_email(job):
            await mailer.send(**job.data)
        await worker.run()                      # until SIGINT/SIGTERM

    Same options and semantics as :class:`~alkstore_sa.Worker`, with an
    :class:`~sqlalchemy.ext.asyncio.AsyncEngine` or an ``async_sessionmaker``;
    transactional handlers get an ``AsyncSession``. A handler past its timeout,
    whose lease was lost, or still running when the shutdown timeout ends is
    cancelled.
    """

    _async_handlers = True
    _supervisor_class = AsyncSupervisor
    engine: AsyncEngine
    sessions: async_sessionmaker[AsyncSession]

    def _bind(
        self, bind: AsyncEngine | async_sessionmaker[AsyncSession]
    ) -> tuple[AsyncEngine, async_sessionmaker[AsyncSession]]:
        if isinstance(bind, AsyncEngine):
            return bind, async_sessionmaker(bind)
        if isinstance(bind, async_sessionmaker) and isinstance(bind.kw.get("bind"), AsyncEngine):
            return bind.kw["bind"], bind
        raise InvalidOptionsError(
            "bind", "expected an AsyncEngine or an async_sessionmaker bound to one"
        )

    def _event(self) -> asyncio.Event:
        return asyncio.Event()

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the fetch loops and helpers as tasks of the running loop; returns at once."""
        if hasattr(self, "_loop"):
            raise RuntimeError("an AsyncWorker can be started once")
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        self._stop_started = False
        # The loop keeps only weak references to tasks: hold the handlers' here.
        self._job_tasks: set[asyncio.Task[Any]] = set()
        await adrive(self._starting(), self._answer)

    async def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully; see :meth:`Worker.stop <alkstore_sa.Worker.stop>`.

        Handlers still running when ``timeout`` ends are cancelled and their jobs
        failed for retry.
        """
        self._stop_requested.set()
        if not hasattr(self, "_loop"):
            return
        if self._stop_started:
            await self._stopped.wait()
            return
        self._stop_started = True
        try:
            timeout = self.shutdown_timeout if timeout is None else timeout
            await adrive(self._shutting_down(timeout), self._answer)
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

    def _notified(self, payload: str | None) -> None:
        # Called on the listener thread: hop onto the worker's loop.
        with contextlib.suppress(RuntimeError):  # loop closed
            self._loop.call_soon_threadsafe(self.wake, payload)

    # ------------------------------------------------------------ answering steps

    @functools.cached_property
    def _answer(self) -> Callable[[Any], Awaitable[Any]]:
        return aanswering(self._run)

    async def _run(self, step: Any) -> Any:
        """This runtime's answer to :class:`Run` (the rest: :func:`aanswering`)."""
        if type(step) is Run:
            if step.session is not None:
                return await driver.arun(step.session, step.op, self._options)
            if step.autocommit:
                # begin(): still autocommit; see Worker._run.
                async with self._autocommit.connect() as conn, conn.begin():
                    return await driver.arun(conn, step.op, self._options, autocommit=True)
            async with self.sessions.begin() as session:
                return await driver.arun(session, step.op, self._options)
        raise TypeError(f"not a step: {shown(step)}")

    def _spawn(self, steps: Steps[Any], name: str) -> asyncio.Task[Any]:
        return asyncio.create_task(adrive(steps, self._answer), name=name)

    def _start_runner(self, state: QueueState, attempt: Attempt) -> None:
        task = asyncio.create_task(adrive(self._handling(state, attempt), self._answer))
        self._job_tasks.add(task)
        task.add_done_callback(self._job_tasks.discard)
        attempt.handle = task

    def _cut_loose(self, attempt: Attempt) -> None:
        attempt.handle.cancel()

    async def _in_transaction(self, attempt: Attempt) -> None:
        async with self.sessions() as session, session.begin():
            await adrive(self._committing(attempt, session), self._answer)
