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

_SCHEMA_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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
    """Return ``schema`` if it is an acceptable schema name, else raise.

    Accepted: ``^[A-Za-z_][A-Za-z0-9_]*$`` and at most 50 characters, as in pg-boss.
    """
    if not isinstance(schema, str):
        raise InvalidNameError("schema", f"must be a string, not {type(schema).__name__}")
    if not schema or len(schema) > _SCHEMA_MAX or not _SCHEMA_RE.fullmatch(schema):
        raise InvalidNameError(
            "schema",
            f"{shown(schema)} must match ^[A-Za-z_][A-Za-z0-9_]*$ and have at most "
            f"{_SCHEMA_MAX} characters",
        )
    return schema


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
    return "pgboss_" + hashlib.sha224(schema.encode("utf-8")).hexdigest()[:24]
