"""QueueService: the whole job lifecycle on the caller's :class:`~sqlalchemy.orm.Session`.

The service never commits and never rolls back: every statement runs in the
caller's transaction, so a job sent next to a business write exists if and only
if that transaction commits.

:mod:`alkstore_sa.service_async` is generated from this module by
``tools/gen_async.py``; edit this file and run the tool.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, Unpack

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from . import ops
from ._engine_cache import (
    MIGRATION_GRACE,
    MIGRATION_WAIT,
    backend_pid,
    ensure_version,
    execution_options,
    make_context,
    migration_under_way,
    passing_through,
    version_unlocked,
)
from .backends import Backend
from .errors import SchemaVersionChangedError, SchemaVersionError
from .groups import GroupConcurrencyConfig
from .names import DEFAULT_SCHEMA
from .ops import driver
from .ops._core import may_be_schema_change, read_version
from .ops.keys import KEEP_DATA
from .options import FlowJob, JobSpec, QueueOptions, SendOptions, TimedSendOptions, UpdateOptions
from .records import (
    EventSubscription,
    FailResult,
    Instance,
    Job,
    JobAttempt,
    JobCounts,
    JobDependency,
    JobPage,
    PersistedWarning,
    QueueInfo,
    QueueStats,
    QueueStatsSnapshot,
    ScheduleInfo,
    Settled,
    Settlement,
    SupervisionReport,
    UpdateResult,
    UpsertResult,
)

T = TypeVar("T")


class QueueService:
    """Queue operations bound to one Session and one schema.

    >>> with Session(engine) as session, session.begin():
    ...     session.add(order)
    ...     QueueService(session).send("emails", {"order": 42})   # doctest: +SKIP

    :param session: the caller's session; its transaction is the job's transaction.
    :param schema: the queue schema (default ``pgboss``, as Node pg-boss).
    :param notify: announce new jobs with ``pg_notify`` (delivered on commit), so
        that listening workers wake at once.
    :param backend: the database backend profile, as pg-boss's ``backend`` option
        (``"postgres"``, ``"citus"``...; the "Database backends" page); by default the
        one the engine's dialect settles, else ``"postgres"``.

    Results, one type per family (the "API reference" page, "Results"): calls that
    change jobs named by id or Job return :class:`~alkstore_sa.Settled`
    (``fail``/``fail_many`` its subclass :class:`~alkstore_sa.FailResult`);
    deletes by state return a count; ``supervise`` returns a
    :class:`~alkstore_sa.SupervisionReport`.
    """

    def __init__(
        self,
        session: Session,
        *,
        schema: str = DEFAULT_SCHEMA,
        notify: bool = True,
        backend: str | Backend | None = None,
    ):
        self.session = session
        bind = session.get_bind()
        engine: Engine | None = getattr(bind, "engine", None)
        self._engine = engine
        self._ctx, self._state = make_context(schema, notify=notify, engine=engine, backend=backend)
        self._options = execution_options(self._ctx.schema)
        self._savepoint_reads = True

    @property
    def schema(self) -> str:
        """The schema this service works in."""
        return self._ctx.schema

    def _run(self, op: ops.Op[T]) -> T:
        if self._state is None:
            return self._drive(op)
        # The schema's version (read at most every SCHEMA_RECHECK_SECONDS per
        # engine) chooses the statements; ``op`` has not started yet, so it
        # sees the version set here.
        self._check_version()
        try:
            return self._drive(op)
        except DBAPIError as exc:
            if not may_be_schema_change(exc):
                raise
            # Possibly a schema migrated under us. The caller's transaction is
            # aborted, so it cannot be retried here: look on a connection of our
            # own, and if the version moved say so; the next transaction re-reads it.
            self._state.expire(self._ctx.schema)
            before, after = self._ctx.version, self._moved()
            if after == before:
                raise
            raise SchemaVersionChangedError(self._ctx.schema, before, after) from exc

    def _check_version(self) -> None:
        # Met mid-migration (a version between two spoken ones, pg-boss's migration
        # lock held): wait for it rather than refuse, as long as the migration does
        # not wait for this transaction, MIGRATION_GRACE at most.
        since = time.monotonic()
        while True:
            try:
                self._read_version()
                return
            except SchemaVersionError as refused:
                if not self._migrating(refused, since):
                    raise
            time.sleep(MIGRATION_WAIT)

    def _read_version(self) -> None:
        assert self._state is not None  # only called with the engine's caches
        if self._savepoint_reads:
            try:
                self._drive(version_unlocked(self._ctx, self._state))
                return
            except DBAPIError as exc:
                # 25P01: an AUTOCOMMIT session has no transaction for a savepoint, and
                # keeps no lock from a read either: read plainly from now on.
                if getattr(exc.orig, "sqlstate", None) != "25P01":
                    raise
                self._savepoint_reads = False
        self._drive(ensure_version(self._ctx, self._state))

    def _migrating(self, refused: SchemaVersionError, since: float) -> bool:
        """Whether the refused version is one a migration under way passes through,
        and the migration can finish while this transaction waits; if it waits for a
        lock this transaction holds, raise :class:`SchemaVersionChangedError` (roll
        back and run again) instead of waiting for ever."""
        if not passing_through(refused.found) or time.monotonic() - since > MIGRATION_GRACE:
            return False
        assert self._engine is not None  # a service without an engine has no cache
        pid = self._drive(backend_pid())
        with self._engine.connect() as conn:
            running, waits_for_us = driver.run(
                conn, migration_under_way(self._ctx.schema, pid), self._options
            )
        if waits_for_us:
            known = self._state.known(self._ctx.schema) if self._state is not None else None
            raise SchemaVersionChangedError(
                self._ctx.schema, known or self._ctx.version, refused.found
            ) from refused
        return running

    def _moved(self) -> int | None:
        """The schema's installed version, read outside the caller's transaction."""
        assert self._engine is not None  # a service without an engine has no cache
        with self._engine.connect() as conn:
            return driver.run(conn, read_version(self._ctx.schema), self._options)

    def _drive(self, op: ops.Op[T]) -> T:
        return driver.run(self.session, op, self._options)

    # ------------------------------------------------------------ queues

    def create_queue(
        self, name: str, *, exist_ok: bool = True, **options: Unpack[QueueOptions]
    ) -> QueueInfo:
        """Create a queue (idempotent unless ``exist_ok=False``) and return it.

        Options: ``policy`` (standard, short, singleton, stately, exclusive, and
        key_strict_fifo on a schema at 46: the "Run each key's jobs in order: key_strict_fifo"
        page), ``partition`` (a dedicated partition table), ``dead_letter``,
        ``retry_limit`` (2), ``retry_delay`` (0 s), ``retry_backoff`` (False),
        ``retry_delay_max``, ``expire_seconds`` (900), ``retention_seconds``
        (14 days), ``deletion_seconds`` (7 days), ``warning_queued`` (0 = global).
        An existing queue is returned unchanged, as pg-boss does; when options given
        here differ from its own, a WARNING (logger ``alkstore_sa.ops.queues``) names
        each one, old -> new. To create a queue or make it match, call
        :meth:`ensure_queue`.

        :raises QueueExistsError: if ``exist_ok`` is false and the queue exists.
        :raises InvalidOptionsError: for a bad option, before any write.
        """
        return self._run(ops.create_queue(self._ctx, name, exist_ok=exist_ok, options=options))

    def ensure_queue(self, name: str, **options: Unpack[QueueOptions]) -> QueueInfo:
        """Create the queue, or change the options given here on the existing queue to
        match; return it. Options not given keep the queue's values. Meant for the
        "declare the queues at start-up" pattern::

            queues.ensure_queue("payments", retry_limit=7)

        :raises InvalidOptionsError: for a bad option, or a ``policy`` or ``partition``
            other than the existing queue's (those cannot change), before any write.
        """
        return self._run(ops.ensure_queue(self._ctx, name, options))

    def update_queue(self, name: str, **options: Unpack[QueueOptions]) -> QueueInfo:
        """Change a queue's options (all but ``policy`` and ``partition``).

        New values apply to jobs sent afterwards; existing jobs keep theirs.
        """
        return self._run(ops.update_queue(self._ctx, name, options))

    def delete_queue(self, name: str) -> bool:
        """Delete a queue with all its jobs, schedules and subscriptions.

        Returns ``False`` if there was no such queue.

        :raises InvalidOptionsError: if another queue dead-letters into it.
        """
        return self._run(ops.delete_queue(self._ctx, name))

    def get_queue(self, name: str) -> QueueInfo | None:
        """The queue's settings and cached counters, or ``None``."""
        return self._run(ops.get_queue(self._ctx, name))

    def get_queues(self, names: Sequence[str] | None = None) -> list[QueueInfo]:
        """All queues (or those named), ordered by name."""
        return self._run(ops.get_queues(self._ctx, names))

    def get_queue_stats(self, name: str) -> QueueStats:
        """Live counts of the queue's jobs (deferred, queued, active, total)."""
        return self._run(ops.get_queue_stats(self._ctx, name))

    # ------------------------------------------------------------ sending

    def send(self, name: str, data: Any = None, **options: Unpack[SendOptions]) -> uuid.UUID | None:
        """Enqueue one job in the caller's transaction; return its id.

        Returns ``None`` when the queue's policy or a throttle slot rejects the job
        (or ``id`` is taken); the transaction stays usable. ``start_after`` takes an
        aware datetime, a timedelta, seconds, or ISO-8601 text; relative values
        count from the database clock.

        :raises QueueNotFoundError: if the queue does not exist.
        :raises InvalidOptionsError: for a bad option or data JSON cannot encode.
        """
        return self._run(ops.send(self._ctx, name, data, options))

    def send_many(self, name: str, jobs: Iterable[JobSpec]) -> list[uuid.UUID | None]:
        """Enqueue many jobs with one statement; ids in input order (``None`` = rejected).

        Each item is a mapping with ``data`` and any :meth:`send` option.
        """
        return self._run(ops.send_many(self._ctx, name, jobs))

    def send_after(
        self, name: str, data: Any, start_after: Any, **options: Unpack[TimedSendOptions]
    ) -> uuid.UUID | None:
        """:meth:`send` with ``start_after``."""
        return self._run(ops.send(self._ctx, name, data, {**options, "start_after": start_after}))

    def send_throttled(
        self,
        name: str,
        data: Any,
        seconds: int,
        key: str | None = None,
        **options: Unpack[SendOptions],
    ) -> uuid.UUID | None:
        """At most one job per ``key`` per ``seconds``-long slot; ``None`` if taken."""
        extra: dict[str, Any] = {"singleton_seconds": seconds}
        if key is not None:
            extra["singleton_key"] = key
        return self._run(ops.send(self._ctx, name, data, {**options, **extra}))

    def send_debounced(
        self,
        name: str,
        data: Any,
        seconds: int,
        key: str | None = None,
        **options: Unpack[SendOptions],
    ) -> uuid.UUID | None:
        """Like :meth:`send_throttled`, but a job refused by the current slot is
        placed in the next one (starting when it opens); ``None`` if both are taken."""
        return self._run(ops.send_debounced(self._ctx, name, data, seconds, key, options))

    def publish(
        self, event: str, data: Any = None, **options: Unpack[SendOptions]
    ) -> list[uuid.UUID | None]:
        """Send ``data`` to every queue subscribed to ``event``."""
        return self._run(ops.publish(self._ctx, event, data, options))

    def subscribe(self, event: str, name: str) -> None:
        """Deliver jobs published for ``event`` to queue ``name``."""
        return self._run(ops.subscribe(self._ctx, event, name))

    def unsubscribe(self, event: str, name: str) -> bool:
        """Stop delivering ``event`` to ``name``; ``False`` if it was not subscribed."""
        return self._run(ops.unsubscribe(self._ctx, event, name))

    def get_subscriptions(
        self, name: str | None = None, event: str | None = None
    ) -> list[EventSubscription]:
        """Stored subscriptions, by event then queue; optionally of one queue and
        one event. A queue or event without any has none: ``[]``.

        :raises InvalidOptionsError: for a bad queue name or event, before any SQL.
        """
        return self._run(ops.get_subscriptions(self._ctx, name, event))

    # ------------------------------------------------------------ flows (schema 46)

    def flow(self, jobs: Iterable[FlowJob]) -> dict[str, uuid.UUID]:
        """Send jobs that depend on one another, in the caller's transaction
        (pg-boss's ``flow``); return each job's id by its ``ref``.

        Each job is a :class:`~alkstore_sa.FlowJob`: ``ref``, ``name`` (its queue,
        any queue of this schema), ``data``, ``options`` (those of :meth:`send`)
        and ``depends_on`` (refs of its parents). A job with parents is
        ``blocked``: no worker, ours or Node's, fetches it until every parent has
        completed and a supervision pass (the flow turn, every 5 s by default) has
        released it. A parent that fails or is cancelled, or is deleted, leaves its
        children blocked, as pg-boss does (the "Run jobs after other jobs: flows" page).

        All or nothing: every job and dependency is written, or none (the flow is
        one statement, in a savepoint). The flags are written as Node writes them,
        so Node's workers and supervisor resolve the flow too.

        :raises SchemaFeatureError: below schema 46, before any SQL.
        :raises InvalidOptionsError: before any write, for fewer than 2 jobs or no
            dependency, an empty or duplicate ref, an unknown or own ref in
            ``depends_on``, a dependency cycle (its refs named), a bad option, or
            more than :data:`~alkstore_sa.limits.MAX_FLOW_JOBS` jobs.
        :raises QueueNotFoundError: if a job's queue does not exist.
        :raises FlowConflictError: if a unique index refuses a job (its id taken,
            or its queue's policy or a throttle slot holds its key); nothing was
            written and the transaction stays usable.
        """
        return self._run(ops.flows.flow(self._ctx, jobs))

    def get_dependencies(
        self,
        name: str,
        id: uuid.UUID | str,
        *,
        limit: int | None = None,
        after: JobDependency | tuple[str, uuid.UUID | str] | None = None,
    ) -> list[JobDependency]:
        """The parents of a flow job: the jobs it waits for (pg-boss's
        ``getDependencies``), each with its state.

        Ordered by queue, then id; at most ``limit`` (1 to 100,000, default
        1,000); ``after``, the last row of the previous page (or its
        ``(queue, id)``), continues a listing. A job without parents, or one
        that does not exist, has none: ``[]``, as in pg-boss. Read from
        ``job_dependency``, in the caller's transaction.

        :raises SchemaFeatureError: below schema 46, before any SQL.
        :raises InvalidOptionsError: for a bad queue name, id, ``limit`` or
            ``after``, before any SQL.
        """
        return self._run(
            ops.flows.related_jobs(self._ctx, name, id, parents=True, limit=limit, after=after)
        )

    def get_dependents(
        self,
        name: str,
        id: uuid.UUID | str,
        *,
        limit: int | None = None,
        after: JobDependency | tuple[str, uuid.UUID | str] | None = None,
    ) -> list[JobDependency]:
        """The children of a flow job: the jobs that wait for it (pg-boss's
        ``getDependents``), each with its state.

        As :meth:`get_dependencies` otherwise (order, ``limit``, ``after``, ``[]``
        for a job without children or an unknown job).

        :raises SchemaFeatureError: below schema 46, before any SQL.
        :raises InvalidOptionsError: for a bad queue name, id, ``limit`` or
            ``after``, before any SQL.
        """
        return self._run(
            ops.flows.related_jobs(self._ctx, name, id, parents=False, limit=limit, after=after)
        )

    # ------------------------------------------------------------ by key (schema 46)

    def update(
        self,
        name: str,
        data: Any = KEEP_DATA,
        *,
        id: uuid.UUID | str | None = None,
        singleton_key: str | None = None,
        match: str | None = None,
        **options: Unpack[UpdateOptions],
    ) -> UpdateResult:
        """Edit jobs that have not started (``created`` or ``retry``) in place, in the
        caller's transaction (pg-boss's ``update``).

        Name the jobs by exactly one of ``id`` or ``singleton_key``; by key,
        ``match`` picks the ``"newest"`` (default), the ``"oldest"`` or ``"all"`` of
        that key's jobs that have not started. Only what is given changes: ``data``
        (omit it to keep the jobs' data) and the options of
        :class:`~alkstore_sa.options.UpdateOptions`. A job a worker has already
        activated is never edited. Returns an :class:`~alkstore_sa.UpdateResult`
        (``updated == 0``: no such job, or the edit deadlocked with another
        transaction and was undone; the caller's transaction stays usable).

        :raises SchemaFeatureError: below schema 46, before any SQL.
        :raises QueueNotFoundError: if the queue does not exist.
        :raises InvalidOptionsError: for a bad option or target, before any write.
        """
        return self._run(ops.keys.update(self._ctx, name, data, id, singleton_key, match, options))

    def upsert(
        self,
        name: str,
        data: Any = KEEP_DATA,
        *,
        singleton_key: str | None = None,
        id: uuid.UUID | str | None = None,
        match: str | None = None,
        **options: Unpack[UpdateOptions],
    ) -> UpsertResult:
        """Replace the data (and given options) of the job with this key that has not
        started yet, or send a new one: pg-boss's ``upsert``, in the caller's transaction.

        Name the job by ``singleton_key`` (the usual way; required on
        ``key_strict_fifo`` queues) or by ``id``. If a ``created`` or ``retry`` job
        matches (``match`` as in :meth:`update`), it is edited in place and
        ``result.updated`` counts it; otherwise one job is inserted with ``data`` and
        the options (the queue's values for the rest) and ``result.inserted`` is 1.
        Without ``data`` an edit keeps the job's data (an insert stores none).
        A job inserted by key is marked ``upsert_by_key``: the schema keeps one such
        created job per key, so concurrent upserts of one key end on a single job
        (the loser edits the winner's job). A conflict is never an exception: if the
        queue's policy refuses a new job, the upsert deadlocks with another
        transaction, or for ten rounds in a row another transaction inserts the key first
        and a worker takes that job before it can be edited, ``result.rejected`` is true,
        nothing was written and the transaction stays usable. Returns an
        :class:`~alkstore_sa.UpsertResult`.

        :raises SchemaFeatureError: below schema 46, before any SQL.
        :raises QueueNotFoundError: if the queue does not exist.
        :raises InvalidOptionsError: for a bad option or target, or no
            ``singleton_key`` on a key_strict_fifo queue, before any write.
        """
        return self._run(ops.keys.upsert(self._ctx, name, data, id, singleton_key, match, options))

    def get_blocked_keys(
        self, name: str, *, limit: int | None = None, after: str | None = None
    ) -> list[str]:
        """The keys of a ``key_strict_fifo`` queue that a ``failed`` job blocks, in
        order (pg-boss's ``getBlockedKeys``).

        Such a key runs no more jobs until its failed job is retried
        (:meth:`retry`) or deleted. At most ``limit`` keys (1 to 100,000, default
        1,000); ``after``: only keys after this one (the last key of the previous page).

        :raises SchemaFeatureError: below schema 46, before any SQL.
        :raises QueueNotFoundError: if the queue does not exist.
        :raises InvalidOptionsError: if the queue's policy is not key_strict_fifo, or
            for a bad ``limit`` or ``after``.
        """
        return self._run(ops.keys.get_blocked_keys(self._ctx, name, limit, after))

    # ------------------------------------------------------------ working

    def fetch(
        self,
        name: str,
        batch_size: int = 1,
        *,
        priority: bool = True,
        ignore_start_after: bool = False,
        group_concurrency: int | GroupConcurrencyConfig | None = None,
    ) -> list[Job]:
        """Claim up to ``batch_size`` jobs (``FOR UPDATE SKIP LOCKED``) and return them active.

        Order: highest ``priority`` first (unless ``priority=False``), then oldest.
        On singleton and stately queues at most one job per key is activated.

        ``group_concurrency`` (schema 46): activate a job of a group (its
        ``group_id``) only while the group has fewer active jobs in the queue than
        its limit: an integer, or ``{"default": n, "tiers": {tier: n}}`` (see
        the "Limit concurrency per group" page). The group locks it takes are held until
        the transaction ends.

        A row that cannot be activated or read (written past the limits of
        the "Limits" page by another client) is failed on its own, with an
        output saying why and one WARNING log, and the rest of the batch is returned.

        :raises InvalidOptionsError: for a bad ``group_concurrency``, or one at
            schema 26, before any SQL.
        """
        g: dict[str, Any] = {"group_concurrency": group_concurrency}
        return self._run(
            ops.fetch(
                self._ctx,
                name,
                batch_size,
                priority=priority,
                ignore_start_after=ignore_start_after,
                **g,
            )
        )

    def complete(
        self,
        name: str,
        jobs: Job | uuid.UUID | str | Sequence[Job | uuid.UUID | str],
        output: Any = None,
    ) -> Settled:
        """Mark active jobs completed, storing ``output``.

        Worker code passes the fetched :class:`~alkstore_sa.Job` (or a list of
        them): the completion is fenced on its ``started_on`` and applies only
        while the job is still ``active`` in that attempt. If the job expired and
        was fetched again, a late completion from the first attempt changes
        nothing (it is not in ``affected``).

        An id is UNFENCED: it completes whatever attempt is active now, as
        pg-boss's ``complete`` does. Use ids for administration, never in a
        handler or worker; use the Job there.

        Returns a :class:`~alkstore_sa.Settled`: the jobs named and those completed.

        :raises InvalidOptionsError: for a Job of another queue or one that was
            never fetched (no ``started_on``), before any SQL.
        """
        items = ops.working.settlements(name, jobs, output)
        return self._run(ops.complete_many(self._ctx, name, items))

    def fail(
        self,
        name: str,
        jobs: Job | uuid.UUID | str | Sequence[Job | uuid.UUID | str],
        output: Any = None,
    ) -> FailResult:
        """Fail jobs: retry with the job's delay/backoff while retries remain,
        else ``failed`` and a copy to the dead letter queue.

        Given the fetched :class:`~alkstore_sa.Job`, the failure is fenced on its
        ``started_on``: it applies only while the job is still ``active`` in that
        attempt, so it cannot touch a job that expiry already moved to ``retry``
        or that another worker fetched again.

        An id is UNFENCED: it fails any job that is not finished (created,
        retry or active), as pg-boss's ``fail`` does. Use ids for
        administration; in worker code use the Job.

        Returns a :class:`~alkstore_sa.FailResult`: the jobs failed, the state
        each went to (``retry`` or ``failed``) and how many were dead-lettered.

        :raises InvalidOptionsError: for a Job of another queue or one that was
            never fetched (no ``started_on``), before any SQL.
        """
        items = ops.working.settlements(name, jobs, output)
        return self._run(ops.fail_many(self._ctx, name, items))

    def complete_many(
        self,
        name: str,
        items: Sequence[Job | uuid.UUID | str | tuple[Job | uuid.UUID | str, Any] | Settlement],
        *,
        per_job: bool = False,
    ) -> Settled:
        """Complete jobs with per-job outputs in one statement.

        Each item is a fetched :class:`~alkstore_sa.Job` (fenced, output
        ``None``), ``(job, output)``, or an id or ``(id, output)`` (UNFENCED,
        for administration), as :meth:`complete` describes, or a
        :class:`~alkstore_sa.Settlement`. Returns a :class:`~alkstore_sa.Settled`.

        With ``per_job=True`` its ``outcomes`` holds one
        :class:`~alkstore_sa.JobOutcome` per item, in order: completed, or why
        not (:class:`~alkstore_sa.NotSettled`: not found, a job of another
        queue, not active, or active in another attempt than the Job's). That
        costs one more read, of the jobs left alone only
        (the "Settle a batch and see what happened to each job" page).
        """
        return self._run(ops.complete_many(self._ctx, name, items, per_job=per_job))

    def fail_many(
        self,
        name: str,
        items: Sequence[Job | uuid.UUID | str | tuple[Job | uuid.UUID | str, Any] | Settlement],
        *,
        per_job: bool = False,
    ) -> FailResult:
        """Fail jobs with per-job outputs in one statement.

        Items as in :meth:`complete_many`: a Job or ``(job, output)`` is fenced
        (see :meth:`fail`); an id or ``(id, output)`` is UNFENCED. Returns a
        :class:`~alkstore_sa.FailResult`, as :meth:`fail` does; ``per_job=True``
        fills its ``outcomes`` as for :meth:`complete_many` (a failed job's
        ``state`` is ``retry`` or ``failed``).
        """
        return self._run(ops.fail_many(self._ctx, name, items, per_job=per_job))

    def touch(
        self,
        name: str,
        jobs: Job | uuid.UUID | str | Sequence[Job | uuid.UUID | str],
    ) -> Settled:
        """Refresh the heartbeat (``heartbeat_on``) of active jobs, pg-boss's ``touch``.

        A job with ``heartbeat_seconds`` whose heartbeat is older than that is
        failed by supervision (ours or Node pg-boss's) with the output
        ``{"value": {"message": "job heartbeat timeout"}}``; workers touch their
        jobs themselves, so call this only for a job you fetched and run
        yourself (the "Keep long jobs alive with heartbeats" page). The lease (``expire_seconds``)
        does not move: see :meth:`extend_leases`.

        Given the fetched :class:`~alkstore_sa.Job` the touch is fenced on its
        ``started_on``: only while the job is still ``active`` in that attempt;
        a job that is not ours any more (expired, fetched again, settled) is
        left alone and not in ``affected``. An id is UNFENCED: any active job
        with it, as pg-boss's ``touch`` by id.

        Returns a :class:`~alkstore_sa.Settled`: the jobs named and those touched.

        :raises SchemaFeatureError: on a schema below 46 (no heartbeats there).
        :raises InvalidOptionsError: for a Job of another queue or one never
            fetched, before any SQL.
        """
        return self._run(ops.heartbeats.touch(self._ctx, name, jobs))

    def extend_leases(
        self, name: str, items: Sequence[Job | Settlement], extend_by: int
    ) -> list[uuid.UUID]:
        """Push the expiry of active jobs to ``extend_by`` seconds from now.

        Always fenced: pass the fetched :class:`~alkstore_sa.Job`; only a job
        still ``active`` in that attempt is extended. Returns the ids of the
        jobs extended (a lease is not a settlement: the job stays ``active``).
        """
        return self._run(ops.extend_leases(self._ctx, name, items, extend_by))

    def cancel(self, name: str, ids: uuid.UUID | str | Sequence[uuid.UUID | str]) -> Settled:
        """Cancel jobs that are not finished."""
        return self._run(ops.cancel(self._ctx, name, ids))

    def resume(self, name: str, ids: uuid.UUID | str | Sequence[uuid.UUID | str]) -> Settled:
        """Put cancelled jobs back in the queue."""
        return self._run(ops.resume(self._ctx, name, ids))

    def retry(self, name: str, ids: uuid.UUID | str | Sequence[uuid.UUID | str]) -> Settled:
        """Give failed jobs one more attempt."""
        return self._run(ops.retry(self._ctx, name, ids))

    def delete_job(self, name: str, id: uuid.UUID | str) -> Settled:
        """Delete one job, whatever its state (``affected`` is empty if there was none)."""
        return self._run(ops.delete_jobs(self._ctx, name, id))

    def delete_jobs(self, name: str, ids: uuid.UUID | str | Sequence[uuid.UUID | str]) -> Settled:
        """Delete jobs, whatever their state."""
        return self._run(ops.delete_jobs(self._ctx, name, ids))

    def delete_queued_jobs(self, name: str) -> int:
        """Delete the queue's created and retry jobs; return how many."""
        return self._run(ops.delete_by_state(self._ctx, name, "queued"))

    def delete_stored_jobs(self, name: str) -> int:
        """Delete the queue's completed, cancelled and failed jobs; return how many."""
        return self._run(ops.delete_by_state(self._ctx, name, "stored"))

    def delete_all_jobs(self, name: str) -> int:
        """Delete every job of the queue; return how many."""
        return self._run(ops.delete_by_state(self._ctx, name, "all"))

    def get_job(self, name: str, id: uuid.UUID | str) -> Job | None:
        """One job by id, or ``None``.

        A row holding values Python cannot represent comes back as an
        :class:`~alkstore_sa.UnreadableJob` instead of raising.
        """
        jobs = self._run(ops.get_jobs(self._ctx, name, id))
        return jobs[0] if jobs else None

    def get_job_attempts(self, name: str, id: uuid.UUID | str) -> list[JobAttempt]:
        """Every failed attempt recorded for job ``id`` of queue ``name``, oldest first:
        when, which attempt, why (``cause``), the error written and which worker
        (:class:`~alkstore_sa.JobAttempt`; the "Attempt history" page).

        At most :data:`~alkstore_sa.limits.ATTEMPTS_KEPT` (the newest). Empty for a job
        that never failed, one failed only by Node pg-boss, or a schema without the
        attempt history table (``alkstore db upgrade`` makes it).

        :raises QueueNotFoundError: if the queue does not exist and nothing is recorded.
        :raises InvalidOptionsError: for an id that is not a UUID.
        """
        return self._run(ops.attempts.get_job_attempts(self._ctx, name, id))

    def get_jobs(self, name: str, ids: uuid.UUID | str | Sequence[uuid.UUID | str]) -> list[Job]:
        """Jobs by id (missing ones are left out; unreadable ones as for :meth:`get_job`)."""
        return self._run(ops.get_jobs(self._ctx, name, ids))

    def list_jobs(self, name: str, state: str | None = None, limit: int = 100) -> list[Job]:
        """The queue's jobs, newest first, at most ``limit`` (1 to 10,000).

        ``state`` keeps only jobs in that state (``"created"``, ``"failed"``, ...).
        Unreadable rows come back as :class:`~alkstore_sa.UnreadableJob`.

        :raises QueueNotFoundError: if the queue does not exist.
        :raises InvalidOptionsError: for an unknown state or a bad limit.
        """
        return self._run(ops.inspect.list_jobs(self._ctx, name, state, limit))

    def find_jobs(
        self,
        name: str | None = None,
        *,
        state: str | None = None,
        key: str | None = None,
        group: str | None = None,
        text: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        after: str | None = None,
        limit: int = 50,
    ) -> JobPage:
        """A page of jobs, newest first, for browsing (the dashboard's job list).

        Every filter is optional: ``name`` (one queue; all queues otherwise),
        ``state``, ``key`` (the singleton key), ``group`` (the group id, schema
        46), ``text`` (a substring of the data's JSON text, case-insensitive),
        ``since``/``until`` (aware datetimes bounding ``created_on``,
        ``until`` excluded). Pages are keyset-paged on ``(created_on, id)``:
        pass the returned ``next_cursor`` as ``after`` for the next page, which
        stays as quick deep in a large table as on the first page.

        :raises InvalidOptionsError: for a bad filter, cursor or ``limit``
            (1 to 1,000), before any SQL.
        :raises SchemaFeatureError: for ``group`` on a schema at 26.
        """
        filters: dict[str, object] = {
            "state": state,
            "key": key,
            "group": group,
            "text": text,
            "since": since,
            "until": until,
            "after": after,
        }
        return self._run(ops.inspect.find_jobs(self._ctx, name, filters, limit))

    def count_jobs(self, names: Sequence[str] | None = None) -> list[JobCounts]:
        """Every queue's jobs (or the named queues') counted by state, with the
        age of its oldest ready job; ordered by queue name.

        Counts the job table (no cached counter), so it costs a scan of it.
        """
        return self._run(ops.inspect.count_jobs(self._ctx, names))

    def redrive(
        self,
        dead_letter: str,
        to: str | None = None,
        ids: uuid.UUID | str | Sequence[uuid.UUID | str] | None = None,
        *,
        limit: int = 1000,
        source_name: str | None = None,
        data: Mapping[str, Any] | None = None,
        created_before: datetime | None = None,
    ) -> list[uuid.UUID]:
        """Move jobs out of ``dead_letter``, each as a new job; returns the new ids.

        Oldest first, at most ``limit``, only ``ids`` when given. At schema 46
        these filters narrow them too, as pg-boss's: ``source_name`` (the queue
        a job failed in), ``data`` (a JSON object its data contains, ``@>``) and
        ``created_before`` (an aware datetime: jobs dead-lettered before it).

        At schema 46, as pg-boss 12.38's ``redrive``: jobs waiting in
        ``dead_letter`` (``created`` or ``retry``) go back to ``to``, or, with
        ``to=None``, each to the queue it failed in (its ``source_name``). The
        new job keeps the data, priority, singleton key, group and trace
        context, and records the first job of its chain in ``source_root_id``;
        it takes its settings (retries, expiry, policy, heartbeat, dead letter)
        from its queue. A job its queue refuses (policy or key conflict) is
        failed in place with output ``reason: "redrive_conflict"``; one with no
        source and no ``to`` stays (the "Dead letters: provenance and redrive" page).

        At schema 26 ``to`` is required (dead letters record no source there)
        and waiting or failed jobs move, each a new job of ``to`` with its
        data; a job ``to`` refuses, or whose data cannot be read or sent
        again, stays where it is.

        :raises QueueNotFoundError: if ``dead_letter`` or ``to`` does not exist.
        :raises InvalidOptionsError: for a bad argument (``to=None`` at 26).
        :raises SchemaFeatureError: for a filter other than ``ids`` at 26.
        """
        filters = {"source_name": source_name, "data": data, "created_before": created_before}
        return self._run(ops.redrive(self._ctx, dead_letter, to, ids, limit, filters))

    # ------------------------------------------------------------ schedules

    def schedule(
        self,
        name: str,
        cron: str,
        data: Any = None,
        *,
        key: str = "",
        tz: str = "UTC",
        **options: Unpack[SendOptions],
    ) -> None:
        """Store a schedule that sends ``data`` to ``name`` (replacing ``(name, key)``'s).

        ``cron`` is, as in pg-boss 12.38, either a cron expression (5 fields, or
        6 with seconds first) or, at schema 46, an RFC 5545 recurrence rule: a
        rule value (``"FREQ=DAILY;BYHOUR=9"``) or the ``DTSTART``, ``RRULE``,
        ``RDATE`` and ``EXDATE`` lines of a calendar entry. Its shape decides
        its ``kind`` (``"cron"`` or ``"rrule"``), stored on the row. ``tz`` is an
        IANA zone; a rule's ``DTSTART`` may name its own (``TZID=``). Schedules
        fire through the supervisor's timekeeper (the "Supervision and cron" page).
        ``missed="once"`` catches up the latest occurrence a gap skipped.

        :raises InvalidOptionsError: a malformed expression or rule, an unknown
            ``tz``, a rule with no occurrence left (a passed ``UNTIL``, a
            spent ``COUNT``), a rule whose evaluation takes more than
            :data:`~alkstore_sa.limits.MAX_RRULE_STEPS` steps, or, on a
            ``key_strict_fifo`` queue, no ``singleton_key`` in the options;
            all before anything is written.
        :raises SchemaFeatureError: a recurrence rule on a schema at 26.
        :raises QueueNotFoundError: if ``name`` does not exist.
        """
        return self._run(ops.schedule(self._ctx, name, cron, data, key, tz, options))

    def unschedule(self, name: str, key: str = "") -> bool:
        """Remove a schedule; ``False`` if there was none."""
        return self._run(ops.unschedule(self._ctx, name, key))

    def get_schedules(self, name: str | None = None, key: str | None = None) -> list[ScheduleInfo]:
        """Stored schedules, optionally of one queue and key."""
        return self._run(ops.get_schedules(self._ctx, name, key))

    # ------------------------------------------------------------ supervision

    def supervise(
        self, queues: str | Sequence[str] | None = None, *, force: bool = False, **settings: Any
    ) -> SupervisionReport:
        """Run one supervision pass in the caller's transaction; return what it did.

        The same pass a worker's supervisor runs (as pg-boss's maintenance does): per queue,
        refresh the cached counters, warn about long queues and expire jobs past
        their lease (retry, failed, dead letter), then delete finished jobs past
        ``deletion_seconds`` and queued jobs past ``keep_until``; then the cron
        timekeeper and the ``__pgboss__send-it`` queue. Each step honours the
        cluster-wide throttles shared with other supervisors and Node pg-boss
        (``force=True`` ignores them). Advisory locks are only tried: a step whose
        lock another session holds is skipped and listed in ``report.busy``. Every
        statement runs in a savepoint, so the transaction stays usable.

        >>> with Session(engine) as session, session.begin():
        ...     report = QueueService(session).supervise(force=True)  # doctest: +SKIP

        :param queues: a queue name or names (monitor and deletion); default all.
        :param settings: ``supervise``, ``schedule``, ``monitor_interval``,
            ``maintenance_interval``, ``cron_monitor_interval``,
            ``warning_queue_size``, ``delete_batch_size``, ``expire_batch_size``
            (see :class:`~alkstore_sa.supervision.Supervisor`), and ``now``:
            an aware datetime the statements use instead of the database clock,
            for tests, within an hour of the current time.
        :raises InvalidOptionsError: for a bad setting, before any SQL.
        """
        return self._run(
            ops.supervision.supervise_once(self._ctx, queues, force=force, options=settings)
        )

    # ------------------------------------------------------------ observability

    def get_queue_stats_history(
        self,
        name: str,
        *,
        from_: datetime | None = None,
        to: datetime | None = None,
        limit: int = 1000,
        bucket_seconds: int | None = None,
        max_data_points: int | None = None,
        aggregate: str = "max",
        percentiles: Sequence[float] | None = None,
    ) -> list[QueueStatsSnapshot]:
        """The queue's recorded statistics over time, newest first (schema 46;
        pg-boss's ``getQueueStats`` with history on).

        Reads the ``queue_stats`` rows that supervision passes write with
        queue-stats history on (ours with ``persist_queue_stats``, or Node's
        ``persistQueueStats``): those captured between ``from_`` and ``to``
        (aware datetimes, inclusive; ``None`` is open), at most ``limit``
        (1 to 100,000). With ``bucket_seconds`` (or ``max_data_points``, which
        picks the width so the series fits in about that many points), one
        snapshot per epoch-aligned bucket: gauges collapsed by ``aggregate``
        (``"max"``, ``"min"`` or ``"avg"``), counters and histograms summed
        (the "Observe queues, warnings and workers" page). ``percentiles`` (percents from 1 to 100)
        fills each snapshot's ``percentiles`` from its histograms.

        :raises QueueNotFoundError: if the queue does not exist.
        :raises SchemaFeatureError: on a schema below 46.
        :raises InvalidOptionsError: for a bad option, before any SQL.
        """
        options: dict[str, object] = {
            "from_": from_,
            "to": to,
            "limit": limit,
            "bucket_seconds": bucket_seconds,
            "max_data_points": max_data_points,
            "aggregate": aggregate,
            "percentiles": percentiles,
        }
        return self._run(ops.observe.get_queue_stats_history(self._ctx, name, options))

    def count_completions(
        self, names: Sequence[str], *, since: datetime, bucket_seconds: int = 300
    ) -> dict[str, list[int]]:
        """Completed jobs of each queue in ``names`` per ``bucket_seconds`` since
        ``since`` (an aware datetime in the past), oldest bucket first, the last one
        reaching now (schema 46).

        Read from the job table itself (an index range per queue), so it needs no
        queue-stats history; it sees only the jobs not yet deleted by maintenance. A
        name without a queue counts zeros. At most 1,000 queues and 1,000 buckets.

        :raises SchemaFeatureError: on a schema below 46.
        :raises InvalidOptionsError: for a bad argument, before any SQL.
        """
        return self._run(ops.observe.count_completions(self._ctx, names, since, bucket_seconds))

    def get_warnings(
        self,
        type: str | None = None,
        *,
        since: datetime | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[PersistedWarning]:
        """Persisted warnings, newest first (schema 46's ``warning`` table).

        Supervisors write them with ``persist_warnings`` (ours) or
        ``persistWarnings`` (Node) and keep them 365 days by default. ``type``
        keeps one kind (``"queue_backlog"``, ``"index_bloat"``, ...), ``since``
        (an aware datetime) only newer ones; ``limit`` (1 to 100,000) rows after
        skipping ``offset``.

        :raises SchemaFeatureError: on a schema below 46.
        :raises InvalidOptionsError: for a bad option, before any SQL.
        """
        return self._run(ops.observe.get_warnings(self._ctx, type, since, limit, offset))

    def get_instances(
        self, *, limit: int = 1000, after: uuid.UUID | str | None = None
    ) -> list[Instance]:
        """The clients registered in the ``instance`` table, oldest start first
        (schema 46; pg-boss's ``getInstances``): Node PgBoss objects and
        alkstore_sa workers, live or not (``live``).

        ``limit`` (1 to 100,000) rows; ``after`` (an instance id, the last of the
        previous page) continues a listing.

        :raises SchemaFeatureError: on a schema below 46.
        :raises InvalidOptionsError: for a bad option, or an ``after`` no longer
            registered.
        """
        return self._run(ops.observe.get_instances(self._ctx, limit, after))
