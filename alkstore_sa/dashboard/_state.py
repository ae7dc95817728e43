"""The state behind one dashboard application, and what its pages and actions
share: the settings, a transaction per piece of work, rendering a page, and the
parsing of request fields (the "Browse and act in the dashboard" page). The
request's identity, CSRF tokens and flash messages are in ``_auth``.
"""

from __future__ import annotations

import datetime as dt
import secrets
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, text
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse

from .. import migrate, schema_health
from .._hosts import normalise_hosts
from .._web import checked_schemas, in_transaction
from ..backends import Backend
from ..backends import resolve as resolve_backend
from ..errors import InvalidOptionsError, shown
from ..migrations import attempts
from ..models.enums import JobState
from ..service import QueueService
from ._auth import CSRF_COOKIE, FLASH_COOKIE, AuthHook, RequestAuth
from ._render import environment

T = TypeVar("T")

STATES = tuple(s.value for s in JobState)
PATH_SAFE = "/:@!$&'()*+,;=-._~"
"""What a path keeps as it is when written into a URL (RFC 3986's segment characters)."""
LIVE_COOKIE = "alkstore_live"
"""``off`` while a viewer has paused the pages' live refresh."""
HERE = Path(__file__).parent


class BadRequest(Exception):
    """A malformed filter or form field: a 400 page with the message."""


class Dashboard(RequestAuth):
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
        backend: str | Backend | None = None,
        refresh_seconds: int = 5,
    ) -> None:
        self.schemas = checked_schemas(engine, schemas)
        self.backend = resolve_backend(backend, dialect=engine.dialect.name)
        if isinstance(statement_timeout_ms, bool) or not isinstance(statement_timeout_ms, int):
            raise InvalidOptionsError("statement_timeout_ms", "must be an integer")
        if statement_timeout_ms < 0:
            raise InvalidOptionsError("statement_timeout_ms", "must be 0 (none) or more")
        if (
            isinstance(refresh_seconds, bool)
            or not isinstance(refresh_seconds, int)
            or not 0 <= refresh_seconds <= 3600
        ):
            raise InvalidOptionsError(
                "refresh_seconds",
                f"must be an integer from 0 (never) to 3600, not {shown(refresh_seconds)}",
            )
        self.refresh_seconds = refresh_seconds
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
        self.templates = environment(HERE / "templates")

    # ------------------------------------------------------------ database

    def schema_of(self, request: Request) -> str:
        schema = str(request.path_params["schema"])
        if schema not in self.schemas:
            raise HTTPException(404, f"schema {shown(schema)} is not shown by this dashboard")
        return schema

    def _session_work(self, schema: str, work: Callable[[QueueService], T], *, write: bool) -> T:
        return in_transaction(self.engine, schema, self.backend, self.timeout_ms, work, write=write)

    async def read(self, schema: str, work: Callable[[QueueService], T]) -> T:
        """Run ``work`` in a read-only transaction of its own, in the thread pool."""
        return await run_in_threadpool(self._session_work, schema, work, write=False)

    async def write(self, schema: str, work: Callable[[QueueService], T]) -> T:
        """Run ``work`` in a transaction of its own (committed), in the thread pool."""
        return await run_in_threadpool(self._session_work, schema, work, write=True)

    async def diagnose(self, schema: str) -> schema_health.Diagnosis:
        """What ``alkstore db check`` reports of ``schema``: read only, in the thread pool,
        under the statement timeout."""

        def read() -> schema_health.Diagnosis:
            with self.engine.connect() as conn, conn.begin():
                conn.execute(text("SET TRANSACTION READ ONLY"))
                conn.execute(
                    text("SELECT set_config('statement_timeout', :ms, true)"),
                    {"ms": str(self.timeout_ms)},
                )
                return schema_health.diagnose(conn, schema)

        return await run_in_threadpool(read)

    async def attempt_history(self, schema: str) -> bool:
        """Whether ``schema`` keeps the attempt history (its table is there)."""

        def read() -> bool:
            with self.engine.connect() as conn:
                return attempts.exists(conn, schema)

        return await run_in_threadpool(read)

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
        # This page's path as a URL writes it (a schema or queue name may hold spaces or
        # letters beyond ASCII): the "next" of its forms and links comes back unchanged.
        here = quote(request.url.path, safe=PATH_SAFE)
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
            request_path=here,
            request_full=here + (f"?{request.url.query}" if request.url.query else ""),
            refresh=self.refresh_seconds,
            live_paused=request.cookies.get(LIVE_COOKIE) == "off",
            live_page=context.pop("live_page", False),
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


def parse_when(name: str, value: str) -> dt.datetime | None:
    if not value:
        return None
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadRequest(f"{name}: {shown(value)} is not an ISO-8601 date or time") from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def parse_uuid(name: str, value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise BadRequest(f"{name}: {shown(value)} is not a job id (a UUID)") from None


def in_path(name: str) -> str:
    """A queue name as a URL path segment: percent-encoded, ``/`` kept (the route
    takes a path). A name another client made may hold a space, ``#``, ``?`` or any
    letter; a header of ours carries only ASCII."""
    return quote(name, safe="/")
