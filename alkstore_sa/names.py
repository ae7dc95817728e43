"""Names: validation of schema and queue names and the names derived from them.

Names are checked before anything reaches the database. They are always sent as
bind parameters; the only place a name becomes part of SQL text is DDL, where it
goes through the dialect's identifier quoting.
"""

from __future__ import annotations

import hashlib
import re

from .errors import InvalidNameError

DEFAULT_SCHEMA = "pgboss"
"""The schema Node pg-boss uses by default, and so do we."""

SCHEMA_VERSION = 26
"""The pg-boss schema version this library reads and writes."""

_SCHEMA_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_QUEUE_RE = re.compile(r"[A-Za-z0-9_.:/-]+")
_SCHEMA_MAX = 50
QUEUE_NAME_MAX = 200
"""Longest queue name, in characters; the accepted characters are ASCII, so also in bytes.

Queue names (and ``dead_letter``, which names a queue) enter btree indexes next to
a job's ``singleton_key``: the limits of :mod:`alkstore_sa.limits` leave room for
names this long."""

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
            f"{schema!r} must match ^[A-Za-z_][A-Za-z0-9_]*$ and have at most "
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
            f"{name!r} must be 1 to {QUEUE_NAME_MAX} characters of letters, digits and _ . : / -",
        )
    return name


def partition_table_name(queue: str) -> str:
    """The dedicated partition table of a partitioned queue: ``'j' || sha224(name)``.

    Equal to what the ``create_queue`` SQL function computes, for every name we accept.
    """
    return "j" + hashlib.sha224(queue.encode("utf-8")).hexdigest()


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel on which ``send`` announces new jobs for ``schema``."""
    return f"alkstore_{schema}"
