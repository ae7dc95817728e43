"""The dashboard's pages: what a GET shows, read in a read-only transaction
(the "Browse and act in the dashboard" page).
"""

from __future__ import annotations

import datetime as dt
import importlib
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlencode

from cronsim import CronSim
from sqlalchemy.exc import DBAPIError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response

from .. import cron, rrule, versions
from .._humanize import duration, queue_note, queue_settings
from ..errors import QueueNotFoundError, shown
from ..limits import ATTEMPTS_KEPT
from ..models.enums import JobState
from ..records import Job, JobCounts, JobDependency, QueueInfo, ScheduleInfo
from ..service import QueueService
from ._render import failure, trace_id
from ._security import safe_next
from ._state import (
    HERE,
    LIVE_COOKIE,
    STATES,
    BadRequest,
    Dashboard,
    parse_uuid,
    parse_when,
)

FAILURE_STATES = frozenset(s.value for s in (JobState.FAILED, JobState.RETRY))
"""States in which a job's output is its last attempt's error."""
UNFINISHED = frozenset(s.value for s in (JobState.CREATED, JobState.RETRY, JobState.ACTIVE))
PAGE_SIZE = 50
STALE_READY = 300  # seconds a ready job may wait before its queue is marked
FLOW_LINKS = 100  # parents and children shown on a job page, each
HISTORY_ROWS = 50  # overview rows (problem queues first) with a sparkline
HISTORY = "queue-stats history"  # what the sparklines read (a feature of versions.FEATURES)
QUEUE_PAGE_STATES = ("failed", "active", "retry", "created")  # a queue page's job lists...
QUEUE_PAGE_JOBS = 5  # ...the newest of each state, with a link to all of them
RECENT_SECONDS = 3600  # without history, the sparkline covers the last hour...
RECENT_BUCKET = 300  # ...in 12 points of 5 minutes, from the job table
CSS = (HERE / "static" / "style.css").read_text(encoding="utf-8")


def next_fire(schedule: ScheduleInfo, now: dt.datetime) -> dt.datetime | None:
    """When ``schedule`` fires next after ``now``, or ``None`` (ended, or unreadable)."""
    tz = schedule.timezone or "UTC"
    try:
        if schedule.kind == "rrule" or rrule.is_rrule(schedule.cron):
            found = rrule.parse(schedule.cron, tz).next_after(now)
            return None if found is None else found.astimezone(dt.UTC)
        zone = cron.timezone(tz)
        return next(CronSim(schedule.cron, now.astimezone(zone))).astimezone(dt.UTC)
    except Exception:  # a row another client wrote, whatever is wrong with it
        return None


def timed_out(exc: DBAPIError) -> bool:
    """Whether ``exc`` is PostgreSQL cancelling a statement (``statement_timeout``)."""
    return getattr(exc.orig, "sqlstate", None) == "57014"


def cached_counts(info: QueueInfo) -> JobCounts:
    """A queue's counts from the queue table's cached counters (kept by
    supervision): only created (queued) and active are known; the rest 0."""
    per = dict.fromkeys(STATES, 0)
    per["created"] = info.queued_count
    per["active"] = info.active_count
    return JobCounts(info.name, per, None)


def problems(failed: int, queued: int, warning_queued: int, oldest: float | None) -> list[str]:
    """Why the overview marks a queue as a problem, one phrase per reason (none: fine):
    failed jobs kept, a backlog at or over ``warning_queued``, a job ready for over
    :data:`STALE_READY` seconds."""
    out = []
    if failed > 0:
        out.append(f"{failed} failed job{'s' if failed != 1 else ''}")
    if warning_queued > 0 and queued >= warning_queued:
        out.append(f"{queued} queued, over warning_queued {warning_queued}")
    if (oldest or 0) > STALE_READY:
        out.append(f"a job ready for {duration(oldest)}, unclaimed")
    return out


def summary(counts: Sequence[JobCounts], *, flagged: int) -> list[tuple[str, str, int]]:
    """The overview's cards for one schema: ``(key, label, number)``, summed over its
    queues (queued is created and retry; the counts of the table below)."""

    def total(*states: str) -> int:
        return sum(c.counts[s] for c in counts for s in states)

    return [
        ("queues", "queues", len(counts)),
        ("queued", "queued", total("created", "retry")),
        ("active", "active", total("active")),
        ("failed", "failed", total("failed")),
        ("completed", "completed", total("completed")),
        ("flagged", "flagged queues", flagged),
    ]


