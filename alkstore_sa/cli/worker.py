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

from ..errors import AlkstoreError
from ..worker import AsyncWorker, Worker
from ._common import CommandError, guarded, leaf


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
        "--shutdown-timeout",
        type=float,
        default=env("ALKSTORE_SHUTDOWN_TIMEOUT"),
        help="seconds running jobs get to finish on SIGTERM (env ALKSTORE_SHUTDOWN_TIMEOUT)",
    )
    p.add_argument(
        "--log-level",
        default=env("ALKSTORE_LOG_LEVEL", "INFO"),
        help="DEBUG shows every job (env ALKSTORE_LOG_LEVEL; default INFO)",
    )
    p.set_defaults(handler=_run)


def load_worker(spec: str) -> Worker | AsyncWorker:
    """Import ``module:attr`` and return the worker it names (calling it if need be)."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CommandError(f"--app must look like module:attribute, not {spec!r}")
    # Like other app runners: the current directory is importable.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise CommandError(f"cannot import {module_name!r}: {exc}") from None
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise CommandError(f"{module_name!r} has no attribute {attr!r}") from None
    if not isinstance(target, Worker | AsyncWorker) and callable(target):
        target = target()
    if not isinstance(target, Worker | AsyncWorker):
        raise CommandError(f"{spec} is a {type(target).__name__}, not a Worker or AsyncWorker")
    return target


def _run(args: argparse.Namespace) -> int:
    if not args.app:
        raise CommandError("no app: pass --app module:attribute or set ALKSTORE_APP")
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    worker = guarded(lambda: load_worker(args.app))
    queues = args.queues
    if queues is None and os.environ.get("ALKSTORE_QUEUES"):
        queues = [q.strip() for q in os.environ["ALKSTORE_QUEUES"].split(",") if q.strip()]
    try:
        worker.configure(queues=queues, concurrency=args.concurrency)
        if args.shutdown_timeout is not None:
            if args.shutdown_timeout < 0:
                raise CommandError("--shutdown-timeout must be 0 or more seconds")
            worker.shutdown_timeout = args.shutdown_timeout
    except AlkstoreError as exc:
        raise CommandError(str(exc)) from None
    if isinstance(worker, AsyncWorker):
        guarded(lambda: asyncio.run(worker.run()))
    else:
        guarded(worker.run)
    return 0
