"""The HTTP API's Starlette application (the "HTTP API" page).

For every request to ``/api/<operation>`` (or ``/s/<schema>/api/<operation>`` for a
schema other than the first), in order:

1. **Host.** Without tokens, only from a loopback client address, and only to a loopback
   ``Host`` (or one in ``allowed_hosts``): a page on another site whose name was rebound
   to 127.0.0.1 sends its own name and is refused.
2. **Token.** With tokens, ``Authorization: Bearer <token>``, compared in constant time
   with every token (or given to the application's check); else 401. A token that no
   header can carry (surrounding spaces, a character outside printable ASCII) is refused
   by :func:`create_app`, and one under 16 characters warned about.
3. **Browser requests.** A ``POST`` must be ``Content-Type: application/json`` (a page
   on another site cannot send that without a CORS preflight, which is never answered)
   and must not come from another site (``Sec-Fetch-Site``, ``Origin``); else 415 or 403.
4. **Read-only** refuses every ``POST`` (403); **size**: a body over ``max_body_bytes``
   is refused (413) before it is read whole, and a list over ``max_batch`` entries too,
   or a ``fetch`` of more than ``max_batch`` jobs.
5. The operation runs in one transaction of its own, with ``statement_timeout``; its
   answer is ``{"ok": true, "result": ...}``, an error ``application/problem+json``
   naming the library's error, never a traceback or SQL; a value the database refuses
   (SQLSTATE class 22) is the caller's 400 ``DataError``, not a 503.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import hmac
import inspect
import ipaddress
import json
import logging
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .._hosts import host_name, is_loopback, normalise_hosts
from .._web import checked_schemas, in_transaction
from ..backends import Backend
from ..backends import resolve as resolve_backend
from ..errors import (
    AlkstoreError,
    InvalidOptionsError,
    QueueNotFoundError,
    SchemaNotInstalledError,
    shown,
)
from ..service import QueueService
from ._openapi import docs_page, openapi_document
from ._operations import BY_NAME, BatchTooLarge, Operation, call_for, from_query

log = logging.getLogger("alkstore_sa.api")

TokenCheck = Callable[[str], "bool | Awaitable[bool]"]
"""An application's own token check: ``(token) -> bool`` (or awaitable)."""

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
"""The largest request body by default: a batch of jobs with some data each (one job's
data may be up to :data:`~alkstore_sa.limits.MAX_PAYLOAD_BYTES`, 1 MiB)."""

DEFAULT_MAX_BATCH = 1000
"""The most entries a list in one request may hold by default (jobs, ids, names), and
the most jobs one ``fetch`` claims."""

SHORT_TOKEN = 16
"""A bearer token shorter than this is warned about (a guessable secret)."""

_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
_DOCS_CSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'"
_PROBLEM = "application/problem+json"


class Refused(Exception):
    """A request refused before it reached the service (status, error name, message)."""

    def __init__(self, status: int, name: str, message: str, **headers: str) -> None:
        super().__init__(message)
        self.status = status
        self.name = name
        self.headers = headers


def problem(status: int, name: str, message: str, option: str | None = None) -> JSONResponse:
    """An error as RFC 9457 problem details, with the success envelope's ``ok`` and
    ``error`` beside them (a client written for either shape reads it)."""
    body = {
        "type": f"urn:alkstore:error:{name}",
        "title": name,
        "status": status,
        "detail": message,
        "ok": False,
        "error": {"name": name, "message": message, "option": option},
    }
    return JSONResponse(body, status_code=status, media_type=_PROBLEM, headers=_HEADERS)


