"""The supervisor: expiration, retention, queue counters and cron, in the background.

Every worker process runs one by default; ``alkstore maintain`` runs one from
the command line. Several supervisors - Python or Node pg-boss - can watch the
same schema: the work is shared out through pg-boss's own throttle columns
(``queue.monitor_on``, ``queue.maintain_on``, ``version.cron_on``) and advisory
lock keys, so each step runs once per interval across the whole cluster.

What runs when (each timer is local; each step is then throttled cluster-wide):

=========================  ===========================  ==================================
timer (setting)            default                      does
=========================  ===========================  ==================================
``supervise_interval``     60 s                         per queue: counters, warnings and
                                                        expiry (``monitor_interval``, 60 s),
                                                        deletion (``maintenance_interval``,
                                                        24 h)
``cron_monitor_interval``  30 s                         fire due cron schedules
``cron_worker_interval``   5 s                          turn ``__pgboss__send-it`` jobs into
                                                        jobs of their queues
``clock_monitor_interval`` 600 s                        measure the database clock's skew
``flow_interval``          5 s                          schema 46: release flow children
                                                        whose parents completed
``bam_interval``           60 s                         schema 46: run the index builds
                                                        queued in ``bam``
=========================  ===========================  ==================================

At schema 46 a supervise pass ends with the reindex turn (``reindex_interval``,
24 h). Index builds and rebuilds run on a connection of their own in autocommit
(:class:`~alkstore_sa.ops.frame.Autocommit`).

>>> supervisor = Supervisor(engine, schema="pgboss")          # doctest: +SKIP
>>> supervisor.start()                                        # doctest: +SKIP
>>> supervisor.stop()                                         # doctest: +SKIP
>>> report = Supervisor(engine).run_once()                    # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from .._engine_cache import (
    Refusals,
    ensure_version,
    execution_options,
    make_context,
    version_due,
)
from ..backends import Backend
from ..clock import Clock, SystemClock
from ..errors import InvalidOptionsError, SchemaVersionError, shown
from ..names import DEFAULT_SCHEMA, validate_schema
from ..ops import Op, driver, observe
from ..ops._core import may_be_schema_change
from ..ops.frame import Autocommit
from ..ops.schedules import ScheduleReports
from ..ops.supervision import (
    PassPlan,
    QueueWarning,
    Settings,
    SupervisionReport,
    database_epoch,
    supervise_pass,
    with_lock_timeouts,
)
from ..steps import Invoke, Run, Steps, Wait, aanswering, adrive, answering, drive

__all__ = ["AsyncSupervisor", "QueueWarning", "Settings", "SupervisionReport", "Supervisor"]

logger = logging.getLogger(__name__)

MAX_SLEEP = 1.0  # the loop looks at its timers at least this often (a fake clock may jump)
SKEW_WARNING = 60.0  # seconds of clock skew worth a warning, as pg-boss
RETRY_FIRST = 1.0
"""Seconds the loop waits after a pass that failed as a whole (the database or the
pooler down) before it tries again; doubled after each failure in a row, up to
:data:`RETRY_MAX`, with jitter."""
RETRY_MAX = 30.0
"""The longest wait between two passes that fail in a row."""


def unreachable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached, or the connection to it
    was lost (rather than that a statement was refused): no SQLSTATE, or a connection
    SQLAlchemy invalidated."""
    if not isinstance(exc, DBAPIError):
        return False
    return exc.connection_invalidated or getattr(exc.orig, "sqlstate", None) is None


