"""What the sub-commands share: global options, connections, output, errors."""

from __future__ import annotations

import argparse
import difflib
import errno
import json
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from typing import Any, NoReturn

from sqlalchemy import Engine, create_engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from ..backends import PROFILES
from ..errors import shown
from ..migrate import normalise_url
from ..names import DEFAULT_SCHEMA, validate_schema

DEBUG_ENV = "ALKSTORE_DEBUG"
"""Set to ``1`` to print the traceback of a failure before its one-line message."""


def debugging() -> bool:
    """Whether ``ALKSTORE_DEBUG`` asks for tracebacks."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def short_reason(exc: BaseException) -> str:
    """``ExcType: first line``; for a database error, the driver's error without the SQL."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        exc = exc.orig
    lines = str(exc).strip().splitlines()
    return type(exc).__name__ + (f": {lines[0].strip()}" if lines else "")


class _OneLineFormatter(logging.Formatter):
    """``alkstore: warning: message`` on one line (the traceback only when debugging).

    Exceptions among the arguments or attached to the record are shortened to
    :func:`short_reason`: a database error's text would otherwise carry its SQL.
    """

    def format(self, record: logging.LogRecord) -> str:
        args = record.args
        if isinstance(args, tuple):
            args = tuple(short_reason(a) if isinstance(a, BaseException) else a for a in args)
        try:
            text = str(record.msg) % args if args else str(record.msg)
        except (TypeError, ValueError):
            text = record.getMessage()
        message = f"alkstore: {record.levelname.lower()}: {' '.join(text.split())}"
        if record.exc_info and record.exc_info[1] is not None:
            message += f": {short_reason(record.exc_info[1])}"
            if debugging():
                message = self.formatException(record.exc_info) + "\n" + message
        return message


def log_to_stderr(level: int = logging.WARNING) -> None:
    """Library log records as one line each on stderr, unless logging is set up already.

    Without it, Python prints a logged exception's traceback (its "last resort" handler).
    """
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLineFormatter())
    root.addHandler(handler)
    root.setLevel(level)


class CommandError(Exception):
    """A one-line reason for a non-zero exit (1 unless ``code`` says otherwise)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class BadInput(CommandError):
    """The command line or the environment is wrong: exit 2, like a usage error."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 2)


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are exceptions, not ``sys.exit``.

    ``main`` turns them into one line on stderr and exit code 2, like every other
    error of the command line (``--help`` shows the usage). Options are never
    abbreviated (``--prio`` is not ``--priority``: a later option could make it
    mean something else), and a misspelt option, command or choice gets the
    nearest right one as a suggestion.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        # A command's own parser knows its options: an unknown one is said here,
        # with a suggestion, not as the top parser's "unrecognized arguments".
        unknown = [a for a in extras if a.startswith("-") and len(a) > 1 and a != "--"]
        if unknown and self._subparsers is None:
            name = unknown[0].split("=", 1)[0]
            known = [o for a in self._actions for o in a.option_strings]
            self.error(f"unrecognized option {shown(name)}{_did_you_mean(name, known)}")
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        bad = re.search(r"invalid choice: '([^']*)'", message)
        if bad is not None:
            choices = [str(c) for a in self._actions for c in (a.choices or ())]
            hint = _did_you_mean(bad.group(1), choices)
            if hint:  # the suggestion instead of the whole list
                message = re.sub(r" \(choose from .*\)$", "", message) + hint
        raise BadInput(f"{message} (see '{self.prog} --help')")


def _did_you_mean(word: str, candidates: Sequence[str]) -> str:
    near = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean {shown(near[0])}?)" if near else ""


def add_global_options(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """The options every command takes, before or after the command's name."""

    def default(value: Any) -> Any:
        # Leaf parsers must not overwrite what was given before the command name.
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--database-url",
        default=default(os.environ.get("ALKSTORE_DATABASE_URL") or os.environ.get("DATABASE_URL")),
        help="SQLAlchemy or libpq URL (env ALKSTORE_DATABASE_URL, then DATABASE_URL)",
    )
    parser.add_argument(
        "--schema",
        default=default(os.environ.get("ALKSTORE_SCHEMA", DEFAULT_SCHEMA)),
        help="queue schema (env ALKSTORE_SCHEMA; default pgboss)",
    )
    parser.add_argument(
        "--backend",
        default=default(os.environ.get("ALKSTORE_BACKEND") or None),
        choices=list(PROFILES),
        help="database backend profile, as pg-boss's backend option (env ALKSTORE_BACKEND; "
        "default: the engine's dialect settles it, else postgres)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(os.environ.get("ALKSTORE_JSON", "") not in ("", "0")),
        help="machine-readable output (env ALKSTORE_JSON=1)",
    )


