"""SIGINT/SIGTERM handling for ``Worker.run()`` (the asyncio worker uses its loop's)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextmanager
def installed(handler: Callable[[int], None] | None) -> Iterator[None]:
    """Route SIGINT/SIGTERM to ``handler(signum)`` inside the block, then restore.

    Does nothing when ``handler`` is ``None`` or outside the main thread (Python
    delivers signals to the main thread only).
    """
    if handler is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, frame: FrameType | None) -> None:
        handler(signum)

    previous: dict[signal.Signals, Any] = {}
    for sig in SIGNALS:
        previous[sig] = signal.signal(sig, on_signal)
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
