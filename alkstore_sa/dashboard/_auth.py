"""Who a dashboard request is and what it carries: basic auth or the mounting
application's hook, CSRF tokens bound to the request's identity, and signed flash
messages (the "Browse and act in the dashboard" page, "Secure it").

``_security`` decides which requests reach a page at all; this module holds what
a page and an action check of the request once it has.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import inspect
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

AuthHook = Callable[[Request], "bool | Awaitable[bool]"]

CSRF_COOKIE = "alkstore_csrf"
FLASH_COOKIE = "alkstore_flash"


class RequestAuth:
    """Authentication, CSRF tokens and flash messages of one dashboard application
    (``_state.Dashboard`` sets the attributes)."""

    auth: AuthHook | None
    basic_auth: tuple[str, str] | None
    secret: bytes

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
