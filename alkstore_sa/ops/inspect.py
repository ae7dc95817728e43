"""Read-only operations for operators and dashboards."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence

from ..errors import InvalidOptionsError, shown
from ..models.enums import JobState
from ..names import queue_ref
from ..options import check_int, check_text, in_utc
from ..records import Job, JobCounts, JobPage, read_job
from ..sql.v26 import inspect as inspect_sql
from ._core import Call, Context, Op
from .queues import get_queues, require_queue

STATES = tuple(s.value for s in JobState)

LIST_LIMIT_MAX = 10_000


def _state(value: object) -> JobState | None:
    if value is None:
        return None
    known = [s.value for s in JobState]
    if not isinstance(value, str) or value not in known:
        raise InvalidOptionsError("state", f"{shown(value)} is not one of {', '.join(known)}")
    return JobState(value)


def list_jobs(ctx: Context, name: str, state: object, limit: int) -> Op[list[Job]]:
    """The queue's jobs, newest first; raises if the queue does not exist."""
    queue_ref(name)
    wanted = _state(state)
    check_int("limit", limit, minimum=1, maximum=LIST_LIMIT_MAX)
    yield from require_queue(ctx, name)
    stmt = ctx.sql.list_jobs(wanted)
    result = yield Call(stmt, {"qname": name, "limit": limit})
    return [read_job(row) for row in result.mappings().all()]


FIND_LIMIT_MAX = 1000


def encode_cursor(job: Job) -> str:
    """The keyset cursor after ``job``: its ``created_on`` and id."""
    return f"{job.created_on.isoformat()}_{job.id}"


def decode_cursor(cursor: object) -> tuple[dt.datetime, uuid.UUID]:
    """A cursor of :func:`encode_cursor` read back, or InvalidOptionsError."""
    if not isinstance(cursor, str):
        raise InvalidOptionsError("after", f"must be a cursor string, not {shown(cursor)}")
    when, _, ident = cursor.rpartition("_")
    try:
        on = dt.datetime.fromisoformat(when)
        job_id = uuid.UUID(ident)
    except ValueError:
        raise InvalidOptionsError("after", f"{shown(cursor)} is not a job-list cursor") from None
    if on.utcoffset() is None:
        raise InvalidOptionsError("after", f"{shown(cursor)} is not a job-list cursor")
    return in_utc("after", on), job_id


def _aware(option: str, value: object) -> dt.datetime | None:
    return None if value is None else in_utc(option, value)


def _text(option: str, value: object, maximum: int = 1000) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > maximum or "\x00" in value:
        raise InvalidOptionsError(
            option,
            f"must be a non-empty string of at most {maximum} characters, not {shown(value)}",
        )
    # Valid UTF-8 (no lone surrogate), or the driver raises UnicodeEncodeError.
    return check_text(option, value)


def find_jobs(ctx: Context, name: object, filters: dict[str, object], limit: int) -> Op[JobPage]:
    """A keyset page of jobs matching ``filters`` (validated before any SQL)."""
    queue = None if name is None else queue_ref(name)
    wanted = _state(filters.get("state"))
    key = _text("key", filters.get("key"))
    group = _text("group", filters.get("group"))
    text = _text("text", filters.get("text"))
    since = _aware("since", filters.get("since"))
    until = _aware("until", filters.get("until"))
    after = filters.get("after")
    cursor = None if after is None else decode_cursor(after)
    check_int("limit", limit, minimum=1, maximum=FIND_LIMIT_MAX)
    if group is not None:
        ctx.require("a group filter")
    stmt = inspect_sql.find_jobs(
        ctx.sql.job,
        queue=queue is not None,
        state=wanted,
        key=key is not None,
        group=group is not None,
        text=text is not None,
        since=since is not None,
        until=until is not None,
        after=cursor is not None,
    )
    params: dict[str, object] = {"limit": limit + 1}
    if queue is not None:
        params["qname"] = queue
    if key is not None:
        params["key"] = key
    if group is not None:
        params["group_id"] = group
    if text is not None:
        escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        params["text"] = f"%{escaped}%"
    if since is not None:
        params["since"] = since
    if until is not None:
        params["until"] = until
    if cursor is not None:
        params["after_on"], params["after_id"] = cursor
    result = yield Call(stmt, params)
    jobs = [read_job(row) for row in result.mappings().all()]
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return JobPage(jobs, encode_cursor(jobs[-1]) if more else None)


def count_jobs(ctx: Context, names: Sequence[str] | None) -> Op[list[JobCounts]]:
    """Jobs per queue and state, every queue of the schema (or those named)."""
    wanted = None if names is None else [queue_ref(n, "names") for n in names]
    queues = yield from get_queues(ctx, wanted)
    stmt = inspect_sql.count_jobs(ctx.sql.job, named=wanted is not None)
    result = yield Call(stmt, {"names": wanted} if wanted is not None else {})
    counts: dict[str, dict[str, int]] = {q.name: dict.fromkeys(STATES, 0) for q in queues}
    oldest: dict[str, float | None] = dict.fromkeys(counts)
    for row in result.mappings().all():
        per = counts.setdefault(row["name"], dict.fromkeys(STATES, 0))
        per[row["state"]] = int(row["n"])
        if row["oldest"] is not None:
            age = float(row["oldest"])
            known = oldest.get(row["name"])
            oldest[row["name"]] = age if known is None else max(known, age)
    return [JobCounts(name, per, oldest.get(name)) for name, per in counts.items()]