class _Outage:
    """Passes that failed in a row as a whole: how long to wait before the next one, and
    what to log (a traceback when they start, then a line per retry, a line when a pass
    runs again)."""

    def __init__(self) -> None:
        self.failed = 0
        self.since = 0.0

    def failure(self, exc: BaseException) -> float:
        """Log a failed pass; the seconds to wait before the next."""
        self.failed += 1
        base = min(RETRY_MAX, RETRY_FIRST * 2.0 ** min(self.failed - 1, 16))
        delay = base * random.uniform(0.75, 1.25)
        extra = {"action": "supervise_error", "failed": self.failed, "delay": delay}
        if self.failed == 1:
            self.since = time.monotonic()
            logger.exception("supervision pass failed; retrying in %.1f s", delay, extra=extra)
        else:
            logger.warning(
                "supervision pass failed again (%s, %d in a row); retrying in %.1f s",
                _first_line(exc),
                self.failed,
                delay,
                extra=extra,
            )
        return delay

    def success(self) -> None:
        """A pass ran: say so once if passes had failed before it."""
        if not self.failed:
            return
        logger.info(
            "supervision passes again, after %d failed in a row over %.0f s",
            self.failed,
            time.monotonic() - self.since,
            extra={"action": "supervise_recovered", "failed": self.failed},
        )
        self.failed = 0


def _first_line(exc: BaseException) -> str:
    said = str(exc).strip()
    return f"{type(exc).__name__}: {said.splitlines()[0]}" if said else type(exc).__name__


