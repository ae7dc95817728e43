"""Handler registration and per-queue settings, shared by both worker flavours."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from ..errors import InvalidOptionsError, shown
from ..groups import GroupConcurrencyConfig, GroupLimits, group_limits
from ..names import queue_ref

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_CONCURRENCY = 1
MAX_DEFAULT_BATCH = 100
DEFAULT_POLL_INTERVAL = 2.0
DEFAULT_SHUTDOWN_TIMEOUT = 30.0

LEASE_FRACTION = 0.5
"""A job's lease is renewed once this fraction of it has elapsed."""

PREFETCH_MULTIPLIER = 4
"""``prefetch`` by default: this many times ``concurrency`` (Celery's default multiplier
too). Fewer jobs per claim statement cost more per job: at concurrency 10 the bench
drained about 7,300 no-op jobs/s with ``prefetch=10`` and 9,600 with 40
(bench/README.md, "Performance, round 2")."""

AHEAD_SECONDS = 1.0
"""A worker claims ahead of its free slots (``prefetch``) only as many jobs as its
handlers will start within about this many seconds, at their average run time."""

LIVENESS_SECONDS = 20
"""A worker's ``liveness_seconds`` by default. At schema 46: the heartbeat its claims
give a job that has none, renewed by the worker every half of it while the job is in
hand, so that a job whose worker died fails by heartbeat (retried, not lost) about
this long after the death, not after its whole lease (``expire_seconds``). The
worker sweeps its queues for such jobs every half of it (the "Guarantees" page). At 26,
where jobs have no heartbeat: how long after the worker's last renewal of its claim
records (``alkstore_claim``) its jobs are swept."""

MIN_LIVENESS_SECONDS = 10
"""The least ``liveness_seconds``: pg-boss refuses a heartbeat under 10 seconds."""

HEARTBEAT_FRACTION = 0.5
"""A job with ``heartbeat_seconds`` (schema 46) is touched once this fraction of its
heartbeat has elapsed since the last touch: pg-boss's monitor fails an active job
whose ``heartbeat_on`` is older than its ``heartbeat_seconds``."""


