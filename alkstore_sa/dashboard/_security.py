"""The dashboard's outer layer: which requests reach a page at all, and the
headers every response carries (the "Browse and act in the dashboard" page, "Secure it").

In order, for every HTTP request:

1. **Host.** Without authentication, only a loopback ``Host`` (``localhost``,
   ``127.0.0.0/8``, ``[::1]``) or one named in ``allowed_hosts``: a page on
   another site whose name was rebound to 127.0.0.1 (DNS rebinding) sends its
   own name, and is refused before it can read anything.
2. **Authentication** (basic auth, the mounting application's hook), then
   read-only mode.
3. **Origin.** A request that can change something (not GET, HEAD or OPTIONS)
   must say it came from this page: ``Sec-Fetch-Site: same-origin``, or, from a
   browser that does not send that header, an ``Origin`` whose host is the
   request's own ``Host`` (or an allowed host). Neither: 403, nothing read.
4. **Headers.** Every response, error pages and a 500 included, carries
   :data:`SECURITY_HEADERS`; an exception no handler took becomes a 500 page
   here (logged with its traceback), not a bare server error without them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from .._hosts import host_name, is_loopback
from ..errors import shown

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("alkstore_sa.dashboard")

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class Gate(Protocol):
    """What the checks read of the dashboard (``_state.Dashboard`` is one)."""

    @property
    def allowed_hosts(self) -> frozenset[str] | None: ...

    @property
    def has_auth(self) -> bool: ...

    @property
    def read_only(self) -> bool: ...

    async def authenticate(self, request: Request) -> Response | None: ...


class SecurityMiddleware:
    """The checks and headers above, around the whole dashboard application."""

    def __init__(self, app: ASGIApp, dashboard: Gate) -> None:
        self.app = app
        self.dashboard = dashboard

    def _host_allowed(self, request: Request) -> bool:
        allowed = self.dashboard.allowed_hosts
        if allowed is not None and "*" in allowed:
            return True
        name = host_name(request.headers.get("host", ""))
        if name is None:
            return False
        if allowed is not None and name in allowed:
            return True
        if allowed is None and self.dashboard.has_auth:
            return True  # authenticated, no list given: any name the proxy passes
        return is_loopback(name)

    def _same_origin(self, request: Request) -> bool:
        site = request.headers.get("sec-fetch-site")
        if site is not None:
            return site.strip().lower() == "same-origin"
        origin = request.headers.get("origin", "").strip()
        if not origin or origin == "null":
            return False
        parts = urlsplit(origin)
        if parts.scheme not in ("http", "https") or parts.path not in ("", "/"):
            return False
        try:
            theirs = (host_name(parts.netloc), parts.port)
        except ValueError:
            return False
        host = request.headers.get("host", "")
        try:
            ours = (host_name(host), urlsplit("//" + host.strip()).port)
        except ValueError:
            return False
        if theirs[0] is None:
            return False
        # The same host and port, whatever the scheme (a TLS proxy in front
        # turns https into http); or a host the operator allowed.
        if theirs == ours:
            return True
        allowed = self.dashboard.allowed_hosts
        return allowed is not None and theirs[0] in allowed

    async def _refusal(self, request: Request) -> Response | None:
        if not self._host_allowed(request):
            host = request.headers.get("host", "")
            return PlainTextResponse(
                f"host {shown(host)} is not allowed: without authentication the dashboard "
                "answers only to a loopback name (localhost, 127.0.0.1, [::1]); name "
                "others with allowed_hosts (--allowed-host)",
                status_code=400,
            )
        denied = await self.dashboard.authenticate(request)
        if denied is not None:
            return denied
        if request.method in SAFE_METHODS:
            return None
        if self.dashboard.read_only:
            # Every route's own check aside: nothing but reading, whatever the route.
            return PlainTextResponse("this dashboard is read-only", status_code=403)
        if not self._same_origin(request):
            return PlainTextResponse(
                "cross-origin request refused: a change must come from the dashboard's "
                "own pages (Origin or Sec-Fetch-Site)",
                status_code=403,
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        started = False

        async def send_with_headers(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                present = {bytes(k).lower() for k, _ in message.get("headers", [])}
                extra = [
                    (name.lower().encode(), value.encode())
                    for name, value in SECURITY_HEADERS.items()
                    if name.lower().encode() not in present
                ]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        try:
            refusal = await self._refusal(request)
            if refusal is not None:
                await refusal(scope, receive, send_with_headers)
                return
            await self.app(scope, receive, send_with_headers)
        except Exception:
            log.exception("dashboard request failed: %s %s", request.method, request.url.path)
            if started:
                raise  # too late for an error page: the response is under way
            await PlainTextResponse("internal error: see the dashboard's log", status_code=500)(
                scope, receive, send_with_headers
            )


def safe_next(root: str, value: str | None, fallback: str) -> str:
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