class _Core:
    """Timers, plans, the pass and the loop: the supervisor, written once.

    :meth:`_passing` and :meth:`_looping` yield steps (:mod:`alkstore_sa.steps`);
    :class:`Supervisor` answers them on a thread, :class:`AsyncSupervisor` in a task.
    A unit of the pass (an operation) is answered by running it in a short
    transaction of its own.
    """

    def __init__(
        self,
        engine: Engine,
        schema: str,
        clock: Clock | None,
        on_warning: Callable[[QueueWarning], object] | None,
        *,
        notify: bool,
        settings: dict[str, Any],
        backend: str | Backend | None = None,
    ) -> None:
        self.schema = validate_schema(schema)
        self.settings = Settings.from_options(settings)
        self.clock: Clock = SystemClock() if clock is None else clock
        if not isinstance(self.clock, Clock):
            raise InvalidOptionsError("clock", "must have now() and database_now()")
        if on_warning is not None and not callable(on_warning):
            raise InvalidOptionsError("on_warning", f"must be callable, not {shown(on_warning)}")
        self.on_warning = on_warning
        self._ctx, state = make_context(self.schema, notify=notify, engine=engine, backend=backend)
        assert state is not None  # an engine was given
        self._state = state
        self._options = execution_options(self.schema)
        self._next: dict[str, dt.datetime] = {}
        self._refusals = Refusals(logger, "supervisor", "paused")
        self._schedule_reports = ScheduleReports()  # unusable schedules: said once per change
        self.skew_seconds: float | None = None
        """Database clock minus local clock, as last measured (``None`` before)."""

    def _intervals(self) -> dict[str, float]:
        s, steps = self.settings, {}
        if s.supervise:
            steps["supervise"] = s.supervise_interval
        if s.schedule:
            steps["cron"] = s.cron_monitor_interval
            steps["send_it"] = s.cron_worker_interval
            if self.clock.database_now() is None:
                # A clock that drives the statements is the reference: no skew.
                steps["clock"] = s.clock_monitor_interval
        if s.supervise and s.flows:
            steps["flows"] = s.flow_interval
        if s.bam:
            steps["bam"] = s.bam_interval
        return steps

    def _take_due(self, *, force: bool) -> set[str]:
        now, due = self.clock.now(), set()
        for step, seconds in self._intervals().items():
            if force or self._next.get(step, now) <= now:
                due.add(step)
                self._next[step] = now + dt.timedelta(seconds=seconds)
        return due

    def next_due_in(self) -> float:
        """Seconds until the next step is due by the local timers (0 = now)."""
        now = self.clock.now()
        waits = [(self._next.get(step, now) - now).total_seconds() for step in self._intervals()]
        return max(0.0, min(waits, default=MAX_SLEEP))

    def _sleep_time(self) -> float:
        return min(max(self.next_due_in(), 0.01), MAX_SLEEP)

    def _plan(self, due: set[str], *, force: bool) -> PassPlan:
        db_now = self.clock.database_now()
        cron_now = db_now
        if cron_now is None and self.skew_seconds is not None:
            cron_now = self.clock.now() + dt.timedelta(seconds=self.skew_seconds)
        return PassPlan(
            self.settings,
            monitor="supervise" in due,
            cron="cron" in due,
            send_it="send_it" in due,
            now=db_now,
            cron_now=cron_now,
            force=force,
            skew_seconds=self.skew_seconds,
            flows="flows" in due,
            bam="bam" in due,
            reports=self._schedule_reports,
        )

    def _record_skew(self, before: dt.datetime, db_epoch: float, after: dt.datetime) -> None:
        local = (before.timestamp() + after.timestamp()) / 2
        self.skew_seconds = db_epoch - local
        if abs(self.skew_seconds) >= SKEW_WARNING:
            logger.warning(
                "the database clock is %.0f s %s than this process's",
                abs(self.skew_seconds),
                "ahead" if self.skew_seconds > 0 else "behind",
                extra={"action": "clock_skew", "skew_seconds": self.skew_seconds},
            )

    def _persist_skew(self) -> Steps[None]:
        # At 46 with persist_warnings, a skew worth a warning is also written to the
        # warning table, as pg-boss's timekeeper does (type clock_skew).
        skew = self.skew_seconds
        if skew is None or abs(skew) < SKEW_WARNING or not self.settings.persist_warnings:
            return
        message = (
            f"Warning: clock skew: the database clock is {abs(skew):.0f} s "
            f"{'ahead of' if skew > 0 else 'behind'} this process's; schedules are still "
            "evaluated at database time"
        )
        data = {"seconds": abs(skew), "direction": "slower" if skew > 0 else "faster"}
        try:
            yield Run(observe.persist_warning(self._ctx, "clock_skew", message, data))
        except Exception:
            logger.exception("clock skew warning not written", extra={"action": "clock_skew"})

    run_once: Callable[..., Any]

    def _passing(self, *, force: bool) -> Steps[SupervisionReport]:
        # The installed version chooses the pass's statements; read as the services
        # and workers of this engine read it (again every SCHEMA_RECHECK_SECONDS).
        version = version_due(self._ctx, self._state)
        if version is not None:
            yield Run(version)
        due = self._take_due(force=force)
        if "clock" in due:
            before = self.clock.now()
            try:
                epoch = yield Run(database_epoch(self._ctx))
            except Exception:
                logger.exception("clock skew measurement failed", extra={"action": "clock_skew"})
            else:
                self._record_skew(before, epoch, self.clock.now())
                yield from self._persist_skew()
        # The pass yields its units (operations); each is answered as a Run.
        report = yield from supervise_pass(self._ctx, self._plan(due, force=force))
        return self._finish(report)

    def _looping(self, stop: Any) -> Steps[None]:
        outage = _Outage()
        while not stop.is_set():
            try:
                yield Invoke(self.run_once)  # a whole pass, under the supervisor's lock
            except SchemaVersionError as exc:
                # Nothing of the pass ran; said once per version, then looked at again.
                yield Wait(stop, self._refusals.refused(exc, self._state, self.schema))
                continue
            except Exception as exc:
                # The database or the pooler is down (or the pass cannot run for
                # another reason): back off, a traceback once, then a line per retry.
                yield Wait(stop, outage.failure(exc))
                continue
            outage.success()
            self._refusals.clear()
            yield Wait(stop, self._sleep_time())

    def _unit(self, step: Any) -> Op[Any]:
        """The operation a step of the pass asks to run (a unit, or a :class:`Run`)."""
        return with_lock_timeouts(step.op if isinstance(step, Run) else step)

    def _failed(self, exc: BaseException) -> None:
        """A unit failed: if as a changed schema makes statements fail, read the
        version again before the next unit. If the database could not be reached, the
        next pass reads the version first too: while it stays down, that pass fails as
        a whole (one line, then a longer wait) instead of step by step."""
        if may_be_schema_change(exc) or unreachable(exc):
            self._state.expire(self.schema)

    def _log_state(self, *, started: bool) -> None:
        action = "supervisor_start" if started else "supervisor_stop"
        # DEBUG: a worker starts and stops its supervisor; a host app's log at INFO
        # stays quiet for a normal start and a clean stop (the "Logging" page).
        logger.debug(
            "supervisor %s",
            "started" if started else "stopped",
            extra={"action": action, "schema": self.schema},
        )

    def _finish(self, report: SupervisionReport) -> SupervisionReport:
        for warning in report.warnings:
            logger.warning(
                "queue %s has %d queued jobs (threshold %d)",
                warning.queue,
                warning.queued,
                warning.threshold,
                extra={"action": "large_queue", "queue": warning.queue, "queued": warning.queued},
            )
            if self.on_warning is not None:
                try:
                    self.on_warning(warning)
                except Exception:
                    logger.exception("on_warning callback failed", extra={"action": "callback"})
        if report.idle:
            logger.debug("supervision pass: nothing to do", extra={"action": "supervise"})
        else:
            # Only counting and maintaining is routine (DEBUG); a pass that changed
            # jobs (expired, deleted, fired, sent) is worth a line at INFO.
            changed = (
                sum(report.expired.values())
                or sum(report.deleted.values())
                or report.fired
                or report.sent
            )
            logger.log(
                logging.INFO if changed else logging.DEBUG,
                "supervision pass: %d monitored, %d expired, %d maintained, %d deleted, "
                "%d schedules fired, %d scheduled jobs sent",
                len(report.monitored),
                sum(report.expired.values()),
                len(report.maintained),
                sum(report.deleted.values()),
                len(report.fired),
                report.sent,
                extra={"action": "supervise", "schema": self.schema},
            )
        return report


