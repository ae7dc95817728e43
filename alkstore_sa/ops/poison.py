"""Poison rows: jobs no worker of ours can activate or read, failed one by one.

Any client can write rows to the job table (Node pg-boss, a SQL console, an older
version of this library), and some rows cannot be claimed or read here: a
``singleton_key`` too large for the unique index that activation enters, a
timestamp outside Python's years 1 to 9999, JSON nested past
:data:`~alkstore_sa.limits.MAX_JSON_DEPTH`. Left alone, such a row makes every
fetch of its queue fail, and the jobs behind it never run. A fetch instead fails
that one job, for good (it would not read better on a retry), through the normal
fail statement so a dead letter queue still receives it, with an output saying
why; the rest of the batch is returned as usual. See the "Limits" page.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from ..limits import MAX_SINGLETON_KEY_BYTES
from ._core import Call, Context, Op
from .attempts import recording

log = logging.getLogger(__name__)

POISON_ERROR = "PoisonJob"
"""The ``name`` in the output of a job failed because it cannot be activated or read."""


def _detail(reasons: Mapping[str, str]) -> str:
    return "; ".join(f"{field}: {why}" for field, why in reasons.items())


def poison_output(job_id: uuid.UUID, what: str, reasons: Mapping[str, str]) -> dict[str, Any]:
    """The stored output of a poison job: ``{name, message, reasons}``, like an error's.

    The message names the job: a dead letter copy gets a new id, and this keeps the
    original one findable.
    """
    return {
        "name": POISON_ERROR,
        "message": f"job {job_id} cannot be {what} by alkstore_sa and was failed without "
        f"running: {_detail(reasons)}",
        "reasons": dict(reasons),
    }


def key_too_large(key: str) -> bool:
    """Is this ``singleton_key`` past :data:`~alkstore_sa.limits.MAX_SINGLETON_KEY_BYTES`?

    Past it, the key may not fit the unique index that activating the job inserts
    into, and the claim statement would fail for the whole batch. A compressible key
    somewhat larger could still fit, but the limit is what every sender of ours
    enforces, so a key past it came from elsewhere and is failed as documented.
    """
    # Cheap first: no key of fewer characters than the limit/4 can exceed it in UTF-8.
    return len(key) * 4 > MAX_SINGLETON_KEY_BYTES and (
        len(key.encode("utf-8")) > MAX_SINGLETON_KEY_BYTES
    )


def fail_poison(
    ctx: Context, name: str, poisoned: Sequence[tuple[uuid.UUID, str, Mapping[str, str]]]
) -> Op[int]:
    """Fail each ``(job id, "activated" or "read", reasons)`` for good; log each once.

    Returns how many jobs were failed (a job another session settled meanwhile is
    left to it).
    """
    if not poisoned:
        return 0
    outputs = {job_id: poison_output(job_id, what, why) for job_id, what, why in poisoned}
    params = {
        "qname": name,
        "ids": list(outputs),
        "outputs": [json.dumps(o, separators=(",", ":")) for o in outputs.values()],
    }
    rows = yield from recording(ctx, lambda sql: sql.fail_poison(), params)
    for row in rows:
        output = outputs[row.id]
        # Logged here, where the job is failed, so it is logged once per job
        # whichever worker or service call met it.
        log.warning(
            "job %s of %r failed without running (a poison row): %s",
            row.id,
            name,
            _detail(output["reasons"]),
            extra={
                "action": "job_poisoned",
                "queue": name,
                "job_id": str(row.id),
                "state": row.state,
                "reasons": output["reasons"],
                "dead_letter": row.dead_letter,
            },
        )
    return len(rows)


def fail_unclaimable_keys(
    ctx: Context,
    name: str,
    keys: Sequence[str],
    params: Mapping[str, Any],
    *,
    priority: bool,
    ignore_start_after: bool,
    policy: str,
) -> Op[int]:
    """Fail the next jobs (at most ``params["limit"]``) whose key is one of ``keys``."""
    stmt = ctx.sql.keyed_jobs(
        policy=policy, priority=priority, ignore_start_after=ignore_start_after
    )
    result = yield Call(stmt, {**params, "keys": list(keys)})
    poisoned = []
    for row in result.all():
        size = len(row.singleton_key.encode("utf-8"))
        why = {
            "singleton_key": f"{size} bytes, more than the {MAX_SINGLETON_KEY_BYTES} "
            "a unique index entry can be relied on to hold"
        }
        poisoned.append((row.id, "activated", why))
    return (yield from fail_poison(ctx, name, poisoned))
