"""Steps: how the worker, supervision and drain logic is written once for sync and async.

That logic is written as generators that *yield steps* (wait for an event, run an
operation in a transaction, call a handler, join threads or tasks) and receive each
step's answer, or have its error thrown back in. It never blocks and never awaits;
it decides. A runtime answers the steps: the sync one by blocking calls on its own
thread, the async one by awaiting. :func:`drive` and :func:`adrive` are the two
loops that feed answers back. :func:`answering` and :func:`aanswering` make the one
answer of each flavour to the steps every runtime answers alike (:class:`Wait`,
:class:`Invoke`, :class:`Join`); a runtime supplies only its answer to the others
(:class:`Run`, and steps of its own).

Operations themselves (the statements) are still executed by
:mod:`alkstore_sa.ops.driver` only: a runtime's answer to :class:`Run` calls
``driver.run`` / ``driver.arun``. See the "Architecture" page.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

Steps = Generator[Any, Any, T]
"""A generator of steps returning ``T``."""


@dataclass(frozen=True, slots=True)
class Wait:
    """Wait for ``event`` (``threading.Event`` or ``asyncio.Event``) at most
    ``timeout`` seconds (``None``: no limit). Answer: whether it is set."""

    event: Any
    timeout: float | None


@dataclass(frozen=True, slots=True)
class Run:
    """Run the operation ``op`` in a transaction of its own, or on ``session``
    (already in a transaction) when given, or with ``autocommit`` on a connection
    in autocommit (each statement its own transaction, see
    :func:`alkstore_sa.ops.driver.run`). Answer: the operation's result."""

    op: Any
    session: Any = None
    autocommit: bool = False


@dataclass(frozen=True, slots=True)
class Invoke:
    """Call ``fn(*args)``; the async runtime awaits an awaitable result, and runs a
    ``blocking`` function on a thread. Answer: its value."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    blocking: bool = False


@dataclass(frozen=True, slots=True)
class Join:
    """Wait for ``handles`` (threads, or tasks; ``None`` entries are skipped) to end,
    ``timeout`` seconds in all. Answer: whether all ended."""

    handles: Sequence[Any]
    timeout: float


def answering(other: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The blocking answer to every step: :class:`Invoke`, :class:`Wait` and
    :class:`Join` here (threads joined), any other step by ``other``."""

    def answer(step: Any) -> Any:
        kind = type(step)
        if kind is Invoke:
            return step.fn(*step.args)
        if kind is Wait:
            return step.event.wait(step.timeout)
        if kind is Join:
            deadline = time.monotonic() + step.timeout
            for thread in step.handles:
                if thread is not None:
                    thread.join(max(0.0, deadline - time.monotonic()))
            return not any(t is not None and t.is_alive() for t in step.handles)
        return other(step)

    return answer


def aanswering(other: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[Any]]:
    """The awaiting answer to every step: :class:`Invoke` (an awaitable result awaited,
    a ``blocking`` function run on a thread), :class:`Wait` (an ``asyncio.Event``) and
    :class:`Join` (tasks) here, any other step by ``other``."""

    async def answer(step: Any) -> Any:
        kind = type(step)
        if kind is Invoke:
            if step.blocking:
                return await asyncio.to_thread(step.fn, *step.args)
            value = step.fn(*step.args)
            return await value if inspect.isawaitable(value) else value
        if kind is Wait:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(step.event.wait(), step.timeout)
            return step.event.is_set()
        if kind is Join:
            tasks = [t for t in step.handles if t is not None]
            if not tasks:
                return True
            _, pending = await asyncio.wait(tasks, timeout=step.timeout)
            return not pending
        return await other(step)

    return answer


class _Feed(Generic[T]):
    """Feeds answers (or errors) back into a generator of steps."""

    __slots__ = ("_error", "_reply", "_steps", "result")

    def __init__(self, steps: Steps[T]) -> None:
        self._steps = steps
        self._reply: Any = None
        self._error: BaseException | None = None
        self.result: T

    def __iter__(self) -> _Feed[T]:
        return self

    def __next__(self) -> Any:
        error, self._error = self._error, None
        try:
            if error is not None:
                return self._steps.throw(error)
            return self._steps.send(self._reply)
        except StopIteration as stop:
            self.result = stop.value
            raise StopIteration from None

    def answer(self, value: Any) -> None:
        self._reply = value

    def fail(self, error: BaseException) -> None:
        self._reply, self._error = None, error


def drive(steps: Steps[T], answer: Callable[[Any], Any]) -> T:
    """Run ``steps`` on this thread, ``answer(step)`` answering each one."""
    feed = _Feed(steps)
    for step in feed:
        try:
            feed.answer(answer(step))
        except BaseException as exc:
            feed.fail(exc)
    return feed.result


async def adrive(steps: Steps[T], answer: Callable[[Any], Awaitable[Any]]) -> T:
    """:func:`drive` in a task, awaiting ``answer(step)``.

    A cancellation of the task itself is not handed to the steps: it ends them
    (their ``finally`` blocks run) and propagates. A ``CancelledError`` a handler
    let escape while its task was not being cancelled is an error like any other.
    """
    feed = _Feed(steps)
    for step in feed:
        try:
            feed.answer(await answer(step))
        except asyncio.CancelledError as exc:
            if _task_cancelled():
                steps.close()
                raise
            feed.fail(exc)
        except BaseException as exc:
            feed.fail(exc)
    return feed.result


def _task_cancelled() -> bool:
    """Whether the running task has a cancellation request pending (not merely a
    CancelledError raised by something it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
