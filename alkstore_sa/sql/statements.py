"""The statement set of each pg-boss schema version, chosen once per schema.

An operation runs in a context (:class:`alkstore_sa.ops.Context`) that knows the
installed version; ``ctx.sql`` is that version's set, and operations build their
statements through it without asking which version it is. :class:`Statements`
is schema 26's set; :class:`Statements46` inherits it and supplies what pg-boss
12.38 changed. A later version subclasses the newest set, overrides the
statements its migration changed, and is registered with
:func:`register_statements`; :func:`statements_for` gives a schema the newest set
registered at or below its version. (The contributor page "Following a new
pg-boss release" walks through it.)

Every method returns a fresh or cached SQLAlchemy statement and runs nothing. The
signatures are the same at every version, so an argument one version has no use
for is taken and ignored (schema 46 always orders a claim by priority, say).
A statement a version does not have raises :class:`LookupError`; operations ask
:func:`alkstore_sa.versions.require` first, so that is never reached by a call.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar, NoReturn, TypeVar

from sqlalchemy import ColumnElement, Executable, Table, func

from ..models.enums import JobState
from .common import base
from .v26 import fail as fail26
from .v26 import fetch as fetch26
from .v26 import inspect as inspect26
from .v26 import metrics as metrics26
from .v26 import queues as queues26
from .v26 import send as send26
from .v26 import settle as settle26
from .v46 import cron as cron46
from .v46 import fail as fail46
from .v46 import fetch as fetch46
from .v46 import job_now
from .v46 import metrics as metrics46
from .v46 import queues as queues46
from .v46 import send as send46
from .v46 import settle as settle46
from .v46 import tables as tables46

S = TypeVar("S", bound="type[Statements]")

Failing = Executable | fail46.SplitFail
"""A fail: one statement, or separate ones under ``noMultiMutationCte``."""


class Statements:
    """Schema 26's statements (pg-boss 11.1.x, 12.0 to 12.5), and the shape of every set."""

    version: ClassVar[int] = 26
    """The schema version this set was written for."""

    job: ClassVar[Table] = base.JOB
    """The job table as this version has it (for reads that name its columns)."""

    def __init__(self, flags: frozenset[str] = frozenset(), *, history: bool = False) -> None:
        self.flags = flags
        """The backend profile's compatibility flags (:mod:`alkstore_sa.backends`) that
        choose among this version's statements, as the version chooses the set."""
        self.history = history
        """Whether the schema holds the attempt history table: every fail then records
        the attempts it fails (:mod:`alkstore_sa.models.attempts`)."""

    @property
    def advisory_locks(self) -> bool:
        """Whether the statements may take advisory locks (not under ``noAdvisoryLocks``)."""
        return "noAdvisoryLocks" not in self.flags

    @property
    def splits_mutations(self) -> bool:
        """Whether a statement may change only one table once (``noMultiMutationCte``):
        the fails then run as separate statements (:class:`~.v46.fail.SplitFail`)."""
        return "noMultiMutationCte" in self.flags

    def _missing(self, name: str) -> NoReturn:
        raise LookupError(f"schema {self.version} has no {name} statement")

    # --------------------------------------------------------------- the clock

    def clock(self) -> ColumnElement[Any]:
        """The time every statement of this version reads (``now()`` at 26)."""
        return func.now()

    # ------------------------------------------------------------------- claim

    def takes_key_locks(self, policy: str) -> bool:
        """Whether a claim of a ``policy`` queue locks its keys first."""
        return policy in fetch26.RACY_POLICIES

    def claim(
        self,
        *,
        policy: str,
        priority: bool,
        ignore_start_after: bool,
        relaxed: bool,
        groups: str | None,
        claims: bool = False,
    ) -> Executable:
        """The claim of a ``policy`` queue (``groups``: a group concurrency mode, 46 on;
        ``claims``: a worker's claim that records itself, 26 only, see
        :mod:`~alkstore_sa.sql.v26.claims`)."""
        return fetch26.fetch_jobs(
            priority=priority,
            ignore_start_after=ignore_start_after,
            singleton_aware=self.takes_key_locks(policy),
            relaxed=relaxed,
            claims=claims,
        )

    def lock_keys(self, *, policy: str, priority: bool, ignore_start_after: bool) -> Executable:
        """Lock the keys of the next claimable jobs, before the claim."""
        return fetch26.lock_keys(priority=priority, ignore_start_after=ignore_start_after)

    def keyed_jobs(self, *, policy: str, priority: bool, ignore_start_after: bool) -> Executable:
        """The claimable jobs of the keys in ``:keys``, row-locked, to fail them."""
        return fetch26.keyed_jobs(priority=priority, ignore_start_after=ignore_start_after)

    def takes_group_locks(self) -> bool:
        """Whether a claim with a global group concurrency locks its groups first."""
        return self.advisory_locks

    def lock_groups(self, *, policy: str, ignore_start_after: bool) -> Executable:
        """Lock the groups of the next claimable jobs (group concurrency, 46 on)."""
        self._missing("lock_groups")

    # ------------------------------------------------------------ by job id

    def complete_jobs(self) -> Executable:
        return settle26.complete_jobs()

    def fail_jobs(self) -> Failing:
        """Fail jobs by id, fenced or not (binds ``:worker`` and ``:worker_id`` when
        :attr:`history` is on)."""
        return fail26.fail_jobs(history=self.history)

    def fail_poison(self) -> Failing:
        return fail26.fail_poison(history=self.history)

    def rescue_jobs(self) -> Failing:
        """Fail a batch of the active jobs our workers claimed whose worker stopped
        renewing its claims (26: :mod:`~alkstore_sa.sql.v26.claims`; 46 has heartbeats)."""
        return fail26.rescue_jobs(history=self.history)

    def expire_jobs(self, *, heartbeat: bool) -> Failing:
        """Fail a batch of the active jobs whose lease ran out, or (``heartbeat``)
        whose heartbeat stopped (46 on; 26 expires in its own statements)."""
        self._missing("expire_jobs")

    def cancel_jobs(self) -> Executable:
        return settle26.cancel_jobs()

    def resume_jobs(self) -> Executable:
        return settle26.resume_jobs()

    def retry_jobs(self) -> Executable:
        return settle26.retry_jobs()

    def delete_jobs(self) -> Executable:
        stmt: Executable = settle26.delete_jobs()
        return stmt

    def delete_by_state(self, which: str) -> Executable:
        stmt: Executable = settle26.delete_by_state(which)
        return stmt

    def reduce_retained(self) -> Executable:
        """Take resumed or deleted jobs off a queue's retained and total counts (46 on)."""
        self._missing("reduce_retained")

    def extend_lease(self) -> Executable:
        return settle26.extend_lease()

    def give_back(self) -> Executable:
        return settle26.give_back()

    def touch_jobs(self) -> Executable:
        """Refresh the heartbeat of running jobs (46 on)."""
        self._missing("touch_jobs")

    def locate_jobs(self) -> Executable:
        return settle26.locate_jobs()

    def get_jobs(self) -> Executable:
        """Jobs by id, every column in a form any row can be read in."""
        return _readable_get_jobs26()

    # ------------------------------------------------------------------ send

    def insert_jobs(
        self, *, notify: bool, given: frozenset[str], traced: bool, conflicts: bool = True
    ) -> Executable:
        """The insert behind ``send`` (``traced``: carries a trace context, 46 on;
        ``conflicts``: see :func:`alkstore_sa.sql.v26.send.insert_jobs`)."""
        return send26.insert_jobs(notify=notify, given=given, conflicts=conflicts)

    # ---------------------------------------------------------------- queues

    def get_queues(self, *, by_name: bool) -> Executable:
        return queues26.get_queues(by_name=by_name)

    def update_queue(self, columns: tuple[str, ...]) -> Executable:
        return queues26.update_queue(columns)

    def get_schedules(self, *, by_name: bool, by_key: bool) -> Executable:
        return queues26.get_schedules(by_name=by_name, by_key=by_key)

    def upsert_schedule(self) -> Executable:
        """Store a schedule (``:kind`` is bound from 46 on, where rows name it)."""
        return queues26.upsert_schedule()  # type: ignore[no-any-return]

    # --------------------------------------------------------------- reading

    def list_jobs(self, state: JobState | None) -> Executable:
        return inspect26.list_jobs(state)

    def queue_metrics(self) -> Executable:
        """The per-queue counters and ages behind the Prometheus metrics."""
        return metrics26.queue_metrics()