class Supervisor(_Core):
    """Supervision on a background thread, each step in a short transaction of its own.

    :param engine: the Engine to take connections from (one at a time, briefly).
    :param schema: the queue schema.
    :param clock: the time source; :class:`~alkstore_sa.clock.FakeClock` in tests.
    :param on_warning: called with a :class:`QueueWarning` for each queue over its
        threshold (after the WARNING log record).
    :param notify: announce jobs created by cron schedules with ``pg_notify``.
    :param backend: the database backend profile (the "Database backends" page), as
        :class:`~alkstore_sa.QueueService` takes it.
    :param settings: ``supervise`` / ``schedule`` (switch the monitor+deletion and
        cron halves), ``supervise_interval``, ``monitor_interval``,
        ``maintenance_interval``, ``cron_monitor_interval``, ``cron_worker_interval``,
        ``clock_monitor_interval`` (seconds; pg-boss defaults 60, 60, 86400, 30, 5,
        600), ``warning_queue_size`` (10000; a queue's own ``warning_queued`` wins),
        ``delete_batch_size`` (10000 rows per statement), ``expire_batch_size``
        (1000), ``queues`` (only these queues); at schema 46 ``persist_warnings``,
        ``warning_retention_days`` (365), ``persist_queue_stats`` and
        ``queue_stats_retention_days`` (7), ``flows`` /
        ``bam`` / ``reindex`` (switch those turns) with ``flow_interval`` /
        ``bam_interval`` / ``reindex_interval`` (5, 60, 86400).
    :raises InvalidOptionsError: for a bad setting (from :meth:`start` or
        :meth:`run_once`, a setting the installed schema does not have).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock | None = None,
        on_warning: Callable[[QueueWarning], object] | None = None,
        notify: bool = True,
        backend: str | Backend | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            engine, schema, clock, on_warning, notify=notify, settings=settings, backend=backend
        )
        self.engine = engine
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @functools.cached_property
    def _answer(self) -> Callable[[Any], Any]:
        return answering(self._run)

    def _run(self, step: Any) -> Any:
        """The answer to a unit of the pass (the rest: :func:`answering`)."""
        try:
            if isinstance(step, Autocommit):
                with self.engine.connect() as conn:
                    ddl = conn.execution_options(isolation_level="AUTOCOMMIT")
                    return driver.run(ddl, step.op, self._options)
            with self.engine.begin() as conn:
                return driver.run(conn, self._unit(step), self._options)
        except Exception as exc:
            self._failed(exc)
            raise

    def run_once(self, *, force: bool = False) -> SupervisionReport:
        """Run the steps that are due (all of them on the first call, or with ``force``).

        ``force`` also ignores the cluster-wide throttles. A failing step is logged
        and listed in ``report.errors``; the other steps still run.

        :raises SchemaNotInstalledError: if the schema is missing (first call).
        """
        with self._lock:
            return drive(self._passing(force=force), self._answer)

    def start(self) -> None:
        """Check the schema, then supervise on a daemon thread until :meth:`stop`."""
        if self._thread is not None and self._thread.is_alive():
            return
        with self._lock:
            self._answer(Run(ensure_version(self._ctx, self._state)))
        self.settings.check_version(self._ctx.version)
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, name=f"alkstore-supervisor-{self.schema}", daemon=True
        )
        self._thread.start()
        self._log_state(started=True)

    def _loop(self) -> None:
        drive(self._looping(self._stop), self._answer)

    def stop(self, timeout: float | None = None) -> bool:
        """Stop the thread after its current step; ``False`` if still running at ``timeout``."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                self._thread = thread
                return False
        self._log_state(started=False)
        return True


