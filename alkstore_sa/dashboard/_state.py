"""The state behind one dashboard application, and what its pages and actions
share: the settings and secret, the request's identity, CSRF tokens and flash
messages, a transaction per piece of work, and the parsing of request fields
(the "Browse and act in the dashboard" page).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import inspect
import secrets
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response

from .. import migrate
from ..errors import InvalidOptionsError, shown
from ..models.enums import JobState
from ..names import validate_schema
from ..service import QueueService
from ._render import environment
from ._security import normalise_hosts

T = TypeVar("T")

AuthHook = Callable[[Request], "bool | Awaitable[bool]"]

STATES = tuple(s.value for s in JobState)
CSRF_COOKIE = "alkstore_csrf"
FLASH_COOKIE = "alkstore_flash"
HERE = Path(__file__).parent


class BadRequest(Exception):
    """A malformed filter or form field: a 400 page with the message."""


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
        self.templates = environment(HERE / "templates")

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

    def _session_work(self, schema: str, work: Callable[[QueueService], T], *, write: bool) -> T:
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
        return await run_in_threadpool(self._session_work, schema, work, write=False)

    async def write(self, schema: str, work: Callable[[QueueService], T]) -> T:
        """Run ``work`` in a transaction of its own (committed), in the thread pool."""
        return await run_in_threadpool(self._session_work, schema, work, write=True)

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
