"""Serving the dashboard: the bind check and a uvicorn runner."""

from __future__ import annotations

import socket
from typing import Any

from .._hosts import is_loopback, listen
from ..errors import InvalidOptionsError, shown


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


def serve(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    has_auth: bool = False,
    sock: socket.socket | None = None,
) -> None:
    """Check the bind (:func:`check_bind`), then run ``app`` with uvicorn until
    interrupted, on ``sock`` (from ``listen``) or on a socket bound here.

    :raises InvalidOptionsError: as :func:`check_bind`, before listening.
    :raises OSError: as :func:`listen`.
    """
    check_bind(host, has_auth)
    import uvicorn

    bound = sock if sock is not None else listen(host, port)
    with bound:
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[bound])
