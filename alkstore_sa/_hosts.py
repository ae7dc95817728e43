"""Host names and loopback addresses: what the dashboard and the HTTP API answer to
without authentication (a loopback ``Host``), and the names they are told to accept."""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from .errors import InvalidOptionsError, shown

__all__ = [
    "LOOPBACK_NAMES",
    "bind_address",
    "host_name",
    "is_loopback",
    "listen",
    "normalise_hosts",
]

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


# A DNS name, IPv4, or IPv6 (brackets gone).
_HOST_CHARS = re.compile(r"[A-Za-z0-9._:-]+")


def host_name(value: str) -> str | None:
    """The host of a ``Host`` header or an origin's netloc, lower case, without
    port or brackets; ``None`` when it is not one (empty, or with a user part)."""
    value = value.strip()
    if not value or "@" in value or "/" in value:
        return None
    try:
        parsed = urlsplit("//" + value)
        name = parsed.hostname
        parsed.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError:
        return None
    if not name or not _HOST_CHARS.fullmatch(name):
        return None
    return name.lower().rstrip(".")


def normalise_hosts(hosts: Iterable[str] | None) -> frozenset[str] | None:
    """``allowed_hosts`` as host names (lower case, no port); ``None`` stays ``None``."""
    if hosts is None:
        return None
    if isinstance(hosts, str):
        hosts = (hosts,)
    out = set()
    for raw in hosts:
        if raw == "*":
            out.add("*")
            continue
        name = host_name(raw) if isinstance(raw, str) else None
        if name is None:
            raise InvalidOptionsError("allowed_hosts", f"{shown(raw)} is not a host name")
        out.add(name)
    return frozenset(out)


def listen(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` and listening, for a server.

    Binding before anything is announced lets a caller say "port in use" as its own
    error instead of uvicorn's log line after a success message.

    :raises OSError: the address cannot be bound (``errno.EADDRINUSE`` for a busy port).
    """
    address = bind_address(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return socket.create_server((address, port), family=family, backlog=2048)


def bind_address(host: str) -> str:
    """``host`` as a socket binds it: an IPv6 address without its URL brackets."""
    host = host.strip()
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host
