"""One attempt at one job, and how it ends: outputs, settlements, counters."""

from __future__ import annotations

import json
import math
import threading
import traceback
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from .. import options as opt
from ..errors import InvalidOptionsError
from ..limits import MAX_ERROR_TEXT_BYTES
from ..ops import Settlement
from ..records import Job
from .config import HEARTBEAT_FRACTION, LEASE_FRACTION, HandlerSpec

Kind = Literal["complete", "fail"]

SHUTDOWN_MESSAGE = "worker shut down while active"

ErrorCallback = Callable[[BaseException, Job | None], None]


def timeout_output(seconds: float) -> dict[str, str]:
    """Output of a job whose handler ran past its timeout."""
    return {"name": "JobTimeout", "message": f"handler ran longer than its {seconds:g} s timeout"}


def shutdown_output() -> dict[str, str]:
    """Output of a job still running when the worker's shutdown timeout ran out."""
    return {"name": "WorkerShutdown", "message": SHUTDOWN_MESSAGE}


RUNNING, SETTLING, ABANDONED = "running", "settling", "abandoned"


@dataclass(eq=False)
class Attempt:
    """One run of one job by this worker.

    ``status`` moves once, from ``running`` to ``settling`` (the handler finished)
    or ``abandoned`` (timeout or shutdown); whoever moves it decides the job's
    outcome, so a job is never settled twice by the same worker.

    ``lease_start`` is when the job was last fetched or touched (its lease
    extended and, at schema 46, its ``heartbeat_on`` stamped). ``started`` is
    when a runner took it from the buffer (``None`` while it waits there); the
    handler's ``timeout`` counts from then, a timeout that is the lease itself
    (no ``extend_lease``, no ``timeout``) from the claim.
    """

    job: Job
    spec: HandlerSpec
    lease_start: float
    deadline: float | None
    lease_seconds: float = 0.0
    status: str = RUNNING
    lost: bool = False
    handle: Any = None
    started: float | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    fetched_at: float = field(init=False, repr=False)

    def take(self, status: str) -> bool:
        """Move from ``running`` to ``status``; ``False`` if someone else moved it first."""
        with self._lock:
            if self.status != RUNNING:
                return False
            self.status = status
            return True

    def __post_init__(self) -> None:
        self.fetched_at = self.lease_start

    def start(self, now: float) -> None:
        """A runner takes the job from the buffer at ``now``: its deadline starts."""
        self.started = now
        timeout = self.spec.job_timeout(self.job.expire_seconds)
        if timeout is not None:
            anchor = now if self.spec.timeout is not None else self.fetched_at
            self.deadline = anchor + timeout

    def running_for(self, now: float) -> float:
        """Seconds since a runner took the job (0 while it is buffered)."""
        return 0.0 if self.started is None else now - self.started

    def lease_due(self, now: float) -> bool:
        """Whether the job must be touched now: half its lease gone (with
        ``extend_lease``) or half its heartbeat (``heartbeat_seconds``, schema 46),
        whichever comes first."""
        if self.status != RUNNING or self.lost or self.started is None:
            # A buffered job is not touched: it waits briefly (see AHEAD_SECONDS),
            # and a touch would raise the expire_seconds it is given back with.
            return False
        every = []
        if self.spec.extend_lease:
            every.append(self.lease_seconds * LEASE_FRACTION)
        if self.job.heartbeat_seconds:
            every.append(self.job.heartbeat_seconds * HEARTBEAT_FRACTION)
        return bool(every) and now >= self.lease_start + min(every)

    def extend_by(self, now: float) -> int:
        """Seconds from now the touch sets the lease to.

        With ``extend_lease`` the job's own ``expire_seconds``. Without it the job
        is touched only for its heartbeat, and the lease keeps (at most) its
        original end: the seconds left of it, at least one (the handler's own
        deadline, the same original lease, ends the attempt anyway).
        """
        if self.spec.extend_lease:
            return self.job.expire_seconds
        return max(1, self.job.expire_seconds - math.ceil(now - self.fetched_at))

    def settlement(self, output: Any = None) -> Settlement:
        # The fetched started_on is the fencing token: a later attempt of the
        # same job has another one, so this worker cannot settle it.
        return Settlement(self.job.id, output, self.job.started_on)


