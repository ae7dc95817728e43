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
import signal
import threading
from typing import TypeVar

from .._engine_cache import version_due
from .._humanize import duration as human_duration
from ..errors import InvalidOptionsError
from ..steps import Invoke, Join, Run, Steps, Wait
from ._attempt import RUNNING
from ._core import WorkerCore, listen_conninfo, monotonic
from ._instance import InstanceRegistration
from ._leases import Leases
from ._queue_state import QueueState
from .listener import Listener

__all__ = ["QueueState", "WorkerBase", "WorkerCore", "listen_conninfo", "monotonic"]

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")

WAKEUP_PROBE_SECONDS = 5.0
"""How long a worker waits, once at start, for its own probe notification."""

FETCH_JOIN_SECONDS = 10.0
"""How long shutdown waits for a fetch loop. A fetch never waits on row locks
(SKIP LOCKED); the bound is for a database that stopped answering."""


def _signal_name(signum: int) -> str:
    """``"SIGTERM"`` for its number; the number for one Python does not name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class WorkerBase(Leases[B], InstanceRegistration[B]):
    """Every loop common to both workers, put together; starting and stopping them.

    Its parts, each a mixin on :class:`WorkerCore` (settings, bookkeeping, the
    runtime's hooks): ``Settling`` (the completer), ``Running`` (a handler's run),
    ``Fetching`` (the fetch loops), ``Leases`` (the keeper) and
    ``InstanceRegistration`` (the instance registry).
    """

    # ------------------------------------------------------------ starting

    def _starting(self) -> Steps[None]:
        if not self._specs:
            raise InvalidOptionsError("handlers", "register at least one handler before starting")
        if self.register_instance:
            # Registered before the first fetch, as Node registers in start() before work.
            yield from self._beat()
        self._helpers.append(self._spawn(self._completing(), "alkstore-completer"))
        listening: bool | None = None  # None: not asked to listen
        if self.listen:
            conninfo = self.listen_dsn or listen_conninfo(self.engine.url)
            self._listener = Listener.acquire(conninfo)
            self._subscription = self._listener.subscribe(self.channel, self._notified)
            wait = Invoke(self._listener.wait_listening, (self.channel, 2.0), blocking=True)
            listening = bool((yield wait))
            if not listening:
                log.warning(
                    "not listening yet; relying on polling until the listener connects",
                    extra={"action": "listener_pending", "worker": self.name},
                )
            threading.Thread(
                target=self._probe_wakeups,
                args=(self._listener, conninfo),
                name="alkstore-wakeup-probe",
                daemon=True,
            ).start()
        for spec in self._specs.values():
            state = self._queues[spec.queue] = QueueState(spec, self._event())
            state.runner = self._spawn(self._fetching(state), f"alkstore-fetch-{spec.queue}")
        self._helpers.append(self._spawn(self._keeping(), "alkstore-keeper"))
        if self._supervisor is not None:
            yield Invoke(self._supervisor.start)
        if self.register_instance:
            with self._book:  # not once a stop that raced this start has deregistered
                if not self._deregistered:
                    self._registrar = self._spawn(self._registering(), "alkstore-registrar")
        version = yield from self._version_at_start()
        self._log_started(version, listening)

    def _version_at_start(self) -> Steps[int | None]:
        """The schema's version for the start line: the engine's cached reading, else
        one read (the instance registration has usually made it). ``None`` when it
        cannot be read now; the fetch loops then say why, and wait."""
        try:
            due = version_due(self._ctx, self._engine_state)
            if due is not None:
                yield Run(due, autocommit=True)
        except Exception:
            return None
        return self._ctx.version

    def _log_started(self, version: int | None, listening: bool | None) -> None:
        """The one INFO line of a start: what the worker runs and how it hears of jobs
        (the "Logging" page)."""
        specs = list(self._specs.values())
        queues = ", ".join(
            f"{s.queue} (concurrency {s.concurrency}, prefetch {s.ahead}, batch {s.fetch_size})"
            for s in specs
        )
        poll = min(s.poll_interval for s in specs)
        if listening is None:
            why = (
                "no LISTEN/NOTIFY on this backend"
                if self.backend.has("noListenNotify")
                else ("listen=False")
            )
            wakeups = f"listener off ({why}): polling every {human_duration(poll)}"
        elif listening:
            wakeups = f"listener on (LISTEN {self.channel}), polling every {human_duration(poll)}"
        else:
            wakeups = (
                f"listener not connected yet: polling every {human_duration(poll)} until it is"
            )
        log.info(
            "worker %s started on schema %r (version %s): %s; %s; supervisor %s",
            self.name,
            self.schema,
            "unknown yet" if version is None else version,
            queues,
            wakeups,
            "on" if self._supervisor is not None else "off",
            extra={
                "action": "worker_started",
                "worker": self.name,
                "schema": self.schema,
                "schema_version": version,
                "queues": [s.queue for s in specs],
                "concurrency": {s.queue: s.concurrency for s in specs},
                "prefetch": {s.queue: s.ahead for s in specs},
                "batch_size": {s.queue: s.fetch_size for s in specs},
                "listening": listening,
                "supervise": self._supervisor is not None,
            },
        )

    def _signal(self, signum: int) -> None:
        """SIGINT/SIGTERM: the first asks for a graceful stop, the second for an immediate one.

        Each says so at INFO or WARNING, with what happens next: how long running
        handlers get, and what a second signal does."""
        name = _signal_name(signum)
        # Counted without the bookkeeping lock: a signal handler may run while the
        # thread it interrupts holds it.
        running = sum(1 for a in list(self._attempts.values()) if a.status == RUNNING)
        if self._stop_requested.is_set():
            log.warning(
                "worker %s: second signal (%s): stopping now; %d running job(s) are failed "
                "as WorkerShutdown (retried if they have retries left)",
                self.name,
                name,
                running,
                extra={
                    "action": "worker_force_stop",
                    "worker": self.name,
                    "signal": name,
                    "running": running,
                },
            )
            self._force.set()
        else:
            log.info(
                "worker %s: %s received: stopping; waiting up to %s (shutdown_timeout) for "
                "%d running job(s), then failing those still running as WorkerShutdown; "
                "a second SIGINT or SIGTERM stops at once",
                self.name,
                name,
                human_duration(self.shutdown_timeout),
                running,
                extra={
                    "action": "worker_signal",
                    "worker": self.name,
                    "signal": name,
                    "shutdown_timeout": self.shutdown_timeout,
                    "running": running,
                },
            )
            self._stop_requested.set()

    def _probe_wakeups(self, listener: Listener, listening_on: str) -> None:
        """Say once, at WARNING, when a notification sent the way senders send it
        does not reach the listener (the "Behind PgBouncer" page): new jobs are then
        found by polling only, up to ``poll_interval`` late."""
        sending_on = listen_conninfo(self.engine.url)
        heard = listener.probe(self.channel, sending_on, WAKEUP_PROBE_SECONDS)
        if heard is not False or self._stop_requested.is_set() or self._stopping.is_set():
            return  # heard, cannot tell, or the worker is stopping anyway
        same = listening_on == sending_on
        log.warning(
            "worker %s: wake-ups do not reach it: a notification sent through its engine "
            "was not heard within %g s on its listening connection%s; new jobs are found "
            "by polling only, up to %g s late. Give it a direct or session-pooled "
            "connection string to listen on: listen_dsn=... (alkstore worker --listen-url)",
            self.name,
            WAKEUP_PROBE_SECONDS,
            " (the engine's own URL: behind a pooler in transaction mode, LISTEN does not last)"
            if same
            else "",
            min((s.poll_interval for s in self._specs.values()), default=0.0),
            extra={"action": "wakeups_missing", "worker": self.name},
        )

    # ------------------------------------------------------------ stopping

    def _shutting_down(self, timeout: float) -> Steps[None]:
        log.debug(
            "worker %s stopping (up to %g s for running jobs)",
            self.name,
            timeout,
            extra={"action": "worker_stopping", "worker": self.name},
        )
        self._stopping.set()
        self.wake()
        yield Join([s.runner for s in self._queues.values()], FETCH_JOIN_SECONDS)
        yield from self._giving_back()
        deadline = monotonic() + timeout
        while self._running() and monotonic() < deadline and not self._force.is_set():
            yield Wait(self._force, min(0.05, max(0.0, deadline - monotonic())))
        handles = [a.handle for a in self._running() if self._abandon(a, "shutdown")]
        yield Join(handles, 1.0)  # cancelled tasks; a sync handler's thread is not waited for
        self._closing.set()
        self._inbox.event.set()
        completer, keeper = self._helpers
        # After a second signal nothing more is waited for than the settlements
        # of the jobs just failed need.
        forced = self._force.is_set()
        if not (yield Join([completer], 5.0 if forced else max(5.0, timeout))):
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
                yield Invoke(self._supervisor.stop, (0.0 if self._force.is_set() else timeout,))
            except Exception as exc:
                log.exception("supervisor stop failed", extra={"action": "supervisor_error"})
                self._report(exc, None)
        stats = {q: dataclasses.asdict(c) for q, c in self.stats().items()}
        troubled = any(c["failed"] or c["lost"] for c in stats.values())
        log.log(
            logging.INFO if troubled else logging.DEBUG,
            "worker %s stopped: %s",
            self.name,
            stats,
            extra={"action": "worker_stopped", "worker": self.name, "stats": stats},
        )
