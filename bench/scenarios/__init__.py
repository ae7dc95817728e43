"""The benchmark scenarios; each module exposes ``variants(cfg) -> list[Variant]``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..common import Config, Sample


@dataclass(frozen=True)
class Variant:
    """One way of running a scenario: alkstore_sa or its raw-SQL ceiling.

    ``ceiling`` names the variant this one is compared with (``None`` for the
    ceilings themselves); ``run`` performs one measured repetition. ``target``
    is the goal for the ratio ``this / ceiling``, e.g. ``(">=", 0.85)``. A
    repetition is split into ``rounds`` short interleaved runs, so that a change
    of load on a shared machine hits both sides of a comparison alike.

    In the peer scenarios (``python -m bench --peers``) ``kind`` is ``"peer"`` for
    another job queue and ``"ours"`` for alkstore_sa, whose rows are also compared
    with the best peer of the same scenario and metric; ``peer_targets`` holds the
    goals of that comparison as ``(metric, op, goal)``.
    """

    scenario: str
    name: str
    run: Callable[[Config], list[Sample]]
    ceiling: str | None = None
    note: str = ""
    target: tuple[str, float] | None = None
    target_metrics: tuple[str, ...] = ("jobs/s", "p50 ms")
    rounds: int = 1
    kind: str = ""
    peer_targets: tuple[tuple[str, str, float], ...] = ()
