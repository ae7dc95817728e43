"""The dashboard's Starlette application (the "Browse and act in the dashboard" page).

Every page and action reads and writes through :class:`~alkstore_sa.QueueService`,
in a session of its own with ``statement_timeout`` set for the transaction, run in
Starlette's thread pool (the engine is a plain synchronous one).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import importlib
import inspect
import json
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote, urlencode, urlsplit

import jinja2
import markupsafe
from cronsim import CronSim
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.orm import Session
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route

from .. import cron, migrate, rrule
from ..errors import (
    AlkstoreError,
    InvalidOptionsError,
    QueueNotFoundError,
    SchemaFeatureError,
    shown,
)
from ..models.enums import JobState
from ..names import queue_ref, validate_schema
from ..records import Job, JobCounts, JobDependency, QueueInfo, ScheduleInfo
from ..service import QueueService
from ._security import SecurityMiddleware, normalise_hosts

T = TypeVar("T")

AuthHook = Callable[[Request], "bool | Awaitable[bool]"]

STATES = tuple(s.value for s in JobState)
UNFINISHED = frozenset(s.value for s in (JobState.CREATED, JobState.RETRY, JobState.ACTIVE))
ACTIONS = ("retry", "cancel", "resume", "delete", "redrive")
PAGE_SIZE = 50
BULK_MAX = 1000
"""At most this many jobs per action (one confirmation, one transaction)."""
FLOW_LINKS = 100  # parents and children shown on a job page, each
SEND_MAX = 1_000_000  # characters of JSON in the send form
HISTORY_ROWS = 50  # overview rows (problem queues first) with a sparkline
CSRF_COOKIE = "alkstore_csrf"
FLASH_COOKIE = "alkstore_flash"
HERE = Path(__file__).parent
CSS = (HERE / "static" / "style.css").read_text(encoding="utf-8")


class BadRequest(Exception):
    """A malformed filter or form field: a 400 page with the message."""


_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def _bidi_safe(value: object) -> str:
    """Text for display: bidirectional overrides shown as escapes, so that a
    job's data cannot reorder what is around it on the page."""
    out = str(value)
    for ch in _BIDI:
        out = out.replace(ch, f"\\u{ord(ch):04x}")
    return out


def _bidi_finalize(value: Any) -> Any:
    """Jinja's ``finalize``: a printed string with its bidirectional overrides
    escaped (markup stays markup); any other value as it is."""
    if isinstance(value, str) and any(ch in _BIDI for ch in value):
        escaped = _bidi_safe(value)
        return markupsafe.Markup(escaped) if isinstance(value, markupsafe.Markup) else escaped
    return value


def _pretty(value: Any) -> str:
    if value is None:
        return "null"
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _compact(value: Any, width: int = 120) -> str:
    try:
        out = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        out = repr(value)
    return out if len(out) <= width else out[: width - 1] + "…"


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172_800:
        return f"{s // 3600}h"
    return f"{s // 86_400}d"