class AsyncSupervisor(_Core):
    """:class:`Supervisor` for an :class:`~sqlalchemy.ext.asyncio.AsyncEngine`, as a task.

    Same parameters and settings as :class:`Supervisor`.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        schema: str = DEFAULT_SCHEMA,
        clock: Clock | None = None,
        on_warning: Callable[[QueueWarning], object] | None = None,
        notify: bool = True,
        backend: str | Backend | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(
            engine.sync_engine,
            schema,
            clock,
            on_warning,
            notify=notify,
            settings=settings,
            backend=backend,
        )
        self.engine = engine
        self._lock = asyncio.Lock()
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    @functools.cached_property
    def _answer(self) -> Callable[[Any], Awaitable[Any]]:
        return aanswering(self._run)

    async def _run(self, step: Any) -> Any:
        """The answer to a unit of the pass (the rest: :func:`aanswering`)."""
        try:
            if isinstance(step, Autocommit):
                async with self.engine.connect() as conn:
                    ddl = await conn.execution_options(isolation_level="AUTOCOMMIT")
                    return await driver.arun(ddl, step.op, self._options)
            async with self.engine.begin() as conn:
                return await driver.arun(conn, self._unit(step), self._options)
        except Exception as exc:
            self._failed(exc)
            raise

    async def run_once(self, *, force: bool = False) -> SupervisionReport:
        """See :meth:`Supervisor.run_once`."""
        async with self._lock:
            return await adrive(self._passing(force=force), self._answer)

    async def start(self) -> None:
        """Check the schema, then supervise in a task until :meth:`stop`."""
        if self._task is not None and not self._task.done():
            return
        async with self._lock:
            await self._answer(Run(ensure_version(self._ctx, self._state)))
        self.settings.check_version(self._ctx.version)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(
            adrive(self._looping(self._stop), self._answer), name="alkstore-supervisor"
        )
        self._log_state(started=True)

    async def stop(self, timeout: float | None = None) -> bool:
        """Stop the task after its current step; cancel it if ``timeout`` passes first."""
        if self._stop is not None:
            self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(task), timeout)
            except TimeoutError:
                task.cancel()
                return False
        self._log_state(started=False)
        return True
