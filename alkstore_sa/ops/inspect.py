"""Read-only operations for operators and dashboards."""

from __future__ import annotations

from ..errors import InvalidOptionsError
from ..models.enums import JobState
from ..names import validate_queue
from ..options import check_int
from ..records import Job, read_job
from ..sql import inspect as inspect_sql
from ..sql.v46 import fetch as fetch46_sql
from ._core import Call, Context, Op
from .queues import require_queue

LIST_LIMIT_MAX = 10_000


def _state(value: object) -> JobState | None:
    if value is None:
        return None
    known = [s.value for s in JobState]
    if not isinstance(value, str) or value not in known:
        raise InvalidOptionsError("state", f"{value!r} is not one of {', '.join(known)}")
    return JobState(value)


def list_jobs(ctx: Context, name: str, state: object, limit: int) -> Op[list[Job]]:
    """The queue's jobs, newest first; raises if the queue does not exist."""
    validate_queue(name)
    wanted = _state(state)
    check_int("limit", limit, minimum=1, maximum=LIST_LIMIT_MAX)
    yield from require_queue(ctx, name)
    stmt = fetch46_sql.list_jobs(wanted) if ctx.version >= 46 else inspect_sql.list_jobs(wanted)
    result = yield Call(stmt, {"qname": name, "limit": limit})
    return [read_job(row) for row in result.mappings().all()]
