"""Exponential backoff with jitter, for reconnecting after database errors."""

from __future__ import annotations

import random


class Backoff:
    """Delays that double from ``initial`` up to ``maximum`` seconds, with jitter.

    Jitter (±25 %) keeps many workers that lost the same database from
    reconnecting in lockstep.
    """

    def __init__(self, initial: float = 0.1, maximum: float = 5.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._attempt = 0

    def next(self) -> float:
        """The next delay to wait, in seconds."""
        base = min(self.maximum, self.initial * 2.0**self._attempt)
        self._attempt = min(self._attempt + 1, 32)
        jitter: float = random.uniform(0.75, 1.25)
        return base * jitter

    def reset(self) -> None:
        """Start again from ``initial`` (after a success)."""
        self._attempt = 0
