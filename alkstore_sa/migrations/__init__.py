"""Alembic revisions for the queue schema, shipped inside the package.

Three ways to run them:

* from your own Alembic environment: add ``alkstore_sa:migrations/versions`` to
  ``version_locations`` and run ``alembic upgrade alkstore@head`` (or ``heads``) for
  pg-boss schema 46, or ``alembic upgrade alkstore@alkstore_0001`` to stay at 26;
* standalone: ``alkstore db upgrade --database-url URL --schema S``
  (see :mod:`alkstore_sa.migrate`);
* offline: ``alembic upgrade alkstore@head --sql`` or ``alkstore db sql``.

The schema comes from :func:`schema_name`.

The ``versions`` folder holds alkstore_sa's revisions and nothing else (their ids
start with ``alkstore_``); :func:`refuse_foreign_revisions` enforces that before any
of them runs.
"""

from __future__ import annotations

import os
import re
import tokenize
from collections.abc import Iterable
from pathlib import Path

from alembic import context
from alembic.util import CommandError, coerce_resource_to_filename

from ..errors import ForeignRevisionError
from ..names import DEFAULT_SCHEMA, validate_schema

BRANCH_LABEL = "alkstore"
"""Branch label carried by every revision; ``alembic upgrade alkstore@head``."""

VERSION_TABLE = "alkstore_alembic_version"
"""Alembic version table used by the standalone environment (inside the target schema)."""

SCHEMA_OPTION = "alkstore_schema"
"""Name of the ``-x`` argument and ``alembic.ini`` main option choosing the schema."""

REVISION_PREFIX = "alkstore_"
"""Every alkstore_sa revision id starts with this (``alkstore_0001``, ...)."""

VERSIONS_DIR = Path(__file__).resolve().with_name("versions")
"""The folder of alkstore_sa's revisions inside the installed package: pg-boss schema
versions 26 to 46, one revision each (``alkstore_0001`` is 26, ``alkstore_00NN`` is N)."""

OUR_VERSION_DIRS = (VERSIONS_DIR,)
"""Every folder of alkstore_sa's revisions; only alkstore_sa's revisions belong there."""

# The files Alembic loads as revisions from a version location (sources only).
_REVISION_FILE = re.compile(r"(?!\.#|__init__).*\.py$")


def schema_name() -> str:
    """The schema the running migration targets.

    Looked up, in order, in ``-x alkstore_schema=NAME``, in
    ``config.attributes["alkstore_schema"]``, in the ``alkstore_schema`` main option of
    the Alembic config, and finally defaults to ``pgboss``.
    """
    x_args = context.get_x_argument(as_dictionary=True)
    value = x_args.get(SCHEMA_OPTION)
    if value is None:
        value = context.config.attributes.get(SCHEMA_OPTION)
    if value is None:
        value = context.config.get_main_option(SCHEMA_OPTION)
    return validate_schema(value or DEFAULT_SCHEMA)


class AlembicForeignRevisionError(ForeignRevisionError, CommandError):
    """:class:`~alkstore_sa.errors.ForeignRevisionError` that is also Alembic's ``CommandError``.

    Raised inside Alembic commands, so that the ``alembic`` command line prints it as
    one ``FAILED:`` line instead of a traceback.
    """


def revision_id(path: str | os.PathLike[str]) -> str | None:
    """The ``revision = "..."`` a revision file declares, read without running it.

    ``None`` if the file does not assign a plain string literal to ``revision`` at top
    level (or cannot be read as Python tokens).

    The file is read as tokens, not parsed into an AST: on CPython 3.11 an
    ``ast.parse`` that a garbage-collection finalizer interrupts with another one (a
    logged traceback formats itself with ``ast.parse``) fails with ``SystemError``.
    """
    try:
        with open(path, "rb") as handle:
            tokens = list(tokenize.tokenize(handle.readline))
    except (SyntaxError, tokenize.TokenError, UnicodeDecodeError):
        return None
    statement: list[tokenize.TokenInfo] = []
    depth = 0  # brackets open in the current statement
    indent = 0  # blocks open: statements inside them are not top level
    for tok in tokens:
        if tok.type == tokenize.INDENT:
            indent += 1
        elif tok.type == tokenize.DEDENT:
            indent -= 1
        elif depth == 0 and (
            tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER) or tok.exact_type == tokenize.SEMI
        ):
            found = _assigned_revision(statement) if indent == 0 else None
            if found is not None:
                return found
            statement = []
        elif tok.type not in (tokenize.NL, tokenize.COMMENT, tokenize.ENCODING):
            if tok.exact_type in _OPENING:
                depth += 1
            elif tok.exact_type in _CLOSING:
                depth -= 1
            statement.append(tok)
    return None


_OPENING = frozenset({tokenize.LPAR, tokenize.LSQB, tokenize.LBRACE})
_CLOSING = frozenset({tokenize.RPAR, tokenize.RSQB, tokenize.RBRACE})
_PLAIN_STRING = re.compile(r"""^[uU]?(?P<q>['"])(?P<text>[^'"\\\n]*)(?P=q)$""")


def _assigned_revision(statement: list[tokenize.TokenInfo]) -> str | None:
    """The text of ``revision = "..."`` or ``revision: <annotation> = "..."``, else ``None``."""
    parts = [tok.string for tok in statement]
    if not parts or parts[0] != "revision" or "=" not in parts:
        return None
    equals = parts.index("=")
    if (equals != 1 and parts[1] != ":") or len(parts) != equals + 2:
        return None
    literal = statement[equals + 1]
    if literal.type != tokenize.STRING:
        return None
    plain = _PLAIN_STRING.match(literal.string)
    return plain.group("text") if plain else None


def foreign_revisions(directory: str | os.PathLike[str] = VERSIONS_DIR) -> list[Path]:
    """The revision files in ``directory`` that are not alkstore_sa's, sorted.

    A file is ours when the revision id it declares starts with ``alkstore_``.
    The files are read as tokens (:func:`revision_id`), never imported.
    """
    folder = Path(directory)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or not _REVISION_FILE.match(path.name):
            continue
        rev = revision_id(path)
        if rev is None or not rev.startswith(REVISION_PREFIX):
            found.append(path)
    return found


def refuse_foreign_revisions(
    locations: Iterable[str | os.PathLike[str]] = OUR_VERSION_DIRS,
) -> None:
    """Raise :class:`AlembicForeignRevisionError` if a location holds a revision not ours.

    ``locations`` are folders or package resources (``alkstore_sa:migrations/versions``),
    as in Alembic's ``version_locations``; the standalone environment runs only our
    revisions, so every one of its locations must hold only ours.
    """
    found: list[Path] = []
    for location in locations:
        loc = os.fspath(location)
        found.extend(foreign_revisions(coerce_resource_to_filename(loc)))
    if not found:
        return
    described = ", ".join(f"{p} (revision {revision_id(p)!r})" for p in found)
    raise AlembicForeignRevisionError(
        f"a revision that is not alkstore_sa's sits in alkstore_sa's versions folder, "
        f"where `alkstore db upgrade` would run it on every database: {described}. "
        "Nothing was run. Move it to your application's own versions folder (if it revises "
        "one of alkstore_sa's revisions, make it your branch's base: down_revision = None, "
        "branch_labels = ('myapp',))",
        tuple(str(p) for p in found),
    )