def leaf(
    actions: Any, name: str, help: str, aliases: Sequence[str] = ()
) -> argparse.ArgumentParser:
    """A sub-command parser that also accepts the global options."""
    parent = argparse.ArgumentParser(add_help=False)
    add_global_options(parent, suppress=True)
    parser: argparse.ArgumentParser = actions.add_parser(
        name, help=help, parents=[parent], aliases=list(aliases)
    )
    return parser


def server_parser(
    sub: Any,
    name: str,
    help: str,
    *,
    port: int,
    schema_help: str,
    read_only_help: str,
    allowed_host_help: str,
) -> argparse.ArgumentParser:
    """The parser of a command that serves HTTP (``dashboard``, ``api``): the global
    options, a repeatable ``--schema`` (replacing the global one), ``--host``, ``--port``,
    ``--read-only`` and ``--allowed-host``."""
    parent = argparse.ArgumentParser(add_help=False)
    add_global_options(parent, suppress=True)
    p: argparse.ArgumentParser = sub.add_parser(
        name, help=help, parents=[parent], conflict_handler="resolve"
    )
    p.add_argument("--schema", dest="schemas", action="append", metavar="SCHEMA", help=schema_help)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=port, help=f"port (default {port})")
    p.add_argument("--read-only", action="store_true", help=read_only_help)
    p.add_argument(
        "--allowed-host", dest="allowed_hosts", action="append", metavar="NAME",
        help=allowed_host_help,
    )  # fmt: skip
    return p


def cannot_listen(exc: OSError, host: str, port: int, option: str) -> CommandError:
    """The one-line error for a server that could not bind ``host:port``, naming
    the option that chooses another port (exit 1)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return CommandError(f"port {port} is in use on {where}: choose another with {option}")
    reason = exc.strerror or str(exc)
    return CommandError(f"cannot listen on {where} ({option}): {reason}")


def describe_url(url: str | None) -> str | None:
    """``database 'app' on db.example:5432`` for a URL: no user, no password.

    ``None`` if there is no URL or it cannot be parsed (its error is reported elsewhere).
    """
    if not url:
        return None
    try:
        parsed = make_url(normalise_url(url))
    except (ArgumentError, ValueError):
        return None
    host = parsed.host or "the local socket"
    port = f":{parsed.port}" if parsed.port else ""
    return f"database {shown(parsed.database or '(default)')} on {host}{port}"


def schema_of(args: argparse.Namespace) -> str:
    """The ``--schema`` option, validated (a bad name is an InvalidNameError: exit 2)."""
    return validate_schema(args.schema)


@contextmanager
def engine_from(args: argparse.Namespace, **engine_options: Any) -> Iterator[Engine]:
    """An engine for ``--database-url``; a missing or malformed URL is :class:`BadInput`."""
    url = args.database_url
    if not url:
        raise BadInput("no database: pass --database-url or set ALKSTORE_DATABASE_URL")
    try:
        engine = create_engine(normalise_url(url), **engine_options)
    except (ArgumentError, NoSuchModuleError, ValueError, ImportError) as exc:
        raise BadInput(f"bad database URL: {exc}") from None
    try:
        yield engine
    finally:
        engine.dispose()


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in asdict(value).items()}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def emit(args: argparse.Namespace, value: Any, *, columns: Sequence[str] | None = None) -> None:
    """Print ``value``: JSON with ``--json``, else a table (rows) or ``key: value`` lines."""
    plain = _plain(value)
    if args.json:
        json.dump(plain, sys.stdout, default=str, indent=2)
        sys.stdout.write("\n")
    elif isinstance(plain, list):
        print_table(plain, columns)
    elif isinstance(plain, dict):
        width = max((len(k) for k in plain), default=0)
        for key, val in plain.items():
            print(f"{key:<{width}}  {_cell(val)}")
    elif plain is not None:
        print(plain)
    # Each result as soon as it is known (maintain --loop prints one per pass),
    # even when stdout is a pipe.
    sys.stdout.flush()


JSON_CELL_WIDTH = 60
"""Characters of a JSON value (a job's data) a table cell shows, ``…`` marking a cut;
``key: value`` lines and ``--json`` show it whole."""


def _cell(value: Any, *, cut: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        text = json.dumps(value, default=str, ensure_ascii=False)
        if cut and len(text) > JSON_CELL_WIDTH:
            return text[: JSON_CELL_WIDTH - 1] + "…"
        return text
    return str(value)


def print_table(rows: list[Any], columns: Sequence[str] | None) -> None:
    if not rows:
        print("(none)")
        return
    if not isinstance(rows[0], dict):
        for row in rows:
            print(_cell(row))
        return
    cols = list(columns or rows[0].keys())
    cells = [[_cell(r.get(c), cut=True) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())


def parse_json(option: str, text: str | None) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{option} is not valid JSON: {exc}") from None
