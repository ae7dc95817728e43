"""The ``alkstore`` command line: thin wrappers over importable functions.

Every sub-command lives in its own module with a ``register(subparsers)``
function. Global options have environment variables: ``--database-url``
(``ALKSTORE_DATABASE_URL``, then ``DATABASE_URL``), ``--schema``
(``ALKSTORE_SCHEMA``), ``--json`` (``ALKSTORE_JSON=1``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from ._common import CommandError, add_global_options

COMMANDS = ("db", "queue", "send", "jobs", "schedule", "worker", "maintain", "demo")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="alkstore",
        description="PostgreSQL job queue for SQLAlchemy, schema-compatible with pg-boss.",
    )
    add_global_options(parser)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``alkstore`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.handler(args)
    except CommandError as exc:
        print(f"alkstore: error: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    raise SystemExit(main())
