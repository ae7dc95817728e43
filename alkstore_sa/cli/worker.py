"""``alkstore worker --app module:attr``: run your application's worker until a signal.

The app attribute is a :class:`~alkstore_sa.Worker` or
:class:`~alkstore_sa.AsyncWorker`, or a callable (no arguments) that returns one;
the worker brings its own engine and schema. SIGINT/SIGTERM stop it gracefully
(a second signal stops at once); the exit code is 0 after a clean stop.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from typing import Any

from ..errors import shown
from ..worker import AsyncWorker, Worker
from ._common import BadInput, CommandError, cannot_listen, describe_url, leaf


def register(sub: Any) -> None:
    env = os.environ.get
    p = leaf(sub, "worker", "run your application's worker until SIGINT/SIGTERM")
    p.description = (
        "Run the Worker or AsyncWorker named by --app until SIGINT/SIGTERM. The worker "
        "brings its own engine and schema; --database-url and --schema do not apply."
    )
    p.add_argument(
        "--app",
        default=env("ALKSTORE_APP"),
        help="module:attribute of a Worker, AsyncWorker or a function returning one "
        "(env ALKSTORE_APP)",
    )
    p.add_argument(
        "--queue",
        dest="queues",
        action="append",
        default=None,
        help="run only this queue's handler; repeatable (env ALKSTORE_QUEUES, comma-separated)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        # A string default goes through ``type`` too, so a bad value is reported
        # by this command only, not when the parser is built.
        default=env("ALKSTORE_CONCURRENCY"),
        help="jobs run at once per queue (env ALKSTORE_CONCURRENCY)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=env("ALKSTORE_PREFETCH"),
        help="jobs claimed ahead of free slots per queue, 0 for none (default four times "
        "the concurrency) (env ALKSTORE_PREFETCH)",
    )
    p.add_argument(
        "--listen-url",
        default=env("ALKSTORE_LISTEN_URL"),
        metavar="URL",
        help="connection string the worker LISTENs on, when its engine goes through a "
        "transaction-pooling PgBouncer: a direct or session-pooled URL (env "
        "ALKSTORE_LISTEN_URL)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=env("ALKSTORE_SHUTDOWN_TIMEOUT"),
        help="seconds running jobs get to finish on SIGTERM (env ALKSTORE_SHUTDOWN_TIMEOUT)",
    )
    p.add_argument(
        "--metrics-port",
        type=_metrics_address,
        default=env("ALKSTORE_METRICS_PORT"),
        metavar="[HOST:]PORT",
        help="serve the worker's Prometheus metrics at http://HOST:PORT/metrics (HOST "
        "defaults to 0.0.0.0; needs the metrics extra) (env ALKSTORE_METRICS_PORT)",
    )
    p.add_argument(
        "--log-level",
        # ``type`` also checks the environment default, which ``choices`` alone would not.
        type=_log_level,
        choices=LOG_LEVELS,
        default=env("ALKSTORE_LOG_LEVEL", "INFO"),
        help="DEBUG shows every job; any case (env ALKSTORE_LOG_LEVEL; default INFO)",
    )
    p.set_defaults(handler=_run)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
"""Accepted by ``--log-level``, in any case."""


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(
            f"invalid choice: {shown(text)} (choose from {', '.join(LOG_LEVELS)}, in any case)"
        )
    return level


def normalise_listen_url(url: str) -> str:
    """``--listen-url`` as libpq takes it: a SQLAlchemy URL's driver suffix dropped."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme.startswith("postgresql+"):
        return "postgresql://" + rest
    return url


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a number of seconds") from None
    if not value >= 0:  # NaN included
        raise argparse.ArgumentTypeError(f"{shown(text)}: must be 0 or more seconds")
    return value


def _metrics_address(text: str) -> tuple[str, int]:
    host, _, port = text.strip().rpartition(":")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not a port or HOST:PORT") from None
    if not 1 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{shown(text)}: the port must be 1 to 65535")
    return host.strip("[]") or "0.0.0.0", number


def _serve_metrics(worker: Worker | AsyncWorker, address: tuple[str, int]) -> None:
    """Start the HTTP server of ``--metrics-port`` for the worker's registry."""
    registry = worker.metrics_registry
    if registry is None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise BadInput(
                "--metrics-port needs prometheus-client: pip install 'alkstore_sa[metrics]'"
            ) from None
        raise BadInput("--metrics-port: the worker was created with metrics=False")
    from ..metrics import serve

    host, port = address
    try:
        serve(port, host, registry)
    except OSError as exc:
        raise cannot_listen(exc, host, port, "--metrics-port") from None
    logging.getLogger("alkstore_sa.worker").info(
        "metrics at http://%s:%d/metrics",
        host,
        port,
        extra={"action": "metrics_serving", "host": host, "port": port},
    )


def load_worker(spec: str) -> Worker | AsyncWorker:
    """Import ``module:attr`` and return the worker it names (calling it if need be)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise BadInput(f"--app must look like module:attribute, not {shown(spec)}")
    # Like other app runners: the current directory is importable.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        if exc.name == module_name:  # the module named by --app is not there
            raise BadInput(f"cannot import {shown(module_name)}: {exc}") from None
        raise CommandError(f"cannot import {shown(module_name)}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise BadInput(f"{shown(module_name)} has no attribute {shown(attr)}") from None
    if not isinstance(target, Worker | AsyncWorker) and callable(target):
        target = target()
    if not isinstance(target, Worker | AsyncWorker):
        raise BadInput(f"{spec} is a {type(target).__name__}, not a Worker or AsyncWorker")
    return target


def _run(args: argparse.Namespace) -> int:
    if not args.app:
        raise BadInput("no app: pass --app module:attribute or set ALKSTORE_APP")
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    worker = load_worker(args.app)
    # The worker's engine is not --database-url: name it if connecting fails.
    args.connected_to = describe_url(worker.engine.url.render_as_string())
    queues = args.queues
    if queues is None and os.environ.get("ALKSTORE_QUEUES"):
        queues = [q.strip() for q in os.environ["ALKSTORE_QUEUES"].split(",") if q.strip()]
    worker.configure(queues=queues, concurrency=args.concurrency, prefetch=args.prefetch)
    if args.shutdown_timeout is not None:
        worker.shutdown_timeout = args.shutdown_timeout
    if args.backend is not None and args.backend != worker.backend.name:
        # The profile chose the worker's statements when the app made it.
        raise BadInput(
            f"--backend {args.backend}, but the app's worker was made for backend "
            f"{worker.backend.name!r}: give backend={args.backend!r} to the Worker in the app"
        )
    if args.listen_url:
        # libpq's form: the listener connects with psycopg, not through SQLAlchemy.
        worker.listen_dsn = normalise_listen_url(args.listen_url)
    if args.metrics_port is not None:
        _serve_metrics(worker, args.metrics_port)
    if isinstance(worker, AsyncWorker):
        asyncio.run(worker.run())
    else:
        worker.run()
    # The library says a clean stop at DEBUG only; this process is the app, and its
    # operator wants to see that the worker ended (the "Logging" page).
    logging.getLogger("alkstore_sa.cli").info(
        "worker %s stopped: %s",
        worker.name,
        "; ".join(
            f"{q}: {c.completed} completed, {c.failed} failed attempt{'' if c.failed == 1 else 's'}"
            for q, c in worker.stats().items()
        ),
        extra={"action": "cli_worker_stopped", "worker": worker.name},
    )
    return 0
