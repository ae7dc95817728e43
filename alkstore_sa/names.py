"""Names: validation of schema and queue names and the names derived from them.

Names are checked before anything reaches the database. They are always sent as
bind parameters; the only place a name becomes part of SQL text is DDL, where it
goes through the dialect's identifier quoting.
"""

from __future__ import annotations

import functools
import hashlib
import re

from .errors import InvalidNameError, shown

# The schema versions are defined at the bottom of the package (errors words its
# advice with them) and named here, where the rest of the package reads them:
# SPOKEN_SCHEMA_VERSIONS is read as ``names.SPOKEN_SCHEMA_VERSIONS`` at every
# schema check, so narrowing it here with ``monkeypatch`` still works.
from .schema_versions import NEWEST_KNOWN_SCHEMA_VERSION as NEWEST_KNOWN_SCHEMA_VERSION
from .schema_versions import SCHEMA_VERSION as SCHEMA_VERSION
from .schema_versions import SPOKEN_SCHEMA_VERSIONS as SPOKEN_SCHEMA_VERSIONS

DEFAULT_SCHEMA = "pgboss"
"""The schema Node pg-boss uses by default, and so do we."""

SCHEMA_RECHECK_SECONDS = 10.0
"""How long a verified schema version is trusted before it is read again.

Workers, supervisors and services of one engine share the answer; when it expires
the next statement re-reads the version, so a schema another client migrated
(Node pg-boss 12.38 started with ``migrate: true``) is noticed within this many
seconds, and at once when a statement fails the way a changed schema makes it fail
(the "Compatibility with pg-boss, and deliberate differences" page, "Live upgrades")."""

_PLAIN_SCHEMA = re.compile(r"[a-z_][a-z0-9_]*")
_SCHEMA_REFUSED = (
    ('"', "a double quote"),
    ("'", "a single quote"),
    ("%", "a percent sign"),
    ("$", "a dollar sign"),
    (".", "a period"),
    ("\\", "a backslash"),
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_QUEUE_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
_SCHEMA_MAX = 50
QUEUE_NAME_MAX = 200
"""Longest queue name, in characters; the accepted characters are ASCII, so also in bytes.

Queue names (and ``dead_letter``, which names a queue) enter btree indexes next to
a job's ``singleton_key``: the limits of :mod:`alkstore_sa.limits` leave room for
names this long."""
QUEUE_REF_MAX = 1000
"""The longest name :func:`queue_ref` addresses (a queue another client made)."""

SEND_IT_QUEUE = "__pgboss__send-it"
"""The internal queue through which cron schedules are fired (shared with Node pg-boss)."""


def validate_schema(schema: object) -> str:
    r"""The schema name as PostgreSQL stores it, if ``schema`` is acceptable; else raise.

    Accepted, as pg-boss 12.38 accepts them: a name in double quotes, taken verbatim
    (``'"Billing Jobs"'`` is the schema ``Billing Jobs``); or a name without quotes, taken
    as written (case kept: ``MyApp`` is the schema ``MyApp``). Either way the name has 1
    to 50 bytes (UTF-8) and none of ``" ' % $ .``, a backslash or a control character, which pg-boss
    refuses too. A name is quoted wherever it reaches SQL.

    Node pg-boss folds an unquoted name to lower case (its ``MyApp`` is the schema
    ``myapp``); such a Node service shares its queues with one given ``myapp`` here, but
    derives its lock keys and notification channel from ``MyApp`` (:func:`schema_key`):
    give both sides a lower-case name or a quoted one (the "Compatibility with pg-boss"
    page).
    """
    if not isinstance(schema, str):
        raise InvalidNameError("schema", f"must be a string, not {type(schema).__name__}")
    quoted = len(schema) > 1 and schema.startswith('"') and schema.endswith('"')
    name = schema[1:-1] if quoted else schema
    problem = _schema_problem(name)
    if problem is not None:
        raise InvalidNameError("schema", f"{shown(schema)} {problem}")
    return name


def _schema_problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if len(name.encode("utf-8", "surrogatepass")) > _SCHEMA_MAX:
        return f"has more than {_SCHEMA_MAX} bytes (PostgreSQL would cut a longer name short)"
    for chars, what in _SCHEMA_REFUSED:
        if any(c in name for c in chars):
            return f"contains {what}, which pg-boss refuses in a schema name too"
    if _CONTROL.search(name) or any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        return "contains a control character or a lone surrogate"
    return None


def schema_key(schema: str) -> str:
    """The text pg-boss derives a schema's advisory lock keys and notification channel
    from, for the schema stored as ``schema``: the name itself when it is a lower-case
    identifier that needs no quotes (``pgboss``), else the name in double quotes, as a
    Node service configured with the quoted name (``'"Billing Jobs"'``) derives them."""
    return schema if _PLAIN_SCHEMA.fullmatch(schema) else f'"{schema}"'


def validate_queue(name: object, option: str = "name") -> str:
    """Return ``name`` if it is an acceptable queue name, else raise.

    Accepted: 1 to 200 of letters, digits and ``_ . : / -``. pg-boss itself accepts
    nearly anything; we are stricter so that names are safe in logs, URLs and shells.
    """
    if not isinstance(name, str):
        raise InvalidNameError(option, f"must be a string, not {type(name).__name__}")
    if not name or len(name) > QUEUE_NAME_MAX or not _QUEUE_RE.fullmatch(name):
        raise InvalidNameError(
            option,
            f"{shown(name)} must be 1 to {QUEUE_NAME_MAX} characters of letters, digits "
            "and _ . : / -",
        )
    return name


def queue_ref(name: object, option: str = "name") -> str:
    """Return ``name`` if it can name an existing queue, else raise.

    Wider than :func:`validate_queue`, which is the rule for the queues we create:
    a queue another client made (pg-boss accepts names longer than 200 characters,
    and a console can write any text) is still addressed, its name a bound
    parameter. Refused: not a string, empty, over :data:`QUEUE_REF_MAX`
    characters, a NUL character (PostgreSQL text cannot hold one), or a lone
    surrogate (it cannot be sent as UTF-8).
    """
    if not isinstance(name, str):
        raise InvalidNameError(option, f"must be a string, not {type(name).__name__}")
    if not name or len(name) > QUEUE_REF_MAX:
        raise InvalidNameError(
            option, f"{shown(name)} must be 1 to {QUEUE_REF_MAX} characters, not {len(name)}"
        )
    if "\x00" in name:
        raise InvalidNameError(option, f"{shown(name)} contains a NUL character")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidNameError(option, f"{shown(name)} contains a lone surrogate") from None
    return name


def partition_table_name(queue: str) -> str:
    """The dedicated partition table of a partitioned queue: ``'j' || sha224(name)``.

    Equal to what the ``create_queue`` SQL function computes, for every name we accept.
    """
    return "j" + hashlib.sha224(queue.encode("utf-8")).hexdigest()


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which ``send`` announces new jobs for ``schema``."""
    return f"alkstore_{schema}"


@functools.cache
def node_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which Node pg-boss 12 announces new jobs of ``schema``.

    ``pgboss_`` and the first 24 hex digits of SHA-224 of the schema name (the
    database name is not part of it); the payload is the queue name. Node sends
    and listens on it for queues created with ``notify``.
    """
    return "pgboss_" + hashlib.sha224(schema_key(schema).encode("utf-8")).hexdigest()[:24]
