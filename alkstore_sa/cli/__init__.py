"""The ``alkstore`` command line: thin wrappers over importable functions.

Every sub-command lives in its own module with a ``register(subparsers)``
function. Global options have environment variables: ``--database-url``
(``ALKSTORE_DATABASE_URL``, then ``DATABASE_URL``), ``--schema``
(``ALKSTORE_SCHEMA``), ``--json`` (``ALKSTORE_JSON=1``).

Commands raise; :func:`main` alone decides what the user sees and the exit code
(the "`alkstore` command line" page, "Output and exit codes"): one line on stderr per error,
2 for bad input, 1 for failures, 130 when interrupted, 141 when stdout was
closed early. ``ALKSTORE_DEBUG=1`` adds the traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import traceback
from collections.abc import Sequence

from alembic.util import CommandError as AlembicCommandError
from sqlalchemy.exc import DBAPIError

from .._version import __version__
from ..errors import AlkstoreError, InvalidOptionsError
from . import api, dashboard, db, demo, flow, jobs, maintain, observe, queue, schedule, send, worker
from ._common import (
    DEBUG_ENV,
    CommandError,
    Parser,
    add_global_options,
    debugging,
    describe_url,
)

COMMANDS = (db, queue, send, flow, jobs, schedule, worker, maintain, observe, dashboard, api, demo)
"""The sub-command modules, in the order ``alkstore --help`` lists them."""

EXIT_FAILURE = 1
"""The command could not be done: database unreachable, schema missing, unknown queue..."""
EXIT_USAGE = 2
"""The command line (or an environment variable standing for an option) is wrong."""
EXIT_INTERRUPTED = 130
"""Ctrl-C: 128 + SIGINT, as a shell reports a program killed by it."""
EXIT_BROKEN_PIPE = 141
"""stdout was closed early (``| head -1``): 128 + SIGPIPE, as for other Unix tools."""


def build_parser() -> argparse.ArgumentParser:
    """The ``alkstore`` parser, with every sub-command."""
    parser = Parser(
        prog="alkstore",
        description="PostgreSQL job queue for SQLAlchemy, schema-compatible with pg-boss.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"alkstore {__version__}",
        help="print the version of alkstore_sa and exit",
    )
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alkstore`` console script; returns the exit code."""
    try:
        try:
            return _dispatch(argv)
        finally:
            # Buffered output to a pipe is written here, while a closed pipe can still
            # be handled, not at interpreter shutdown ("Exception ignored ...").
            sys.stdout.flush()
    except BrokenPipeError:
        _detach_stdout()
        return EXIT_BROKEN_PIPE


def _dispatch(argv: Sequence[str] | None) -> int:
    args: argparse.Namespace | None = None
    try:
        args = build_parser().parse_args(argv)
        return int(args.handler(args) or 0)
    except BrokenPipeError:
        raise
    except KeyboardInterrupt:
        _say("interrupted")
        return EXIT_INTERRUPTED
    except Exception as exc:
        code, message = failure(exc, args)
        if code != EXIT_USAGE and debugging():
            traceback.print_exc()
        _say(f"error: {message}")
        return code


def failure(exc: Exception, args: argparse.Namespace | None = None) -> tuple[int, str]:
    """The exit code and the one-line message for an exception a command raised.

    The one place that maps exception families to exit codes.
    """
    if isinstance(exc, CommandError):
        return exc.code, _one_line(str(exc))
    if isinstance(exc, InvalidOptionsError):  # bad names included
        return EXIT_USAGE, _one_line(str(exc))
    if isinstance(exc, AlkstoreError):
        return EXIT_FAILURE, _one_line(str(exc))
    if isinstance(exc, AlembicCommandError):
        # The only thing of ours Alembic is given is the REVISION argument.
        return EXIT_USAGE, _one_line(f"revision: {exc}")
    if isinstance(exc, DBAPIError):
        reason = _one_line(str(exc.orig if exc.orig is not None else exc))
        if exc.statement is None:  # no statement yet: connecting failed
            reason = reason.removeprefix("connection failed: ")
            where = _where(args)
            return EXIT_FAILURE, f"cannot connect to {where}: {reason}"
        return EXIT_FAILURE, f"database error: {reason}"
    detail = _one_line(str(exc))
    return EXIT_FAILURE, (
        f"unexpected {type(exc).__name__}"
        + (f": {detail}" if detail else "")
        + f" (set {DEBUG_ENV}=1 for the traceback)"
    )


def _where(args: argparse.Namespace | None) -> str:
    # A command whose engine does not come from --database-url (worker) sets
    # ``connected_to`` itself.
    if args is not None:
        known = getattr(args, "connected_to", None) or describe_url(
            getattr(args, "database_url", None)
        )
        if known:
            return str(known)
    return "the database"


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines() if line.strip())


def _say(message: str) -> None:
    # If stderr is gone too, the exit code is all that is left.
    with contextlib.suppress(OSError):
        print(f"alkstore: {message}", file=sys.stderr)


def _detach_stdout() -> None:
    """Point stdout at /dev/null so that the exit flush of what is left cannot fail."""
    # Captured output (no file descriptor) has nothing to flush at exit.
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


if __name__ == "__main__":
    raise SystemExit(main())