@functools.cache
def _readable_get_jobs26() -> Executable:
    from .common.reading import readable

    return readable(settle26.get_jobs())


class Statements46(Statements):
    """Schema 46's statements (pg-boss 12.38.0): what changed since 26."""

    version: ClassVar[int] = 46
    job: ClassVar[Table] = tables46.JOB

    def clock(self) -> ColumnElement[Any]:
        """``<schema>.job_now()``: the clock a Node test may replace."""
        return job_now()

    def takes_key_locks(self, policy: str) -> bool:
        return policy in fetch46.SINGLETON_POLICIES and self.advisory_locks

    def claim(
        self,
        *,
        policy: str,
        priority: bool,
        ignore_start_after: bool,
        relaxed: bool,
        groups: str | None,
        claims: bool = False,
    ) -> Executable:
        # pg-boss 12.38 always orders by priority (job_i11's order): ``priority``
        # is not an option there.
        return fetch46.fetch_jobs(
            policy=policy,
            ignore_start_after=ignore_start_after,
            relaxed=relaxed,
            groups=groups,
            skip_locked="noSkipLocked" not in self.flags,
            advisory=self.advisory_locks,
        )

    def lock_keys(self, *, policy: str, priority: bool, ignore_start_after: bool) -> Executable:
        return fetch46.lock_keys(policy=policy, ignore_start_after=ignore_start_after)

    def keyed_jobs(self, *, policy: str, priority: bool, ignore_start_after: bool) -> Executable:
        return fetch46.keyed_jobs(policy=policy, ignore_start_after=ignore_start_after)

    def lock_groups(self, *, policy: str, ignore_start_after: bool) -> Executable:
        return fetch46.lock_groups(policy=policy, ignore_start_after=ignore_start_after)

    def complete_jobs(self) -> Executable:
        return settle46.complete_jobs()

    def fail_jobs(self) -> Failing:
        # The fail that carries every column and backs off as pg-boss 12.38 does.
        if self.splits_mutations:
            return fail46.fail_jobs_split(history=self.history)
        return fail46.fail_jobs(history=self.history)

    def fail_poison(self) -> Failing:
        if self.splits_mutations:
            return fail46.fail_poison_split(history=self.history)
        return fail46.fail_poison(history=self.history)

    def rescue_jobs(self) -> Failing:
        self._missing("rescue_jobs")

    def expire_jobs(self, *, heartbeat: bool) -> Failing:
        if self.splits_mutations:
            skip_locked = "noSkipLocked" not in self.flags
            return fail46.expire_split(
                heartbeat=heartbeat, skip_locked=skip_locked, history=self.history
            )
        if heartbeat:
            return fail46.expire_heartbeats(history=self.history)
        return fail46.expire_jobs(history=self.history)

    def cancel_jobs(self) -> Executable:
        return settle46.cancel_jobs()

    def resume_jobs(self) -> Executable:
        return settle46.resume_jobs()

    def retry_jobs(self) -> Executable:
        return settle46.retry_jobs()

    def delete_jobs(self) -> Executable:
        return settle46.delete_jobs()

    def delete_by_state(self, which: str) -> Executable:
        return settle46.delete_by_state(which)

    def reduce_retained(self) -> Executable:
        return settle46.reduce_retained()

    def extend_lease(self) -> Executable:
        return settle46.extend_lease()

    def give_back(self) -> Executable:
        return settle46.give_back()

    def touch_jobs(self) -> Executable:
        return settle46.touch_jobs()

    def locate_jobs(self) -> Executable:
        return settle46.locate_jobs()

    def get_jobs(self) -> Executable:
        return fetch46.get_jobs()

    def insert_jobs(
        self, *, notify: bool, given: frozenset[str], traced: bool, conflicts: bool = True
    ) -> Executable:
        return send46.insert_jobs(notify=notify, given=given, traced=traced, conflicts=conflicts)

    def get_queues(self, *, by_name: bool) -> Executable:
        # Also the settings pg-boss 12 added (heartbeat_seconds, notify).
        return queues46.get_queues(by_name=by_name)

    def update_queue(self, columns: tuple[str, ...]) -> Executable:
        return queues46.update_queue(columns)

    def get_schedules(self, *, by_name: bool, by_key: bool) -> Executable:
        return cron46.get_schedules(by_name=by_name, by_key=by_key)

    def upsert_schedule(self) -> Executable:
        return cron46.upsert_schedule()  # type: ignore[no-any-return]

    def list_jobs(self, state: JobState | None) -> Executable:
        return fetch46.list_jobs(state)

    def queue_metrics(self) -> Executable:
        return metrics46.queue_metrics()