@dataclass(frozen=True, slots=True)
class HandlerSpec:
    """One queue's handler and the settings the worker runs it with.

    :param queue: the queue name.
    :param fn: ``fn(job)``, or ``fn(job, session)`` when ``transactional``.
    :param concurrency: at most this many jobs of the queue run at once.
    :param batch_size: at most this many jobs are claimed per fetch statement
        (never more than the free handler slots plus the free ``prefetch``
        places); by default the concurrency plus the prefetch, up to 100, so
        that a busy queue is claimed in batches, not job by job.
    :param prefetch: jobs claimed ahead of the free handler slots and held in
        the worker's buffer until a slot frees (``0``: claim only into free
        slots). By default :data:`PREFETCH_MULTIPLIER` times ``concurrency``. A buffered job is
        ``active`` in the table and its lease runs while it waits, so the worker
        claims ahead only as many jobs as its handlers will start within about
        :data:`AHEAD_SECONDS`, judged from their average run time, and only on a
        ``standard`` queue without group limits; a graceful stop gives buffered
        jobs back without counting an attempt. See the "Run workers" page.
    :param poll_interval: seconds between fetches when no notification arrives.
    :param transactional: give the handler a session whose writes commit in the
        same transaction as the job's completion.
    :param extend_lease: renew ``expire_seconds`` while the handler runs, so a
        live worker's long job does not expire.
    :param timeout: seconds after which the job is failed with a ``JobTimeout``
        output (async handlers are cancelled, sync ones abandoned). Without it,
        and with ``extend_lease=False``, the job's ``expire_seconds`` is the timeout.
    :param priority: claim higher ``priority`` first (pg-boss's default).
    :param group_concurrency: schema 46: at most this many jobs of one group
        (``group_id``) active in the queue at once, counted in the database, so
        that every worker of every process (and Node pg-boss's) counts the others'
        jobs. An integer, or ``{"default": n, "tiers": {tier: n}}``: the limit of
        a group whose jobs have a tier the mapping names, else ``default``. See
        the "Limit concurrency per group" page.
    :param local_group_concurrency: schema 46: the same limit counted only among
        this worker's own running jobs of the queue (no group locks, no counting
        in the database); at most ``concurrency``. Not with ``group_concurrency``.
    """

    queue: str
    fn: Callable[..., Any]
    concurrency: int = DEFAULT_CONCURRENCY
    batch_size: int | None = None
    prefetch: int | None = None
    poll_interval: float = DEFAULT_POLL_INTERVAL
    transactional: bool = False
    extend_lease: bool = True
    timeout: float | None = None
    priority: bool = True
    group_concurrency: int | GroupConcurrencyConfig | None = None
    local_group_concurrency: int | GroupConcurrencyConfig | None = None

    def __post_init__(self) -> None:
        queue_ref(self.queue, "queue")
        if not callable(self.fn):
            raise InvalidOptionsError("handler", f"{shown(self.fn)} is not callable")
        _positive_int("concurrency", self.concurrency, 10_000)
        if self.batch_size is not None:
            _positive_int("batch_size", self.batch_size, 100_000)
        if self.prefetch is not None:
            _count("prefetch", self.prefetch, 10_000)
        _positive_float("poll_interval", self.poll_interval)
        for flag in ("transactional", "extend_lease", "priority"):
            if not isinstance(getattr(self, flag), bool):
                value = getattr(self, flag)
                raise InvalidOptionsError(flag, f"must be True or False, not {shown(value)}")
        if self.timeout is not None:
            _positive_float("timeout", self.timeout)
        spec_group_limits(self)  # checked at registration, not at the first fetch
        if self.local_group_concurrency is not None:
            if self.group_concurrency is not None:
                raise InvalidOptionsError(
                    "local_group_concurrency",
                    "cannot be combined with group_concurrency: choose one",
                )
            most = group_limits(self.local_group_concurrency, "local_group_concurrency").most
            if most > self.concurrency:
                raise InvalidOptionsError(
                    "local_group_concurrency",
                    f"a limit of {most} cannot exceed the concurrency ({self.concurrency})",
                )

    @property
    def ahead(self) -> int:
        """The most jobs held claimed beyond ``concurrency`` (``prefetch`` resolved)."""
        return PREFETCH_MULTIPLIER * self.concurrency if self.prefetch is None else self.prefetch

    @property
    def fetch_size(self) -> int:
        """Jobs claimed per fetch at most: every slot and buffer place free."""
        most = self.concurrency + self.ahead
        if self.batch_size is not None:
            return min(self.batch_size, most)
        return min(most, MAX_DEFAULT_BATCH)

    def fetch_threshold(self, capacity: int, *, backlog: bool) -> int:
        """Free places (of ``capacity``: slots plus buffer places now) to wait for
        before the next fetch.

        While the queue has a backlog (the last claim came back full), waiting for
        half a batch of free places keeps claims large; one claim per freed slot
        would cost a statement per job and fall behind under load.
        """
        return max(1, min(self.fetch_size, capacity) // 2) if backlog else 1

    def job_timeout(self, expire_seconds: int) -> float | None:
        """Seconds this handler may run on a job with the given ``expire_seconds``."""
        if self.timeout is not None:
            return self.timeout
        return None if self.extend_lease else float(expire_seconds)

    @property
    def is_async(self) -> bool:
        """Whether calling ``fn`` gives an awaitable."""
        return is_async_callable(self.fn)


def spec_group_limits(spec: HandlerSpec) -> GroupLimits | None:
    """``spec``'s checked group limits (global or local), or None."""
    if spec.group_concurrency is not None:
        return group_limits(spec.group_concurrency)
    if spec.local_group_concurrency is not None:
        return group_limits(spec.local_group_concurrency, "local_group_concurrency")
    return None


def is_async_callable(fn: object) -> bool:
    """``async def`` functions, partials of them and objects with an async ``__call__``."""
    call = type(fn).__call__ if callable(fn) and not inspect.isroutine(fn) else None
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def _positive_int(option: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise InvalidOptionsError(
            option, f"must be an integer from 1 to {maximum}, not {shown(value)}"
        )


def _count(option: str, value: object, maximum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise InvalidOptionsError(
            option, f"must be an integer from 0 to {maximum}, not {shown(value)}"
        )


def _positive_float(option: str, value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidOptionsError(
            option, f"must be a positive number of seconds, not {shown(value)}"
        )


_SPEC_OPTIONS = frozenset(HandlerSpec.__dataclass_fields__) - {"queue", "fn"}


class Registry:
    """Handlers by queue, with defaults for the settings a handler leaves out.

    Workers inherit from it, so ``worker.handler(...)`` and ``worker.register(...)``
    are methods of the worker.
    """

    _async_handlers: bool = False

    def __init__(
        self,
        handlers: Mapping[str, Callable[..., Any] | HandlerSpec] | None = None,
        **defaults: Any,
    ) -> None:
        unknown = set(defaults) - _SPEC_OPTIONS
        if unknown:
            raise InvalidOptionsError(sorted(unknown)[0], "unknown worker option")
        self._defaults = {k: v for k, v in defaults.items() if v is not None}
        # Validate the defaults once, with a stand-in handler.
        HandlerSpec("defaults", print, **self._defaults)
        self._specs: dict[str, HandlerSpec] = {}
        for queue, target in (handlers or {}).items():
            if isinstance(target, HandlerSpec):
                self._add(replace(target, queue=queue))
            else:
                self.register(queue, target)

    def register(self, queue: str, fn: Callable[..., Any], **options: Any) -> HandlerSpec:
        """Register ``fn`` as the handler of ``queue``; returns its settings.

        Options are those of :class:`HandlerSpec`; the ones left out take the
        worker's defaults.

        :raises InvalidOptionsError: for a bad option, a second handler for the
            same queue, or a handler of the wrong flavour (sync vs async).
        """
        unknown = set(options) - _SPEC_OPTIONS
        if unknown:
            raise InvalidOptionsError(sorted(unknown)[0], "unknown handler option")
        merged = {**self._defaults, **{k: v for k, v in options.items() if v is not None}}
        if "timeout" in options:
            merged["timeout"] = options["timeout"]
        return self._add(HandlerSpec(queue, fn, **merged))

    def handler(self, queue: str, **options: Any) -> Callable[[F], F]:
        """Decorator form of :meth:`register`.

        Example::

            @worker.handler("emails", concurrency=5, batch_size=5)
            def send_email(job):
                return {"sent": True}
        """

        def decorate(fn: F) -> F:
            self.register(queue, fn, **options)
            return fn

        return decorate

    def _add(self, spec: HandlerSpec) -> HandlerSpec:
        if spec.queue in self._specs:
            raise InvalidOptionsError("queue", f"{shown(spec.queue)} already has a handler")
        if spec.is_async != self._async_handlers:
            wanted = "an async" if self._async_handlers else "a plain (sync)"
            other = "Worker" if self._async_handlers else "AsyncWorker"
            raise InvalidOptionsError(
                "handler",
                f"{shown(spec.queue)}: this worker runs {wanted} function; "
                f"use {other} for the other kind",
            )
        self._specs[spec.queue] = spec
        return spec

    @property
    def specs(self) -> dict[str, HandlerSpec]:
        """The registered handlers by queue (a copy)."""
        return dict(self._specs)

    def configure(
        self,
        *,
        queues: Iterable[str] | None = None,
        concurrency: int | None = None,
        prefetch: int | None = None,
    ) -> None:
        """Narrow the worker to ``queues`` and/or set every queue's ``concurrency``
        and ``prefetch``.

        Used by ``alkstore worker --queue/--concurrency/--prefetch``; call it before
        starting.

        :raises InvalidOptionsError: if a queue has no handler.
        """
        if queues is not None:
            wanted = list(queues)
            missing = [q for q in wanted if q not in self._specs]
            if missing:
                raise InvalidOptionsError(
                    "queue",
                    f"no handler registered for {shown(missing[0])} "
                    f"(registered: {', '.join(sorted(self._specs)) or 'none'})",
                )
            self._specs = {q: self._specs[q] for q in wanted}
        if concurrency is not None:
            _positive_int("concurrency", concurrency, 10_000)
            self._specs = {q: replace(s, concurrency=concurrency) for q, s in self._specs.items()}
        if prefetch is not None:
            _count("prefetch", prefetch, 10_000)
            self._specs = {q: replace(s, prefetch=prefetch) for q, s in self._specs.items()}
