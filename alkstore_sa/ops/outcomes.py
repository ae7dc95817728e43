"""Per-job results of a batch settle (``per_job=True``): which jobs changed, and why
the others did not (pg-boss's ``perJobResults``, for the service's batch settles)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..models.enums import JobState
from ..records import JobOutcome, NotSettled, Settlement
from ._core import Call, Context, Op


def outcomes(
    ctx: Context,
    name: str,
    items: Sequence[Settlement],
    states: Mapping[uuid.UUID, JobState],
) -> Op[list[JobOutcome]]:
    """One :class:`JobOutcome` per item, in order; ``states`` holds the new state of
    each job the settle changed.

    The jobs it left alone are read once more (one statement, in the caller's
    transaction, so what it reads is what the settle saw) to tell a job of
    another queue from an unknown id, and a finished job from one that is active
    in another attempt than the fetched Job's.
    """
    left = sorted({i.id for i in items if i.id not in states})
    found: dict[uuid.UUID, list[Any]] = {}
    if left:
        result = yield Call(ctx.sql.locate_jobs(), {"ids": left})
        for row in result.all():
            found.setdefault(row.id, []).append(row)
    return [_outcome(name, item, states, found.get(item.id, [])) for item in items]


def _outcome(
    name: str,
    item: Settlement,
    states: Mapping[uuid.UUID, JobState],
    rows: Sequence[Any],
) -> JobOutcome:
    if item.id in states:
        return JobOutcome(item.id, True, None, states[item.id], name)
    ours = next((r for r in rows if r.name == name), None)
    if ours is None:
        if not rows:
            return JobOutcome(item.id, False, NotSettled.NOT_FOUND, None, None)
        # Ids are unique per queue only: name the first other queue that has it.
        other = min(rows, key=lambda r: r.name)
        return JobOutcome(item.id, False, NotSettled.WRONG_QUEUE, JobState(other.state), other.name)
    state = JobState(ours.state)
    if (
        item.started_on is not None
        and state == JobState.ACTIVE
        and ours.started_on != item.started_on
    ):
        return JobOutcome(item.id, False, NotSettled.NOT_OURS, state, name)
    return JobOutcome(item.id, False, NotSettled.NOT_ACTIVE, state, name)