def jsonable(value: Any) -> Any:
    """A service answer as JSON values: records as objects of their fields, ids and
    times as text (ISO-8601), enums as their values."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(jsonable(k)): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    return str(value)


class Api:
    """The state behind one application: engine, settings, tokens."""

    def __init__(
        self,
        engine: Engine,
        *,
        schemas: Sequence[str],
        auth: Sequence[str] | TokenCheck | None,
        read_only: bool,
        statement_timeout_ms: int,
        max_body_bytes: int,
        max_batch: int,
        allowed_hosts: Sequence[str] | None,
        backend: str | Backend | None,
        title: str,
    ) -> None:
        self.schemas = checked_schemas(engine, schemas)
        self.engine = engine
        self.backend = resolve_backend(backend, dialect=engine.dialect.name)
        self.tokens: tuple[bytes, ...] = ()
        self.check: TokenCheck | None = None
        if callable(auth):
            self.check = auth
        elif auth is not None:
            if isinstance(auth, str | bytes) or not all(isinstance(t, str) and t for t in auth):
                raise InvalidOptionsError("auth", "must be a list of non-empty tokens, or a check")
            if not auth:
                raise InvalidOptionsError("auth", "an empty list of tokens would refuse everyone")
            for n, token in enumerate(auth, 1):
                _check_token(n, token)
            self.tokens = tuple(t.encode() for t in auth)
        for option, value, low in (
            ("statement_timeout_ms", statement_timeout_ms, 0),
            ("max_body_bytes", max_body_bytes, 1),
            ("max_batch", max_batch, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidOptionsError(option, f"must be an integer of at least {low}")
        self.read_only = bool(read_only)
        self.timeout_ms = statement_timeout_ms
        self.max_body_bytes = max_body_bytes
        self.max_batch = max_batch
        self.allowed_hosts = normalise_hosts(allowed_hosts)
        self.title = title
        self.document = openapi_document(title)
        self.page = docs_page(self.document)

    @property
    def has_auth(self) -> bool:
        return bool(self.tokens) or self.check is not None

    # ----------------------------------------------------------- the gates

    def check_host(self, request: Request) -> None:
        """Without tokens, only a loopback client (when its address is known) and a
        loopback ``Host`` or one of ``allowed_hosts``; with tokens, any ``Host`` unless
        ``allowed_hosts`` names some."""
        if not self.has_auth:
            client = request.client.host if request.client is not None else ""
            try:
                remote = ipaddress.ip_address(client.strip("[]"))
            except ValueError:
                remote = None  # not an address (an in-process test client): the Host decides
            if remote is not None and not remote.is_loopback:
                raise Refused(
                    403, "Forbidden", "without tokens this API answers loopback clients only"
                )
        allowed = self.allowed_hosts
        if allowed is not None and "*" in allowed:
            return
        if allowed is None and self.has_auth:
            return  # a token is asked for: any name the proxy in front passes
        name = host_name(request.headers.get("host", ""))
        if name is not None and (is_loopback(name) or (allowed is not None and name in allowed)):
            return
        raise Refused(403, "Forbidden", f"this API does not answer to the host {shown(name)}")

    async def check_token(self, request: Request) -> None:
        if not self.has_auth:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        token = token.strip()
        ok = False
        if scheme.lower() == "bearer" and token:
            if self.check is not None:
                answer = self.check(token)
                ok = bool(await answer) if inspect.isawaitable(answer) else bool(answer)
            else:
                given = token.encode()
                # Every token compared, in constant time each: how long it takes says
                # nothing about which one, or how much of one, matched.
                for known in self.tokens:
                    ok |= hmac.compare_digest(given, known)
        if not ok:
            raise Refused(
                401,
                "Unauthorized",
                "a valid bearer token is required",
                **{"WWW-Authenticate": 'Bearer realm="alkstore"'},
            )

    @staticmethod
    def check_browser(request: Request) -> None:
        site = request.headers.get("sec-fetch-site", "").strip().lower()
        if site in ("cross-site", "same-site"):
            raise Refused(403, "Forbidden", "a request from another site is refused")
        origin = request.headers.get("origin")
        if origin is not None and host_name(origin.split("//", 1)[-1]) != host_name(
            request.headers.get("host", "")
        ):
            raise Refused(403, "Forbidden", "a request from another origin is refused")

    async def body(self, request: Request) -> Any:
        media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            raise Refused(
                415, "UnsupportedMediaType", "send the arguments as Content-Type: application/json"
            )
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise self._too_large()
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self._too_large()
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks), parse_constant=_no_constant)
        except (ValueError, RecursionError) as exc:
            raise Refused(400, "InvalidJSON", f"the body is not JSON: {exc}") from None

    def _too_large(self) -> Refused:
        limit = self.max_body_bytes
        return Refused(
            413, "PayloadTooLarge", f"the body is over this API's limit of {limit} bytes"
        )

    # ----------------------------------------------------------- running

    def schema_of(self, request: Request) -> str:
        schema = request.path_params.get("schema")
        if schema is None:
            return self.schemas[0]
        if schema not in self.schemas:
            raise Refused(404, "SchemaNotServed", f"this API serves no schema {shown(schema)}")
        return str(schema)

    def run(self, schema: str, work: Callable[[QueueService], Any], *, write: bool) -> Any:
        """``work`` in a transaction of its own (committed when it writes), with the
        statement timeout; called in the thread pool."""
        return in_transaction(self.engine, schema, self.backend, self.timeout_ms, work, write=write)


def _check_token(n: int, token: str) -> None:
    """Refuse token ``n`` if no request can carry it; warn if it is short. Never shows it."""
    # A header value is read as Latin-1 and stripped of surrounding spaces: a token
    # with those, or with a character outside printable ASCII, can never match.
    if token != token.strip() or not all(" " <= c <= "~" for c in token):
        raise InvalidOptionsError(
            "auth",
            f"token {n} can never match: a bearer token is printable ASCII without "
            "surrounding spaces",
        )
    if len(token) < SHORT_TOKEN:
        warnings.warn(
            f"alkstore API: token {n} has {len(token)} character"
            f"{'' if len(token) == 1 else 's'}; use a random one of at least {SHORT_TOKEN}",
            UserWarning,
            stacklevel=4,  # the caller of create_app
        )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _operation(request: Request) -> Operation:
    name = str(request.path_params["operation"])
    op = BY_NAME.get(name)
    if op is None:
        raise Refused(404, "UnknownOperation", f"no operation {shown(name)} (see /openapi.json)")
    if request.method != op.method.upper():
        raise Refused(
            405,
            "MethodNotAllowed",
            f"{op.name} is {op.method.upper()}" + (" (it only reads)" if op.reads else ""),
            Allow=op.method.upper(),
        )
    return op


async def endpoint(request: Request) -> Response:
    api: Api = request.app.state.api
    try:
        api.check_host(request)
        await api.check_token(request)
        op = _operation(request)
        schema = api.schema_of(request)
        if op.reads:
            args = from_query(op, request.query_params)
        else:
            api.check_browser(request)
            if api.read_only:
                raise Refused(403, "ReadOnly", f"this API is read-only: {op.name} writes")
            args = await api.body(request)
            if not isinstance(args, dict):
                raise Refused(400, "InvalidJSON", "the body must be a JSON object of arguments")
        call = call_for(op, args, api.max_batch)
        result = await run_in_threadpool(api.run, schema, call, write=not op.reads)
    except Refused as exc:
        response = problem(exc.status, exc.name, str(exc))
        response.headers.update(exc.headers)
        return response
    except Exception as exc:
        return _error(request, exc)
    return JSONResponse({"ok": True, "result": jsonable(result)}, headers=_HEADERS)


def _error(request: Request, exc: Exception) -> Response:
    """An error of the service or the database as a problem, never its traceback or SQL."""
    name = type(exc).__name__
    if isinstance(exc, BatchTooLarge):
        return problem(413, "BatchTooLarge", str(exc), exc.option)
    if isinstance(exc, InvalidOptionsError):
        return problem(400, name, str(exc), exc.option)
    if isinstance(exc, QueueNotFoundError):
        return problem(404, name, str(exc))
    if isinstance(exc, SchemaNotInstalledError):
        return problem(503, name, str(exc))
    if isinstance(exc, AlkstoreError):
        return problem(409, name, str(exc))
    if isinstance(exc, DBAPIError | PoolTimeoutError):
        orig = getattr(exc, "orig", None)
        code = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
        if code == "57014":
            return problem(503, "StatementTimeout", "the statement ran past the API's timeout")
        if isinstance(code, str) and code.startswith("22"):
            # A data exception: a value of this request the database refused. Trying
            # again cannot help; its primary message names the problem, never the SQL.
            diag = getattr(orig, "diag", None)
            reason = getattr(diag, "message_primary", None) or f"SQLSTATE {code}"
            return problem(400, "DataError", f"the database refused a value: {reason}")
        log.warning(
            "api request failed on the database: %s %s: %s",
            request.method,
            request.url.path,
            type(getattr(exc, "orig", exc)).__name__,
            extra={"action": "api_database_error"},
        )
        return problem(503, "DatabaseError", "the database could not answer; try again")
    log.exception(
        "api request failed: %s %s",
        request.method,
        request.url.path,
        extra={"action": "api_error"},
    )
    return problem(500, "InternalError", "the request failed; the server's log says why")


def _described(respond: Callable[[Api], Response]) -> Callable[[Request], Awaitable[Response]]:
    """An endpoint describing the API (its document, its page): the host check, then
    ``respond``; no token needed."""

    async def endpoint(request: Request) -> Response:
        api: Api = request.app.state.api
        try:
            api.check_host(request)
        except Refused as exc:
            return problem(exc.status, exc.name, str(exc))
        return respond(api)

    return endpoint


openapi = _described(lambda api: JSONResponse(api.document, headers=_HEADERS))
docs = _described(
    lambda api: HTMLResponse(api.page, headers={**_HEADERS, "Content-Security-Policy": _DOCS_CSP})
)


async def healthz(request: Request) -> Response:
    return PlainTextResponse("ok", headers=_HEADERS)


def create_app(
    engine: Engine,
    *,
    schemas: Sequence[str] = ("pgboss",),
    auth: Sequence[str] | TokenCheck | None = None,
    read_only: bool = False,
    statement_timeout_ms: int = 5000,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_batch: int = DEFAULT_MAX_BATCH,
    allowed_hosts: Sequence[str] | None = None,
    backend: str | Backend | None = None,
    supervise: bool = False,
    title: str = "alkstore API",
) -> Starlette:
    """The HTTP API as a Starlette application (the "HTTP API" page): the queue
    operations of :class:`~alkstore_sa.QueueService` over JSON, with an OpenAPI 3.1
    document at ``/openapi.json`` and a documentation page at ``/docs``.

    :param engine: a synchronous SQLAlchemy engine on the database.
    :param schemas: the queue schemas served: the first at ``/api/...``, each at
        ``/s/<schema>/api/...``.
    :param auth: the bearer tokens a request must carry (any one of them), or the
        application's check ``(token) -> bool`` (or awaitable). Without it the API
        answers loopback clients and loopback ``Host`` names only. A token a request
        cannot carry (surrounding spaces, a character outside printable ASCII) is
        refused; one under 16 characters warned about.
    :param read_only: refuse every operation that writes (403).
    :param statement_timeout_ms: ``statement_timeout`` of every request's transaction
        (0: none).
    :param max_body_bytes: the largest request body (413 above).
    :param max_batch: the most entries of a list in one request, and the most jobs one
        ``fetch`` claims (413 above).
    :param allowed_hosts: ``Host`` names answered besides loopback ones (``"*"``: any).
    :param backend: the database backend profile, as :class:`~alkstore_sa.QueueService`
        takes it.
    :param supervise: also run a :class:`~alkstore_sa.Supervisor` per schema while the
        application runs (off: the API holds no state and runs no maintenance).
    :param title: the document's and the page's title.
    :raises InvalidOptionsError: for a bad argument.
    """
    api = Api(
        engine,
        schemas=schemas,
        auth=auth,
        read_only=read_only,
        statement_timeout_ms=statement_timeout_ms,
        max_body_bytes=max_body_bytes,
        max_batch=max_batch,
        allowed_hosts=allowed_hosts,
        backend=backend,
        title=title,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        from ..supervision import Supervisor

        running = []
        if supervise:
            for schema in api.schemas:
                supervisor = Supervisor(engine, schema=schema, backend=api.backend)
                supervisor.start()
                running.append(supervisor)
        try:
            yield
        finally:
            for supervisor in running:
                await run_in_threadpool(supervisor.stop)

    methods = ["GET", "POST"]
    app = Starlette(
        routes=[
            Route("/openapi.json", openapi),
            Route("/docs", docs),
            Route("/healthz", healthz),
            Route("/api/{operation}", endpoint, methods=methods),
            Route("/s/{schema}/api/{operation}", endpoint, methods=methods),
        ],
        lifespan=lifespan,
    )
    app.state.api = api
    return app
