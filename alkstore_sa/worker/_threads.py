"""Thread machinery of :class:`~alkstore_sa.Worker`: handler pools and the completer."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from ._attempt import Pending
from ._backoff import Backoff

log = logging.getLogger("alkstore_sa.worker")

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


Flush = Callable[[list[Pending]], None]


class Completer:
    """Collects finished jobs and settles them in batches.

    The first settlement waits up to ``interval`` seconds for others, so jobs
    finishing together are completed (or failed) with one statement per queue.
    ``flush`` runs the statements; a database error keeps the batch and retries
    it with backoff (fencing makes a repeated settlement harmless), until
    :meth:`stop`'s deadline.
    """

    def __init__(self, flush: Flush, interval: float, max_batch: int = 1000) -> None:
        self._flush = flush
        self.interval = interval
        self.max_batch = max_batch
        self._items: list[Pending] = []
        self._cond = threading.Condition()
        self._stopping = False
        self._give_up = threading.Event()
        self._busy = False
        self._thread = threading.Thread(target=self._run, name="alkstore-completer", daemon=True)
        self.on_error: Callable[[BaseException, float], None] = lambda exc, delay: None

    def start(self) -> None:
        self._thread.start()

    def put(self, item: Pending) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify_all()

    def idle(self) -> bool:
        """Nothing waiting and nothing being written."""
        with self._cond:
            return not self._items and not self._busy

    def stop(self, timeout: float) -> None:
        """Write what is pending, retrying errors for at most ``timeout`` seconds."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)
        if self._thread.is_alive():
            self._give_up.set()
            self._thread.join(1.0)

    def _run(self) -> None:
        backoff = Backoff()
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._items) or self._stopping)
                if not self._items:
                    return
                if not self._stopping and len(self._items) < self.max_batch:
                    # Gather the jobs that finish within the window into one batch.
                    self._cond.wait_for(
                        lambda: len(self._items) >= self.max_batch or self._stopping,
                        self.interval,
                    )
                batch, self._items = self._items, []
                self._busy = True
            while True:
                try:
                    self._flush(batch)
                    backoff.reset()
                    break
                except Exception as exc:
                    delay = backoff.next()
                    self.on_error(exc, delay)
                    if self._give_up.wait(delay):
                        log.error(
                            "gave up settling %d job(s) at shutdown; they stay active until "
                            "they expire and are then retried",
                            len(batch),
                            extra={"action": "settle_abandoned", "count": len(batch)},
                        )
                        break
            with self._cond:
                self._busy = False
                self._cond.notify_all()
