"""``alkstore dashboard``: the web dashboard (the "Browse and act in the dashboard" page).

Serves :func:`alkstore_sa.dashboard.create_app` with uvicorn until Ctrl-C.
Basic-auth credentials come from the environment only (never the command line,
where other users could read them): ``ALKSTORE_DASHBOARD_USER`` and
``ALKSTORE_DASHBOARD_PASSWORD``. A host other than a loopback address needs them.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from types import ModuleType
from typing import Any

from sqlalchemy import Engine

from ..names import validate_schema
from ._common import BadInput, CommandError, cannot_listen, engine_from, server_parser

USER_ENV = "ALKSTORE_DASHBOARD_USER"
PASSWORD_ENV = "ALKSTORE_DASHBOARD_PASSWORD"
DEFAULT_PORT = 8765


def register(sub: Any) -> None:
    p = server_parser(
        sub,
        "dashboard",
        "serve the web dashboard (needs the dashboard extra)",
        port=DEFAULT_PORT,
        schema_help="a queue schema to show; repeat for more (default: the global --schema)",
        read_only_help="show no actions; refuse every POST",
        allowed_host_help="a Host name the dashboard answers to besides loopback ones "
        "(repeatable; '*' for any); the name a proxy or a tunnel in front passes",
    )
    p.add_argument(
        "--refresh",
        dest="refresh_seconds",
        type=int,
        default=5,
        metavar="SECONDS",
        help="how often the overview, instances and warnings pages reload themselves "
        "(default 5; 0: never)",
    )
    p.set_defaults(handler=_run)


def dashboard_package() -> ModuleType:
    """``alkstore_sa.dashboard``, or a :class:`CommandError` naming the extra it needs."""
    try:
        from .. import dashboard
    except ImportError as exc:
        raise CommandError(
            f"the dashboard needs its extra: pip install 'alkstore_sa[dashboard]' ({exc})"
        ) from None
    return dashboard


def basic_auth_from_env() -> tuple[str, str] | None:
    """``(user, password)`` from the environment, or ``None``.

    One without the other is bad input."""
    user, password = os.environ.get(USER_ENV, ""), os.environ.get(PASSWORD_ENV, "")
    if bool(user) != bool(password):
        raise BadInput(f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
    return (user, password) if user else None


def serve_dashboard(
    engine: Engine,
    schemas: list[str],
    *,
    host: str,
    port: int,
    read_only: bool = False,
    allowed_hosts: list[str] | None = None,
    out: Any = None,
    sock: socket.socket | None = None,
    backend: str | None = None,
    refresh_seconds: int = 5,
) -> None:
    """Check the bind, bind (unless ``sock`` is bound already), print the URL, and
    serve the dashboard until interrupted.

    A port that cannot be bound is a :class:`CommandError` naming ``--port``,
    before anything is printed."""
    board = dashboard_package()
    if not 1 <= port <= 65535:
        raise BadInput("--port must be between 1 and 65535")
    auth = basic_auth_from_env()
    board.check_bind(host, auth is not None)
    app = board.create_app(
        engine,
        schemas=schemas,
        read_only=read_only,
        basic_auth=auth,
        allowed_hosts=allowed_hosts,
        backend=backend,
        refresh_seconds=refresh_seconds,
    )
    bare = host.strip().strip("[]")
    if sock is None:
        try:
            sock = board.listen(bare, port)
        except OSError as exc:
            raise cannot_listen(exc, bare, port, "--port") from None
    shown = f"[{bare}]" if ":" in bare else bare
    print(f"dashboard on http://{shown}:{port}/ (Ctrl-C to stop)", file=out or sys.stderr)
    board.serve(app, host=host, port=port, has_auth=auth is not None, sock=sock)


def _run(args: argparse.Namespace) -> int:
    schemas = [validate_schema(s) for s in (args.schemas or [args.schema])]
    # Before connecting: an unauthenticated public bind is refused at once.
    auth = basic_auth_from_env()
    dashboard_package().check_bind(args.host, auth is not None)
    with engine_from(args) as engine:
        serve_dashboard(
            engine,
            schemas,
            host=args.host,
            port=args.port,
            read_only=args.read_only,
            allowed_hosts=args.allowed_hosts,
            backend=args.backend,
            refresh_seconds=args.refresh_seconds,
        )
    return 0
