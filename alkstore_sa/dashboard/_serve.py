"""Serving the dashboard: the bind check and a uvicorn runner."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

from ..errors import InvalidOptionsError, shown

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) only listens on this machine."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(host: str, has_auth: bool) -> None:
    """Refuse to serve the dashboard on a non-loopback ``host`` without authentication.

    The dashboard can retry, cancel and delete jobs: anyone who reaches it
    can. On ``127.0.0.1``, ``::1`` or ``localhost`` only this machine can;
    any other address (``0.0.0.0`` included) needs basic auth or an auth hook.

    :raises InvalidOptionsError: a non-loopback host and ``has_auth`` false.
    """
    if not has_auth and not is_loopback(host):
        raise InvalidOptionsError(
            "host",
            f"refusing to serve the dashboard on {shown(host)} without authentication: set "
            "ALKSTORE_DASHBOARD_USER and ALKSTORE_DASHBOARD_PASSWORD (basic auth) or bind "
            "to 127.0.0.1",
        )


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, for :func:`serve`.

    Binding before anything is announced lets a caller say "port in use" as its own
    error instead of uvicorn's log line after a success message.

    :raises OSError: the address cannot be bound (``errno.EADDRINUSE`` for a busy port).
    """
    address = bind_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return socket.create_server((address, port), family=family, backlog=2048)


def serve(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    has_auth: bool = False,
    sock: socket.socket | None = None,
) -> None:
    """Check the bind (:func:`check_bind`), then run ``app`` with uvicorn until
    interrupted, on ``sock`` (from :func:`listen`) or on a socket bound here.

    :raises InvalidOptionsError: as :func:`check_bind`, before listening.
    :raises OSError: as :func:`listen`.
    """
    check_bind(host, has_auth)
    import uvicorn

    bound = sock if sock is not None else listen(host, port)
    with bound:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[bound])


def bind_address(host: str) -> str:
    """``host`` as a socket binds it: an IPv6 address without its URL brackets."""
    host = host.strip()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