async def live_switch(request: Request) -> Response:
    """``/live?on=0`` pauses this viewer's live refresh, ``on=1`` resumes it (a cookie),
    then back to ``next`` (a page of this dashboard) or the overview."""
    d: Dashboard = request.app.state.dashboard
    root = d._root(request)
    target = safe_next(root, request.query_params.get("next"), root + "/")
    response = RedirectResponse(target, status_code=303)
    if request.query_params.get("on") == "0":
        response.set_cookie(
            LIVE_COOKIE,
            "off",
            path=root or "/",
            httponly=True,
            samesite="lax",
            secure=request.url.scheme == "https",
        )
    else:
        response.delete_cookie(LIVE_COOKIE, path=root or "/")
    return response


async def overview(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    sections: list[dict[str, Any]] = []
    for schema in d.schemas:
        version = await d.version(schema)
        if version is None:
            sections.append(
                {
                    "schema": schema,
                    "version": None,
                    "rows": [],
                    "cached": False,
                    "history_since": None,
                }
            )
            continue

        def read(q: QueueService) -> Any:
            queues = {info.name: info for info in q.get_queues()}
            return queues, q.count_jobs()

        # Exact counts scan the job table (one grouped query). Where that takes
        # longer than the statement timeout, the queue table's cached counters
        # stand in, marked as such (the "Browse and act in the dashboard" page).
        cached = False
        try:
            queues, counts = await d.read(schema, read)
        except DBAPIError as exc:
            if not timed_out(exc):
                raise
            queues = {info.name: info for info in await d.read(schema, lambda q: q.get_queues())}
            counts = [cached_counts(info) for info in queues.values()]
            cached = True
        rows = []
        for c in counts:
            info = queues.get(c.name)
            queued = c.counts["created"] + c.counts["retry"]
            threshold = info.warning_queued if info is not None else 0
            reasons = problems(c.counts["failed"], queued, threshold, c.oldest_ready_seconds)
            rows.append(
                {
                    "counts": c,
                    "info": info,
                    "problem": bool(reasons),
                    "reasons": reasons,
                    "note": queue_note(c.name),
                    "history": None,
                    "recent": None,
                }
            )
        rows.sort(key=lambda r: (not r["problem"], r["counts"].name))
        cards = summary(counts, flagged=sum(1 for r in rows if r["problem"]))
        history_since = None if versions.has(version, HISTORY) else versions.since(HISTORY)
        if history_since is None and rows:
            # Sparklines for the first HISTORY_ROWS rows, read in one transaction.
            names = [row["counts"].name for row in rows[:HISTORY_ROWS]]

            def history(q: QueueService, names: list[str] = names) -> list[list[int]]:
                since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=24)
                out = []
                for name in names:
                    snaps = q.get_queue_stats_history(
                        name, from_=since, limit=10_000, max_data_points=30
                    )
                    out.append([s.completed_delta or 0 for s in reversed(snaps)])
                return out

            for row, points in zip(rows, await d.read(schema, history), strict=False):
                row["history"] = points
            # Without recorded history, the last hour from the job table itself; not when
            # counting that table already took too long (the job table is locked or huge).
            bare = [row for row in rows[:HISTORY_ROWS] if not row["history"]]
            if bare and not cached:
                since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=RECENT_SECONDS)
                names = [r["counts"].name for r in bare]

                def recent_of(
                    q: QueueService, names: list[str] = names, since: dt.datetime = since
                ) -> dict[str, list[int]]:
                    return q.count_completions(names, since=since, bucket_seconds=RECENT_BUCKET)

                try:
                    recent = await d.read(schema, recent_of)
                except DBAPIError as exc:
                    if not timed_out(exc):
                        raise
                    recent = {}  # the rows keep their "no history" note
                for row in bare:
                    row["recent"] = recent.get(row["counts"].name)
        sections.append(
            {
                "schema": schema,
                "version": version,
                "rows": rows,
                "cached": cached,
                "history_since": history_since,
                "cards": cards,
            }
        )
    return d.render(
        request, "overview.html", sections=sections, history_rows=HISTORY_ROWS, live_page=True
    )