_SETS: dict[int, type[Statements]] = {}


def register_statements(cls: S) -> S:
    """Register a statement set class for its ``version`` (usable as a decorator).

    A schema at that version, or above it with no newer set registered, speaks it.
    """
    _SETS[cls.version] = cls
    _statements_for.cache_clear()
    return cls


def statements_for(
    version: int, flags: frozenset[str] = frozenset(), *, history: bool = False
) -> Statements:
    """The statement set of a schema at ``version``: the newest registered at or
    below it (the oldest set for a version below every one), choosing by the
    backend profile's ``flags`` and by whether the schema keeps the attempt
    ``history``; one object for each combination."""
    return _statements_for(version, flags, history=history)


@functools.cache
def _statements_for(version: int, flags: frozenset[str], *, history: bool) -> Statements:
    # Keyed on every argument however the caller spelt them.
    fitting = [v for v in _SETS if v <= version]
    return _SETS[max(fitting) if fitting else min(_SETS)](flags, history=history)


register_statements(Statements)
register_statements(Statements46)


def unregister_statements(version: int) -> None:
    """Forget the set registered for ``version`` (for tests that plug one in)."""
    _SETS.pop(version, None)
    _statements_for.cache_clear()


__all__ = [
    "Statements",
    "Statements46",
    "register_statements",
    "statements_for",
    "unregister_statements",
]