def _when(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sparkline(values: Sequence[int]) -> str:
    """An SVG polyline's points for ``values`` (oldest first) in a 120x24 box."""
    if not values:
        return ""
    top = max(values) or 1
    step = 120 / max(len(values) - 1, 1)
    return " ".join(f"{i * step:.1f},{24 - 22 * v / top:.1f}" for i, v in enumerate(values))


def _trace_id(context: Any) -> str | None:
    if isinstance(context, dict):
        parent = context.get("traceparent")
        if isinstance(parent, str):
            parts = parent.split("-")
            if len(parts) >= 3 and len(parts[1]) == 32:
                return parts[1]
        for key in ("trace_id", "traceId"):
            if isinstance(context.get(key), str):
                return str(context[key])
    return None


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


class Dashboard:
    """The state behind one application: engine, settings, templates, secret."""

    def __init__(
        self,
        engine: Engine,
        *,
        schemas: Sequence[str],
        read_only: bool,
        auth: AuthHook | None,
        basic_auth: tuple[str, str] | None,
        statement_timeout_ms: int,
        secret_key: str | bytes | None,
        title: str,
        allowed_hosts: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(engine, Engine):
            raise InvalidOptionsError(
                "engine", f"must be a synchronous SQLAlchemy Engine, not {type(engine).__name__}"
            )
        if isinstance(schemas, str):
            schemas = (schemas,)
        if not schemas:
            raise InvalidOptionsError("schemas", "name at least one schema")
        self.schemas = tuple(validate_schema(s) for s in schemas)
        if isinstance(statement_timeout_ms, bool) or not isinstance(statement_timeout_ms, int):
            raise InvalidOptionsError("statement_timeout_ms", "must be an integer")
        if statement_timeout_ms < 0:
            raise InvalidOptionsError("statement_timeout_ms", "must be 0 (none) or more")
        if basic_auth is not None and (
            len(basic_auth) != 2 or not all(isinstance(p, str) and p for p in basic_auth)
        ):
            raise InvalidOptionsError("basic_auth", "must be a (username, password) pair")
        self.engine = engine
        self.read_only = read_only
        self.auth = auth
        self.basic_auth = basic_auth
        self.timeout_ms = statement_timeout_ms
        if secret_key is None:
            self.secret = secrets.token_bytes(32)
        else:
            self.secret = secret_key.encode() if isinstance(secret_key, str) else secret_key
        self.title = title
        self.allowed_hosts = normalise_hosts(allowed_hosts)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            # Every printed value, whatever the template: no bidirectional override
            # reaches the page (a name or key from a row shown in place).
            finalize=_bidi_finalize,
        )
        self.templates.filters.update(
            pretty=_pretty,
            compact=_compact,
            age=_age,
            when=_when,
            sparkline=_sparkline,
        )

    # ------------------------------------------------------------ security

    @property
    def has_auth(self) -> bool:
        """Whether requests are authenticated (basic auth or a hook)."""
        return self.basic_auth is not None or self.auth is not None

    def identity(self, request: Request) -> str:
        """Who the request is, as far as the dashboard can tell: the basic-auth
        user, else the mounting application's ``request.user`` (its ``identity``
        or ``display_name``), else nobody (``""``). CSRF tokens are bound to it."""
        if self.basic_auth is not None:
            return "basic:" + self.basic_auth[0]
        user = request.scope.get("user")
        for attribute in ("identity", "display_name"):
            try:
                value = getattr(user, attribute, None)
            except NotImplementedError:  # Starlette's BaseUser leaves identity abstract
                continue
            if isinstance(value, str) and value:
                return f"user:{attribute}:{value}"
        return ""

    async def authenticate(self, request: Request) -> Response | None:
        """``None`` if the request may go on, else the refusal."""
        if request.method == "GET" and request.url.path == self._root(request) + "/healthz":
            return None
        if self.basic_auth is not None and not self._basic_ok(request):
            return PlainTextResponse(
                "authentication required",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="alkstore", charset="UTF-8"'},
            )
        if self.auth is not None:
            allowed = self.auth(request)
            if inspect.isawaitable(allowed):
                allowed = await allowed
            if not allowed:
                return PlainTextResponse("forbidden", status_code=403)
        return None

    def _basic_ok(self, request: Request) -> bool:
        assert self.basic_auth is not None
        header = request.headers.get("authorization", "")
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        want_user, want_password = self.basic_auth
        # Both compared, always: the time taken says nothing about which was wrong.
        user_ok = secrets.compare_digest(user.encode(), want_user.encode())
        password_ok = secrets.compare_digest(password.encode(), want_password.encode())
        return bool(sep) and user_ok and password_ok

    def _sign(self, value: str) -> str:
        return hmac.new(self.secret, value.encode(), hashlib.sha256).hexdigest()

    def csrf_token(self, request: Request) -> str:
        """The token the forms of this page carry: an HMAC of the client's cookie nonce."""
        nonce = request.cookies.get(CSRF_COOKIE) or getattr(request.state, "new_nonce", None)
        if not nonce:
            nonce = secrets.token_urlsafe(24)
            request.state.new_nonce = nonce
        return self._sign(f"csrf:{self.identity(request)}\0{nonce}")

    def check_csrf(self, request: Request, form: Any) -> None:
        nonce = request.cookies.get(CSRF_COOKIE, "")
        token = form.get("csrf_token", "")
        if not nonce or not isinstance(token, str) or not token:
            raise HTTPException(403, "missing CSRF token: reload the page and try again")
        # Bytes: compare_digest refuses str with non-ASCII characters (a 500, not a 403).
        want = self._sign(f"csrf:{self.identity(request)}\0{nonce}")
        if not hmac.compare_digest(token.encode(), want.encode()):
            raise HTTPException(403, "invalid CSRF token: reload the page and try again")

    def _root(self, request: Request) -> str:
        return str(request.scope.get("root_path", "")) or ""

    def set_flash(self, response: Response, request: Request, message: str) -> None:
        encoded = base64.urlsafe_b64encode(message[:500].encode()).decode()
        response.set_cookie(
            FLASH_COOKIE,
            f"{encoded}.{self._sign('flash:' + encoded)[:32]}",
            path=self._root(request) or "/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )

    def take_flash(self, request: Request) -> str | None:
        raw = request.cookies.get(FLASH_COOKIE)
        if not raw:
            return None
        encoded, _, mac = raw.partition(".")
        if not hmac.compare_digest(mac.encode(), self._sign("flash:" + encoded)[:32].encode()):
            return None
        try:
            return base64.urlsafe_b64decode(encoded.encode()).decode()
        except (ValueError, UnicodeDecodeError):
            return None

    # ------------------------------------------------------------ database

    def schema_of(self, request: Request) -> str:
        schema = str(request.path_params["schema"])
        if schema not in self.schemas:
            raise HTTPException(404, f"schema {shown(schema)} is not shown by this dashboard")
        return schema

    def _session_work(self, schema: str, work: Callable[[QueueService], T], write: bool) -> T:
        with Session(self.engine) as session, session.begin():
            if not write:
                session.execute(text("SET TRANSACTION READ ONLY"))
            session.execute(
                text("SELECT set_config('statement_timeout', :ms, true)"),
                {"ms": str(self.timeout_ms)},
            )
            return work(QueueService(session, schema=schema, notify=True))

    async def read(self, schema: str, work: Callable[[QueueService], T]) -> T:
        """Run ``work`` in a read-only transaction of its own, in the thread pool."""
        return await run_in_threadpool(self._session_work, schema, work, False)

    async def write(self, schema: str, work: Callable[[QueueService], T]) -> T:
        """Run ``work`` in a transaction of its own (committed), in the thread pool."""
        return await run_in_threadpool(self._session_work, schema, work, True)

    async def version(self, schema: str) -> int | None:
        def read() -> int | None:
            with self.engine.connect() as conn:
                return migrate.installed_version(conn, schema)

        return await run_in_threadpool(read)

    # ------------------------------------------------------------ rendering

    def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        root = self._root(request)
        flash = self.take_flash(request) if request.method == "GET" else None
        csrf = self.csrf_token(request)
        body = self.templates.get_template(template).render(
            title=self.title,
            root=root,
            schemas=self.schemas,
            read_only=self.read_only,
            csrf_token=csrf,
            flash=flash,
            states=STATES,
            request_path=request.url.path,
            request_full=request.url.path + (f"?{request.url.query}" if request.url.query else ""),
            **context,
        )
        response = HTMLResponse(body, status_code=status_code)
        nonce = getattr(request.state, "new_nonce", None)
        if nonce:
            response.set_cookie(
                CSRF_COOKIE,
                nonce,
                path=root or "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        if flash is not None:
            response.delete_cookie(
                FLASH_COOKIE,
                path=root or "/",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response

    def error(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(
            request, "error.html", status_code=status, status=status, message=message
        )


def _parse_when(name: str, value: str) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"{name}: {shown(value)} is not an ISO-8601 date or time") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _parse_uuid(name: str, value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadRequest(f"{name}: {shown(value)} is not a job id (a UUID)") from None


def _in_path(name: str) -> str:
    """A queue name as a URL path segment: percent-encoded, ``/`` kept (the route
    takes a path). A name another client made may hold a space, ``#``, ``?`` or any
    letter; a header of ours carries only ASCII."""
    return quote(name, safe="/")


def _safe_next(root: str, value: str | None, fallback: str) -> str:
    """A redirect target on this dashboard only: a path under ``root``, never
    another site (no scheme, no ``//host``, no backslash, no control character
    or space a browser would drop or rewrite)."""
    if (
        not value
        or not value.startswith(root + "/")
        or value.startswith("//")
        or "\\" in value
        or any(ch.isspace() or ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value)
    ):
        return fallback
    parts = urlsplit(value)
    if parts.scheme or parts.netloc:
        return fallback
    # No dot segment, plain or percent-encoded: /admin/queues/s/../../evil
    # would leave the mount point once the browser resolves it.
    if any(unquote(segment) in (".", "..") for segment in parts.path.split("/")):
        return fallback
    return value


# ------------------------------------------------------------------ pages


def _timed_out(exc: DBAPIError) -> bool:
    """Whether ``exc`` is PostgreSQL cancelling a statement (``statement_timeout``)."""
    return getattr(exc.orig, "sqlstate", None) == "57014"


def _cached_counts(info: QueueInfo) -> JobCounts:
    """A queue's counts from the queue table's cached counters (kept by
    supervision): only created (queued) and active are known; the rest 0."""
    per = dict.fromkeys(STATES, 0)
    per["created"] = info.queued_count
    per["active"] = info.active_count
    return JobCounts(info.name, per, None)


async def overview(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    sections: list[dict[str, Any]] = []
    for schema in d.schemas:
        version = await d.version(schema)
        if version is None:
            sections.append({"schema": schema, "version": None, "rows": [], "cached": False})
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
            if not _timed_out(exc):
                raise
            queues = {info.name: info for info in await d.read(schema, lambda q: q.get_queues())}
            counts = [_cached_counts(info) for info in queues.values()]
            cached = True
        rows = []
        for c in counts:
            info = queues.get(c.name)
            queued = c.counts["created"] + c.counts["retry"]
            threshold = info.warning_queued if info is not None else 0
            problem = (
                c.counts["failed"] > 0
                or (threshold > 0 and queued >= threshold)
                or (c.oldest_ready_seconds or 0) > 300
            )
            rows.append({"counts": c, "info": info, "problem": problem, "history": None})
        rows.sort(key=lambda r: (not r["problem"], r["counts"].name))
        if version >= 46 and rows:
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
        sections.append({"schema": schema, "version": version, "rows": rows, "cached": cached})
    return d.render(request, "overview.html", sections=sections, history_rows=HISTORY_ROWS)


async def queue_detail(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    name = str(request.path_params["name"])

    def read(q: QueueService) -> Any:
        info = q.get_queue(name)
        if info is None:
            raise QueueNotFoundError(name, schema)
        counts = q.count_jobs([name])
        return (
            info,
            counts[0] if counts else None,
            q.get_schedules(name),
            q.get_subscriptions(name),
        )

    info, counts, schedules, subscriptions = await d.read(schema, read)
    fires = await _next_fires(schedules)
    return d.render(
        request,
        "queue.html",
        schema=schema,
        queue=info,
        counts=counts,
        schedules=fires,
        subscriptions=subscriptions,
        policies=("standard", "short", "singleton", "stately", "exclusive", "key_strict_fifo"),
    )


async def job_list(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    p = request.query_params
    filters = {k: p.get(k, "").strip() for k in ("queue", "state", "key", "group", "q")}
    filters.update({k: p.get(k, "").strip() for k in ("since", "until", "after")})
    if filters["state"] and filters["state"] not in STATES:
        raise BadRequest(f"state: {shown(filters['state'])} is not one of {', '.join(STATES)}")
    since = _parse_when("since", filters["since"])
    until = _parse_when("until", filters["until"])

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
    job_id = _parse_uuid("id", str(request.path_params["id"]))
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
    if version is not None and version >= 46:
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
    return d.render(
        request,
        "job.html",
        schema=schema,
        job=job,
        parents=parents,
        children=children,
        job_actions=job_actions(str(job.state)),
        flow_links=FLOW_LINKS,
        trace_id=_trace_id(job.trace_context),
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


async def _needs_46(request: Request, d: Dashboard, schema: str, page: str) -> Response | None:
    version = await d.version(schema)
    if version is None or version < 46:
        return d.render(
            request, "needs46.html", schema=schema, page=page, version=version, status_code=200
        )
    return None


async def _page_46(
    request: Request, page: str, template: str, key: str, work: Callable[[QueueService], Any]
) -> Response:
    """A page of what only schema 46 records: the rows ``work`` reads, rendered as
    ``key`` in ``template``; below 46, a page saying what it needs."""
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    refused = await _needs_46(request, d, schema, page)
    if refused is not None:
        return refused
    rows = await d.read(schema, work)
    return d.render(request, template, schema=schema, **{key: rows})


async def instances_page(request: Request) -> Response:
    return await _page_46(
        request, "Instances", "instances.html", "instances", lambda q: q.get_instances(limit=1000)
    )


async def warnings_page(request: Request) -> Response:
    return await _page_46(
        request, "Warnings", "warnings.html", "warnings", lambda q: q.get_warnings(limit=200)
    )


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


# ------------------------------------------------------------------ actions


async def _form(request: Request, d: Dashboard) -> Any:
    if d.read_only:
        raise HTTPException(403, "this dashboard is read-only")
    # Room for BULK_MAX ids and a few fields more, so that too many ids get
    # the action's own message; no file uploads.
    form = await request.form(max_files=0, max_fields=BULK_MAX + 50)
    d.check_csrf(request, form)
    return form


def _action_targets(action: str, form: Any) -> tuple[list[uuid.UUID], str]:
    """The jobs or queue an action names, every field checked before the
    confirmation page (nothing unchecked is shown or re-posted)."""
    raw = [str(v).strip() for v in form.getlist("ids") if str(v).strip()]
    if len(raw) > BULK_MAX:
        raise BadRequest(f"ids: at most {BULK_MAX} jobs per action, not {len(raw)}")
    ids = list(dict.fromkeys(_parse_uuid("ids", v) for v in raw))
    queue = str(form.get("queue", "")).strip()
    if form.get("scope") == "selected" and not ids:
        raise BadRequest("select at least one job")
    if not ids and not queue:
        raise BadRequest("name the jobs (ids) or the queue to act on")
    if queue:
        queue_ref(queue, "queue")
    to = str(form.get("to", "")).strip()
    if action == "redrive":
        if not queue:
            raise BadRequest("redrive needs the dead-letter queue (queue)")
        if to:
            queue_ref(to, "to")
    if action == "delete" and not ids and str(form.get("state", "")) not in STATES:
        raise BadRequest(f"a queue-wide delete needs a state (state): one of {', '.join(STATES)}")
    return ids, queue


def _describe(action: str, ids: list[uuid.UUID], queue: str, form: Any) -> str:
    if action == "redrive":
        to = str(form.get("to", "")).strip()
        where = f"to {to}" if to else "each to the queue it failed in"
        what = f"{len(ids)} job(s)" if ids else f"up to {BULK_MAX} waiting jobs"
        return f"Redrive {what} of dead-letter queue {queue}, {where}."
    if ids:
        return f"{action.capitalize()} {len(ids)} job(s) of queue {queue or '(each its own)'}."
    which = {
        "retry": "failed",
        "cancel": "created and retry",
        "resume": "cancelled",
        "delete": str(form.get("state", "")) or "(no state given)",
    }[action]
    return f"{action.capitalize()} up to {BULK_MAX} {which} jobs of queue {queue}."


_QUEUE_WIDE = {"retry": ["failed"], "cancel": ["created", "retry"], "resume": ["cancelled"]}
"""The states a queue-wide action takes its jobs from (delete: the state chosen)."""


def _run_action(
    action: str, ids: list[uuid.UUID], queue: str, form: Any
) -> Callable[[QueueService], str]:
    def work(q: QueueService) -> str:
        if action == "redrive":
            if not queue:
                raise BadRequest("redrive needs the dead-letter queue (queue)")
            to = str(form.get("to", "")).strip() or None
            moved = q.redrive(queue, to, ids or None, limit=BULK_MAX)
            return f"redrove {len(moved)} job(s) out of {queue}"
        targets: dict[str, list[uuid.UUID]] = {}
        if ids:
            if queue:
                targets[queue] = ids
            else:
                for info in q.get_queues():
                    for job in q.get_jobs(info.name, ids):
                        targets.setdefault(info.name, []).append(job.id)
        else:
            states = _QUEUE_WIDE.get(action) or [str(form.get("state", ""))]
            if states == [""] or not all(s in STATES for s in states):
                raise BadRequest("a queue-wide delete needs a known state (state)")
            for state in states:
                page = q.find_jobs(queue, state=state, limit=BULK_MAX)
                targets.setdefault(queue, []).extend(j.id for j in page.jobs)
        done = 0
        for name, chosen in targets.items():
            if not chosen:
                continue
            if action == "retry":
                done += len(q.retry(name, chosen).affected)
            elif action == "cancel":
                done += len(q.cancel(name, chosen).affected)
            elif action == "resume":
                done += len(q.resume(name, chosen).affected)
            else:
                done += len(q.delete_jobs(name, chosen).affected)
        past = {"retry": "retried", "cancel": "cancelled", "resume": "resumed", "delete": "deleted"}
        return f"{past[action]} {done} job(s)"

    return work


async def action(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    form = await _form(request, d)
    name = str(request.path_params["action"])
    if name not in ACTIONS:
        raise HTTPException(404, f"no action {shown(name)}: one of {', '.join(ACTIONS)}")
    ids, queue = _action_targets(name, form)
    root = d._root(request)
    fallback = (
        f"{root}/s/{schema}/jobs/{ids[0]}" + (f"?{urlencode({'queue': queue})}" if queue else "")
        if len(ids) == 1 and name != "delete"
        else f"{root}/s/{schema}/queues/{_in_path(queue)}"
        if queue
        else f"{root}/s/{schema}/jobs"
    )
    target = _safe_next(root, str(form.get("next", "")), fallback)
    if form.get("confirm") != "yes":
        fields = [(k, str(v)) for k, v in form.multi_items() if k not in ("csrf_token", "confirm")]
        matching = None
        if not ids and name != "redrive":
            # A queue-wide action: how many jobs it would touch now.
            wanted = _QUEUE_WIDE[name] if name != "delete" else [str(form.get("state"))]
            counts = await d.read(schema, lambda q: q.count_jobs([queue]))
            matching = sum(counts[0].counts[s] for s in wanted) if counts else 0
        return d.render(
            request,
            "confirm.html",
            schema=schema,
            action=name,
            description=_describe(name, ids, queue, form),
            fields=fields,
            ids=ids,
            matching=matching,
            bulk_max=BULK_MAX,
            back=target,
        )
    message = await d.write(schema, _run_action(name, ids, queue, form))
    if name == "delete" and target.startswith(f"{root}/s/{schema}/jobs/"):
        target = fallback if len(ids) != 1 else f"{root}/s/{schema}/jobs"
    response = RedirectResponse(target, status_code=303)
    d.set_flash(response, request, message)
    return response


_INT_OPTIONS = (
    "retry_limit",
    "retry_delay",
    "retry_delay_max",
    "expire_seconds",
    "retention_seconds",
    "deletion_seconds",
    "warning_queued",
    "heartbeat_seconds",
)


async def save_queue(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    form = await _form(request, d)
    name = str(form.get("name", "")).strip()
    mode = str(form.get("mode", "create"))
    if mode not in ("create", "update"):
        raise BadRequest(f"mode: {shown(mode)} is not create or update")
    options: dict[str, Any] = {}
    for option in _INT_OPTIONS:
        raw = str(form.get(option, "")).strip()
        if raw:
            try:
                options[option] = int(raw)
            except ValueError:
                raise BadRequest(f"{option}: {shown(raw)} is not a whole number") from None
    dead_letter = str(form.get("dead_letter", "")).strip()
    if dead_letter:
        options["dead_letter"] = dead_letter
    if "retry_backoff" in form:
        options["retry_backoff"] = form.get("retry_backoff") == "on"
    policy = str(form.get("policy", "")).strip()
    if mode == "create" and policy:
        options["policy"] = policy

    def work(q: QueueService) -> str:
        if mode == "update":
            q.update_queue(name, **options)
            return f"updated queue {name}"
        q.create_queue(name, exist_ok=False, **options)
        return f"created queue {name}"

    message = await d.write(schema, work)
    response = RedirectResponse(
        f"{d._root(request)}/s/{schema}/queues/{_in_path(name)}", status_code=303
    )
    d.set_flash(response, request, message)
    return response


async def send_job(request: Request) -> Response:
    d: Dashboard = request.app.state.dashboard
    schema = d.schema_of(request)
    form = await _form(request, d)
    name = str(form.get("queue", "")).strip()
    raw = str(form.get("data", "")).strip()
    if len(raw) > SEND_MAX:
        raise BadRequest(f"data: at most {SEND_MAX:,} characters of JSON here, not {len(raw):,}")
    try:
        data = json.loads(raw) if raw else None
    except RecursionError:
        raise BadRequest("data is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, or an integer over Python's digit limit
        raise BadRequest(f"data is not valid JSON: {exc}") from None
    options: dict[str, Any] = {}
    key = str(form.get("singleton_key", "")).strip()
    if key:
        options["singleton_key"] = key
    job_id = await d.write(schema, lambda q: q.send(name, data, **options))
    root = d._root(request)
    if job_id is None:
        response = RedirectResponse(f"{root}/s/{schema}/queues/{_in_path(name)}", status_code=303)
        d.set_flash(response, request, "the queue's policy did not accept the job")
    else:
        response = RedirectResponse(
            f"{root}/s/{schema}/jobs/{job_id}?{urlencode({'queue': name})}", status_code=303
        )
        d.set_flash(response, request, f"sent job {job_id}")
    return response


# ------------------------------------------------------------------ errors


async def _bad_request(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    return d.error(request, 400, str(exc))


async def _service_error(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    if isinstance(exc, QueueNotFoundError):
        return d.error(request, 404, str(exc))
    if isinstance(exc, SchemaFeatureError):
        return d.error(request, 400, str(exc))
    return d.error(request, 400, str(exc))


async def _database_error(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    orig = getattr(exc, "orig", None)
    reason = " ".join(str(orig if orig is not None else exc).split())[:300]
    return d.error(request, 503, f"database error: {reason}")


async def _http_error(request: Request, exc: Exception) -> Response:
    d: Dashboard = request.app.state.dashboard
    assert isinstance(exc, HTTPException)
    return d.error(request, exc.status_code, str(exc.detail))


def create_app(
    engine: Engine,
    *,
    schemas: Sequence[str] = ("pgboss",),
    read_only: bool = False,
    auth: AuthHook | None = None,
    basic_auth: tuple[str, str] | None = None,
    statement_timeout_ms: int = 5000,
    secret_key: str | bytes | None = None,
    title: str = "alkstore",
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard as a Starlette application (the "Browse and act in the dashboard" page).

    :param engine: a synchronous SQLAlchemy engine on the database.
    :param schemas: the queue schemas to show.
    :param read_only: show no action and refuse every POST (403).
    :param auth: the mounting application's check, ``(request) -> bool`` (or
        awaitable); false answers 403.
    :param basic_auth: ``(username, password)`` for HTTP basic authentication.
    :param statement_timeout_ms: ``statement_timeout`` of every request's
        transaction (0: none).
    :param secret_key: signs the CSRF tokens and flash messages; random per
        process when not given (tokens then end with the process).
    :param title: shown in the page titles.
    :param allowed_hosts: ``Host`` names (no port) requests may carry besides
        loopback ones (``localhost``, ``127.0.0.1``, ``[::1]``); ``"*"`` for any.
        Not given: without authentication loopback names only, which keeps out a
        page on another site whose name was rebound to 127.0.0.1; with
        authentication, any.
    :raises InvalidOptionsError: for a bad argument.
    """
    dashboard = Dashboard(
        engine,
        schemas=schemas,
        read_only=read_only,
        auth=auth,
        basic_auth=basic_auth,
        statement_timeout_ms=statement_timeout_ms,
        secret_key=secret_key,
        title=title,
        allowed_hosts=allowed_hosts,
    )
    routes = [
        Route("/", overview),
        Route("/healthz", healthz),
        Route("/metrics", metrics),
        Route("/static/style.css", style),
        Route("/s/{schema}/queues/{name:path}", queue_detail),
        Route("/s/{schema}/queues", save_queue, methods=["POST"]),
        Route("/s/{schema}/send", send_job, methods=["POST"]),
        Route("/s/{schema}/jobs", job_list),
        Route("/s/{schema}/jobs/{id}", job_detail),
        Route("/s/{schema}/schedules", schedules_page),
        Route("/s/{schema}/instances", instances_page),
        Route("/s/{schema}/warnings", warnings_page),
        Route("/s/{schema}/actions/{action}", action, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(SecurityMiddleware, dashboard=dashboard)],
        exception_handlers={
            BadRequest: _bad_request,
            AlkstoreError: _service_error,
            DBAPIError: _database_error,
            PoolTimeoutError: _database_error,  # every pooled connection busy
            HTTPException: _http_error,
        },
    )
    app.state.dashboard = dashboard
    return app
