"""``Worker``: sync handlers in thread pools, one fetch thread per queue.

The logic is :class:`~alkstore_sa.worker._base.WorkerBase`'s; this module answers
its steps with blocking calls and threads.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from ..errors import InvalidOptionsError, shown
from ..ops import driver
from ..steps import Run, Steps, answering, drive
from ..supervision import Supervisor
from . import _signals
from ._attempt import Attempt
from ._base import QueueState, WorkerBase
from ._threads import Pool


class Worker(WorkerBase[Engine | sessionmaker[Session]]):
    """Runs sync handlers for queued jobs, in a thread pool per queue.

    Example::

        worker = Worker(engine, schema="pgboss", concurrency=5)
        @worker.handler("emails")
        def send_email(job):
            mailer.send(**job.data)
        worker.run()                            # until SIGINT/SIGTERM

    Each queue has a fetch thread that claims up to ``batch_size`` jobs when
    handler slots or ``prefetch`` places are free, into a buffer that up to
    ``concurrency`` handler threads take jobs from; finished jobs are settled in
    batches. ``NOTIFY`` wakes the fetch threads at once,
    polling every ``poll_interval`` is the floor. Long jobs have their lease
    renewed; a job whose lease is lost (expired, cancelled or deleted meanwhile)
    is abandoned: its handler's result is ignored and its slot goes to the next
    job. The supervisor runs alongside unless ``supervise=False``.

    :param bind: an :class:`~sqlalchemy.engine.Engine`, or a ``sessionmaker``
        bound to one (its settings are used for transactional handlers).
    :param schema: the queue schema.
    :param handlers: ``{queue: fn or HandlerSpec}``, as an alternative to
        :meth:`handler`.
    :param concurrency: default for every handler, as are the next five
        (see :class:`~alkstore_sa.worker.HandlerSpec`).
    :param batch_size: default for every handler.
    :param prefetch: default for every handler: jobs claimed ahead of the free
        handler slots (by default four times ``concurrency``; ``0`` for none).
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
    :param name: the worker's name in logs, and in the instance registry.
    :param register_instance: at schema 46, keep a row in the ``instance``
        table as Node pg-boss instances do (registered at start, refreshed every
        ``instance_heartbeat_seconds``, stopped at stop), listed by
        :meth:`~alkstore_sa.QueueService.get_instances`; nothing at schema 26.
    :param instance_heartbeat_seconds: 1 to 3600 (30, pg-boss's default); the
        row reads as not live after three missed heartbeats.
    :param metrics: Prometheus counters of the jobs this worker claims, completes,
        fails, retries and loses, and histograms of handler duration and pickup
        latency (``alkstore_worker_*``, see the "Export Prometheus metrics" page). ``None`` (the
        default): counted into ``prometheus_client``'s default registry when it
        is installed (the ``metrics`` extra), else not; ``True``: the same, and
        an error without it; ``False``: nothing counted; a
        ``prometheus_client.CollectorRegistry``: counted there. Every worker of
        a process shares the same metric objects (labels ``schema`` and ``queue``).
    :param backend: the database backend profile (the "Database backends" page), as
        :class:`~alkstore_sa.QueueService` takes it; also the supervisor's. Under a
        profile without ``LISTEN``/``NOTIFY`` the worker polls (``listen`` is off).
    :param liveness_seconds: schema 46: the heartbeat (10 to 3600 seconds, 20 by
        default) the worker's claims give a job that has none; the worker renews it
        while the job is in hand and, every half of it, fails for retry the jobs of
        its queues whose heartbeat stopped, so that a job whose worker died comes
        back within about a minute, not after its ``expire_seconds``. ``None``: no
        heartbeat given, no sweep. At schema 26 (no heartbeats) the worker's claims
        record themselves in our ``alkstore_claim`` table instead and the worker renews
        one row of its own every quarter of it; the sweep fails the jobs of workers
        that stopped renewing for their ``liveness_seconds`` (the "Guarantees" page).
    """

    _supervisor_class = Supervisor
    _inline_jobs = True
    engine: Engine
    sessions: sessionmaker[Session]

    def _bind(self, bind: Engine | sessionmaker[Session]) -> tuple[Engine, sessionmaker[Session]]:
        if isinstance(bind, Engine):
            return bind, sessionmaker(bind)
        if isinstance(bind, sessionmaker) and isinstance(bind.kw.get("bind"), Engine):
            return bind.kw["bind"], bind
        raise InvalidOptionsError("bind", "expected an Engine or a sessionmaker bound to one")

    def _event(self) -> threading.Event:
        return threading.Event()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start fetching and running jobs in background threads; returns at once."""
        if hasattr(self, "_pools"):
            raise RuntimeError("a Worker can be started once")
        self._pools: dict[str, Pool] = {}
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        drive(self._starting(), self._answer)

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully: no more fetching, running jobs get ``timeout`` seconds.

        Jobs still running after that are failed with the output
        ``{"name": "WorkerShutdown", "message": "worker shut down while active"}``,
        so they are retried. ``timeout`` defaults to ``shutdown_timeout``; ``0``
        stops at once. Safe to call more than once and from any thread.
        """
        self._stop_requested.set()
        if not hasattr(self, "_pools"):
            return
        if not self._stop_lock.acquire(blocking=False):
            self._stopped.wait()
            return
        try:
            if not self._stopped.is_set():
                timeout = self.shutdown_timeout if timeout is None else timeout
                drive(self._shutting_down(timeout), self._answer)
                for pool in self._pools.values():
                    pool.shutdown()
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

    # ------------------------------------------------------------ answering steps

    @functools.cached_property
    def _answer(self) -> Callable[[Any], Any]:
        return answering(self._run)

    def _run(self, step: Any) -> Any:
        """This runtime's answer to :class:`Run` (the rest: :func:`answering`)."""
        if type(step) is Run:
            if step.session is not None:
                return driver.run(step.session, step.op, self._options)
            if step.autocommit:
                # begin(): the connection stays in autocommit (each statement commits
                # on its own); SQLAlchemy then knows it in use, so a direct statement
                # (ops/_direct.py) may run on its driver connection.
                with self._autocommit.connect() as conn, conn.begin():
                    return driver.run(conn, step.op, self._options, autocommit=True)
            with self.sessions.begin() as session:
                return driver.run(session, step.op, self._options)
        raise TypeError(f"not a step: {shown(step)}")

    def _spawn(self, steps: Steps[Any], name: str) -> threading.Thread:
        thread = threading.Thread(target=drive, args=(steps, self._answer), name=name, daemon=True)
        thread.start()
        return thread

    def _start_runner(self, state: QueueState, attempt: Attempt) -> None:
        pool = self._pools.get(state.spec.queue)
        if pool is None:
            pool = self._pools[state.spec.queue] = Pool(state.spec.queue, state.spec.concurrency)
        pool.submit(lambda: drive(self._handling(state, attempt), self._answer))

    def _cut_loose(self, attempt: Attempt) -> None:
        # Python cannot stop a thread: the handler runs on, its result ignored,
        # and a new thread keeps the queue's concurrency.
        if not self._stopping.is_set():
            self._pools[attempt.job.name].replace()

    def _in_transaction(self, attempt: Attempt) -> None:
        with self.sessions() as session, session.begin():
            drive(self._committing(attempt, session), self._answer)
