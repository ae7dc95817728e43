"""Handler thread pools of :class:`~alkstore_sa.Worker`."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

Task = Callable[[], bool]
"""A unit of work for a pool thread; it returns ``True`` when its thread must retire."""


class Pool:
    """``size`` threads running tasks for one queue.

    A thread whose handler was abandoned (timeout, shutdown) keeps running it,
    since Python cannot stop a thread; :meth:`replace` adds a thread so the
    queue keeps its concurrency, and the abandoned one exits when its handler
    returns.
    """

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self._tasks: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._live = 0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        for _ in range(size):
            self._spawn()

    def submit(self, task: Task) -> None:
        self._tasks.put(task)

    def replace(self) -> None:
        """Add one thread, for one that is stuck in an abandoned handler."""
        self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._live += 1
            thread = threading.Thread(
                target=self._work, name=f"alkstore-{self.name}-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
        thread.start()

    def _work(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None:
                return
            retire = task()
            if retire:
                with self._lock:
                    self._live -= 1
                return

    def shutdown(self) -> None:
        """Let every live thread exit once the tasks already queued are done."""
        with self._lock:
            live = self._live
        for _ in range(live):
            self._tasks.put(None)