@dataclass(eq=False)
class Pending:
    """A settlement waiting for the completer.

    ``error``: the handler's exception, kept for the traceback of the record that
    says the job failed for good; ``duration``: seconds the handler ran.
    """

    kind: Kind
    attempt: Attempt
    output: Any
    reason: str
    error: BaseException | None = None
    duration: float | None = None
    substitute: bool = False
    """This fails the job in place of a settlement the database refused (its output
    is small); if the database refuses it too, the worker gives the job up."""
    retried_change: bool = False
    """A statement of this settlement already failed as a changed schema would; a
    second such failure is a refusal (see :func:`refused_for_good`)."""


@dataclass(frozen=True, slots=True)
class QueueCounts:
    """Per-queue counters of a worker (see :meth:`Worker.stats`).

    ``failed`` counts failed attempts (handler errors, timeouts, shutdown);
    ``lost`` counts attempts whose job was taken away (expired and re-fetched,
    cancelled, deleted) before this worker could settle it. ``claims`` counts the claim
    statements that answered, empty answers included: it moves each time the worker looks
    at the queue, whether a poll, a notification or a finished job made it look.
    ``running`` counts the jobs whose handler runs now, ``buffered`` the jobs claimed
    ahead that wait for a free slot (see ``prefetch``).
    """

    fetched: int = 0
    completed: int = 0
    failed: int = 0
    lost: int = 0
    running: int = 0
    claims: int = 0
    buffered: int = 0


def cut(text: str, limit: int = MAX_ERROR_TEXT_BYTES) -> str:
    """``text`` itself, or its start in at most ``limit`` bytes of UTF-8."""
    if len(text) * 4 <= limit:
        return text
    encoded = text.encode("utf-8", "replace")
    if len(encoded) <= limit:
        return text
    return encoded[:limit].decode("utf-8", "ignore")


def error_output(exc: BaseException) -> dict[str, Any]:
    """The ``{name, message, stack}`` output of a handler's error, bounded.

    Past :data:`~alkstore_sa.limits.MAX_ERROR_TEXT_BYTES` the message and the stack
    (which holds the message again, and every error chained to it) are each kept as
    their start, and ``truncated`` says how many bytes of JSON the whole error was, as
    the attempt history keeps an error: a huge message fails its job with that message,
    never with an error about the output's size.
    """
    output = opt.error_output(exc)
    message, stack = output["message"], output["stack"]
    if len(message) * 4 <= MAX_ERROR_TEXT_BYTES and len(stack) * 4 <= MAX_ERROR_TEXT_BYTES:
        return output
    short = {**output, "message": cut(message), "stack": cut(stack)}
    if short["message"] == message and short["stack"] == stack:
        return output
    size = len(json.dumps(output, ensure_ascii=False).encode("utf-8", "replace"))
    return {**short, "truncated": size}


def refused_output(exc: BaseException) -> dict[str, Any]:
    """The output of a job whose result or error could not be stored (``exc`` says
    why): that error alone, bounded, without what it chained (the refused value's
    own error may be megabytes)."""
    return {
        "name": type(exc).__name__,
        "message": cut(str(exc)),
        "stack": cut("".join(traceback.format_exception(exc, chain=False))),
    }


def prepare_output(kind: Kind, value: Any) -> tuple[Kind, Any]:
    """Map a handler result or error to its stored output.

    An error is bounded (:func:`error_output`). A return value that JSON cannot
    encode fails the job (with an error saying so) rather than being dropped on the
    floor; that output is built after the ``except`` that met the refusal, so it
    chains nothing.
    """
    output = error_output(value) if isinstance(value, BaseException) else opt.output_value(value)
    refusal: InvalidOptionsError | None = None
    try:
        opt.encode_json("output", output)
    except InvalidOptionsError as exc:
        refusal = exc
    if refusal is None:
        return kind, output
    return "fail", refused_output(refusal)


def group(pendings: Sequence[Pending]) -> dict[tuple[str, Kind], list[Pending]]:
    """Pending settlements by queue and kind: one statement per group."""
    groups: dict[tuple[str, Kind], list[Pending]] = defaultdict(list)
    for p in pendings:
        groups[(p.attempt.job.name, p.kind)].append(p)
    return groups


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
