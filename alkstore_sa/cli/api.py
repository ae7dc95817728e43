"""``alkstore api``: the HTTP API (the "HTTP API" page).

Serves :func:`alkstore_sa.api.create_app` with uvicorn until Ctrl-C. Its bearer tokens
come from the environment only (never the command line, where other users could read
them): ``ALKSTORE_API_TOKENS``, comma-separated. A host other than a loopback address
needs them.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType
from typing import Any

from .._hosts import is_loopback, listen
from ..names import validate_schema
from ._common import BadInput, CommandError, cannot_listen, engine_from, server_parser

TOKENS_ENV = "ALKSTORE_API_TOKENS"
DEFAULT_PORT = 8766


def register(sub: Any) -> None:
    p = server_parser(
        sub,
        "api",
        "serve the HTTP API (needs the api extra)",
        port=DEFAULT_PORT,
        schema_help="a queue schema to serve (the first at /api, each at /s/SCHEMA/api); "
        "repeat for more (default: the global --schema)",
        read_only_help="refuse every operation that writes",
        allowed_host_help="a Host name answered besides loopback ones (repeatable; '*' for any)",
    )
    p.add_argument(
        "--supervise",
        action="store_true",
        help="also run supervision (expiry, retention, cron) for the schemas served",
    )
    p.set_defaults(handler=_run)


def api_package() -> ModuleType:
    """``alkstore_sa.api``, or a :class:`CommandError` naming the extra it needs."""
    try:
        from .. import api
    except ImportError as exc:
        raise CommandError(
            f"the HTTP API needs its extra: pip install 'alkstore_sa[api]' ({exc})"
        ) from None
    return api


def tokens_from_env() -> list[str] | None:
    """The bearer tokens of ``ALKSTORE_API_TOKENS`` (comma-separated), or ``None``."""
    raw = os.environ.get(TOKENS_ENV, "")
    tokens = [t.strip() for t in raw.split(",") if t.strip()]
    return tokens or None


def _run(args: argparse.Namespace) -> int:
    schemas = [validate_schema(s) for s in (args.schemas or [args.schema])]
    if not 1 <= args.port <= 65535:
        raise BadInput("--port must be between 1 and 65535")
    tokens = tokens_from_env()
    # Before connecting: an unauthenticated public bind is refused at once.
    if tokens is None and not is_loopback(args.host):
        raise BadInput(
            f"refusing to serve the API on {args.host} without tokens: set {TOKENS_ENV} "
            "(comma-separated bearer tokens) or bind to 127.0.0.1"
        )
    api = api_package()
    import uvicorn

    with engine_from(args) as engine:
        app = api.create_app(
            engine,
            schemas=schemas,
            auth=tokens,
            read_only=args.read_only,
            allowed_hosts=args.allowed_hosts,
            backend=args.backend,
            supervise=args.supervise,
        )
        bare = args.host.strip().strip("[]")
        try:
            sock = listen(bare, args.port)
        except OSError as exc:
            raise cannot_listen(exc, bare, args.port, "--port") from None
        shown = f"[{bare}]" if ":" in bare else bare
        print(
            f"HTTP API on http://{shown}:{args.port}/api (docs at /docs; Ctrl-C to stop)",
            file=sys.stderr,
        )
        with sock:
            uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
    return 0