async def queue_detail(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    name = str(request.path_params["name"])

    def read(q: QueueService) -> Any:
        info = q.get_queue(name)
        if info is None:
            raise QueueNotFoundError(name, schema)
        counts = q.count_jobs([name])
        found = counts[0] if counts else None
        # The newest jobs of each state worth a look, those with any (keyset pages).
        recent = {
            st: q.find_jobs(name, state=st, limit=QUEUE_PAGE_JOBS).jobs
            for st in QUEUE_PAGE_STATES
            if found is not None and found.counts[st]
        }
        return info, found, q.get_schedules(name), q.get_subscriptions(name), recent

    info, counts, schedules, subscriptions, recent = await d.read(schema, read)
    fires = await _next_fires(schedules)
    charts = await _queue_charts(d, schema, name)
    reasons: list[str] = []
    if counts is not None:
        queued = counts.counts["created"] + counts.counts["retry"]
        reasons = problems(
            counts.counts["failed"], queued, info.warning_queued, counts.oldest_ready_seconds
        )
    return d.render(
        request,
        "queue.html",
        schema=schema,
        queue=info,
        counts=counts,
        schedules=fires,
        subscriptions=subscriptions,
        settings=queue_settings(info),
        note=queue_note(info.name),
        policies=("standard", "short", "singleton", "stately", "exclusive", "key_strict_fifo"),
        recent=recent,
        reasons=reasons,
        page_jobs=QUEUE_PAGE_JOBS,
        charts=charts,
    )


async def _queue_charts(d: Dashboard, schema: str, name: str) -> dict[str, Any] | None:
    """A queue page's charts: a day of throughput and wait times from the stats history
    (48 points), or, with none recorded, the last hour's completions from the job table
    (12 points); ``None`` below 46 or when reading them takes too long."""
    version = await d.version(schema)
    if version is None or not versions.has(version, HISTORY):
        return None
    now = dt.datetime.now(dt.UTC)

    def read(q: QueueService) -> dict[str, Any]:
        snaps = q.get_queue_stats_history(
            name, from_=now - dt.timedelta(days=1), max_data_points=48, percentiles=[50, 95]
        )
        if snaps:
            snaps = list(reversed(snaps))
            waits = {
                p: [
                    next((x.wait_seconds or 0 for x in s.percentiles or () if x.p == p), 0)
                    for s in snaps
                ]
                for p in (50, 95)
            }
            # What the rows behind the charts hold that is not read as stored (a row
            # another client wrote): named, so a chart is never silently short of it.
            unreadable: dict[str, str] = {}
            for snap in snaps:
                for field, why in snap.unreadable.items():
                    unreadable.setdefault(field, why)
            return {
                "source": "history",
                "span": "the last 24 hours",
                "completed": [s.completed_delta or 0 for s in snaps],
                "failed": [s.failed_delta or 0 for s in snaps],
                "wait50": waits[50],
                "wait95": waits[95],
                "unreadable": unreadable,
            }
        since = now - dt.timedelta(seconds=RECENT_SECONDS)
        recent = q.count_completions([name], since=since, bucket_seconds=RECENT_BUCKET)
        return {"source": "jobs", "span": "the last hour", "completed": recent[name]}

    try:
        return await d.read(schema, read)
    except DBAPIError as exc:
        if not timed_out(exc):
            raise
        return None


async def job_list(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    p = request.query_params
    filters = {k: p.get(k, "").strip() for k in ("queue", "state", "key", "group", "q")}
    filters.update({k: p.get(k, "").strip() for k in ("since", "until", "after")})
    if filters["state"] and filters["state"] not in STATES:
        raise BadRequest(f"state: {shown(filters['state'])} is not one of {', '.join(STATES)}")
    since = parse_when("since", filters["since"])
    until = parse_when("until", filters["until"])

    def read(q: QueueService) -> Any:
        return q.find_jobs(
            filters["queue"] or None,
            state=filters["state"] or None,
            key=filters["key"] or None,
            group=filters["group"] or None,
            text=filters["q"] or None,
            since=since,
            until=until,
            after=filters["after"] or None,
            limit=PAGE_SIZE,
        )

    page = await d.read(schema, read)
    kept = {k: v for k, v in filters.items() if v and k != "after"}
    next_url = first_url = None
    if page.next_cursor is not None:
        next_url = f"{request.url.path}?{urlencode({**kept, 'after': page.next_cursor})}"
    if filters["after"]:
        first_url = f"{request.url.path}?{urlencode(kept)}" if kept else request.url.path
    return d.render(
        request,
        "jobs.html",
        schema=schema,
        filters=filters,
        page=page,
        next_url=next_url,
        first_url=first_url,
    )


def job_actions(state: str) -> list[tuple[str, str]]:
    """The actions a job in ``state`` can take (the service refuses the rest):
    retry a failed job, cancel an unfinished one, resume a cancelled one; delete any."""
    actions = []
    if state == JobState.FAILED:
        actions.append(("retry", "Retry"))
    if state in UNFINISHED:
        actions.append(("cancel", "Cancel"))
    if state == JobState.CANCELLED:
        actions.append(("resume", "Resume"))
    return [*actions, ("delete", "Delete")]


async def job_detail(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    job_id = parse_uuid("id", str(request.path_params["id"]))
    queue = request.query_params.get("queue", "").strip()

    def read(q: QueueService) -> Job | None:
        if queue:
            return q.get_job(queue, job_id)
        # Without the queue: one primary-key lookup per queue.
        for info in q.get_queues():
            found = q.get_job(info.name, job_id)
            if found is not None:
                return found
        return None

    job = await d.read(schema, read)
    if job is None:
        raise HTTPException(404, f"no job {job_id} in schema {shown(schema)}")
    parents: list[JobDependency] = []
    children: list[JobDependency] = []
    version = await d.version(schema)
    if version is not None and versions.has(version, "flow"):
        # A flow job's parents and children (pg-boss's job_dependency rows), the
        # first FLOW_LINKS of each; most jobs have none.
        name = job.name
        parents, children = await d.read(
            schema,
            lambda q: (
                q.get_dependencies(name, job_id, limit=FLOW_LINKS),
                q.get_dependents(name, job_id, limit=FLOW_LINKS),
            ),
        )
    # Every failed attempt's error, oldest first (the "Attempt history" page): none
    # for a job failed only by Node, or in a schema without the table.
    name = job.name
    history = await d.read(schema, lambda q: q.get_job_attempts(name, job_id))
    attempts = [
        (a, failure(a.error), None if a.started_on is None else a.failed_on - a.started_on)
        for a in history
    ]
    return d.render(
        request,
        "job.html",
        schema=schema,
        job=job,
        attempts=attempts,
        attempts_kept=ATTEMPTS_KEPT,
        parents=parents,
        children=children,
        job_actions=job_actions(str(job.state)),
        flow_links=FLOW_LINKS,
        trace_id=trace_id(job.trace_context),
        failure=failure(job.output) if str(job.state) in FAILURE_STATES else None,
        unreadable=getattr(job, "unreadable", None),
    )


async def schedules_page(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    schedules = await d.read(schema, lambda q: q.get_schedules())
    rows = await _next_fires(schedules)
    return d.render(request, "schedules.html", schema=schema, schedules=rows)


async def _next_fires(
    schedules: Sequence[ScheduleInfo],
) -> list[tuple[ScheduleInfo, dt.datetime | None]]:
    """Each schedule with its next firing, worked out in the thread pool: an rrule
    may take up to its evaluation budget (the "Limits" page), and the event
    loop answers other requests (``/healthz`` too) meanwhile."""
    now = dt.datetime.now(dt.UTC)
    return await run_in_threadpool(lambda: [(s, next_fire(s, now)) for s in schedules])


async def _needs(
    request: Request, d: Dashboard, schema: str, page: str, feature: str
) -> Response | None:
    """A page saying what ``page`` needs, when the schema lacks ``feature``."""
    version = await d.version(schema)
    if version is None or not versions.has(version, feature):
        needed = versions.since(feature)
        return d.render(
            request,
            "needs_version.html",
            schema=schema,
            page=page,
            version=version,
            needed=needed,
            status_code=200,
        )
    return None


async def _page_of(
    request: Request, feature: str, page: str, key: str, work: Callable[[QueueService], Any]
) -> Response:
    """A page of what only a schema with ``feature`` records: the rows ``work`` reads,
    rendered as ``key`` in the template ``<key>.html``; without it, a page saying what
    it needs."""
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    refused = await _needs(request, d, schema, page, feature)
    if refused is not None:
        return refused
    rows = await d.read(schema, work)
    return d.render(request, f"{key}.html", schema=schema, live_page=True, **{key: rows})


async def instances_page(request: Request) -> Response:
    work = lambda q: q.get_instances(limit=1000)  # noqa: E731
    return await _page_of(request, "the instance registry", "Instances", "instances", work)


async def warnings_page(request: Request) -> Response:
    work = lambda q: q.get_warnings(limit=200)  # noqa: E731
    return await _page_of(request, "the warning table", "Warnings", "warnings", work)


async def health_page(request: Request) -> Response:
    """The schema's health, as ``alkstore db check`` reports it: its catalog against its
    version's, unfinished index builds, our recorded revision."""
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    found = await d.diagnose(schema)
    history = await d.attempt_history(schema)
    return d.render(request, "health.html", schema=schema, health=found, history=history)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


async def style(request: Request) -> Response:
    return Response(CSS, media_type="text/css")


async def metrics(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    try:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.exposition import CONTENT_TYPE_LATEST

        metrics_module = importlib.import_module("alkstore_sa.metrics")
    except ImportError as exc:
        return PlainTextResponse(
            f"/metrics is not available: {exc}. It needs prometheus_client "
            "(pip install prometheus_client) and alkstore_sa.metrics.",
            status_code=501,
        )
    registry = getattr(request.app.state, "metrics_registry", None)
    if registry is None:
        registry = CollectorRegistry()
        registry.register(
            metrics_module.queue_metrics_collector(
                d.engine, d.schemas, statement_timeout_ms=d.timeout_ms or 5000
            )
        )
        request.app.state.metrics_registry = registry
    body = await run_in_threadpool(generate_latest, registry)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
