"""Which ``bam`` rows our supervisor runs: the trust boundary of the BAM turn.

A ``bam`` row's ``command`` is SQL that the winner of the BAM turn executes as
the supervising role (the "Guarantees" page, "What a bam row can run").
pg-boss's migrations, and Node's ``createQueue`` on a partitioned queue, queue
index builds there; whoever can insert into the table could queue anything else.
So we run a row only when its command is one of those builds: ``CREATE [UNIQUE]
INDEX CONCURRENTLY [IF NOT EXISTS]`` of a job index pg-boss declares (the
``JobIndex`` definitions of our migrations, column for column and predicate for
predicate), named as pg-boss names it, on the row's own job table of this
schema, or the ``DROP INDEX CONCURRENTLY IF EXISTS`` of the retired ``i5``.
Anything else is reported and failed, never run.
"""

from __future__ import annotations

import re

from ..migrations import functions as f26
from ..migrations import functions_38_46 as f46
from ..migrations.helpers import JobIndex

KNOWN_INDEXES: dict[str, tuple[JobIndex, ...]] = {}
for _index in (
    f26.I1,
    f26.I2,
    f26.I3,
    f26.I4,
    f26.I6,
    f26.I7,
    f26.I8,
    f26.I9,
    f46.I5,
    f46.I10,
    # Schema 38 on a server without covering indexes builds i10 without INCLUDE.
    JobIndex(f46.I10.suffix, f46.I10.columns, f46.I10.where, f46.I10.unique),
    f46.I11,
    f46.I12,
    f46.I13,
    f46.I14,
    f46.I15,
    f46.I16,
    f46.I17,
):
    KNOWN_INDEXES.setdefault(_index.suffix, ())
    KNOWN_INDEXES[_index.suffix] += (_index,)
RETIRED_SUFFIXES = frozenset({"i5"})
"""Indexes a pg-boss migration drops through ``bam``."""

_IDENT = r'(?:"(?:[^"]|"")+"|[A-Za-z_][A-Za-z0-9_$]*)'
_CREATE = re.compile(
    rf"CREATE (?P<unique>UNIQUE )?INDEX CONCURRENTLY (?:IF NOT EXISTS )?(?P<index>{_IDENT}) "
    rf"ON (?:ONLY )?(?P<schema>{_IDENT})\.(?P<table>{_IDENT}) ?(?P<tail>\(.*)",
    re.IGNORECASE,
)
_DROP = re.compile(
    rf"DROP INDEX CONCURRENTLY IF EXISTS (?P<schema>{_IDENT})\.(?P<index>{_IDENT})",
    re.IGNORECASE,
)
# job itself is the one job table of a schema built without partitions (noTablePartitioning).
_JOB_TABLE = re.compile(r"job|job_common|j[0-9a-f]{56}")


def _ident(text: str) -> str:
    """An identifier as PostgreSQL reads it: quoted kept, unquoted folded."""
    if text.startswith('"'):
        return text[1:-1].replace('""', '"')
    return text.lower()


def _squeeze(sql: str) -> str:
    """Whitespace runs as one space, none inside parentheses' edges or before a comma."""
    out = " ".join(sql.split())
    out = re.sub(r"\( ", "(", out)
    out = re.sub(r" ([),])", r"\1", out)
    return out.rstrip(";").rstrip()


def _tail(index: JobIndex) -> str:
    tail = f"({index.columns})"
    if index.include:
        tail += f" INCLUDE ({index.include})"
    if index.where:
        tail += f" WHERE {index.where}"
    return _squeeze(tail).casefold()


def built_index(command: str) -> str | None:
    """The index a ``CREATE ... INDEX CONCURRENTLY`` command builds (as PostgreSQL
    reads the name), or ``None`` for any other command (the retired index's drop)."""
    created = _CREATE.fullmatch(_squeeze(command))
    return None if created is None else _ident(created["index"])


def bam_refusal(schema: str, table: str | None, command: str | None) -> str | None:
    """Why the ``bam`` row's ``command`` is not run, or ``None`` when it is one of
    the index builds above on ``table`` (the row's ``table_name``) of ``schema``."""
    if not isinstance(command, str) or not isinstance(table, str):
        return "the row has no command or no table"
    if not _JOB_TABLE.fullmatch(table):
        return f"table {table[:100]!r} is not a job table"
    sql = _squeeze(command)
    created = _CREATE.fullmatch(sql)
    if created is not None:
        if _ident(created["schema"]) != schema or _ident(created["table"]) != table:
            return "the index is not on the row's job table in this schema"
        index = _ident(created["index"])
        suffix = index.removeprefix(f"{table}_")
        known = KNOWN_INDEXES.get(suffix, ()) if index != suffix else ()
        unique = created["unique"] is not None
        tail = _squeeze(created["tail"]).casefold()
        if any(k.unique == unique and _tail(k) == tail for k in known):
            return None
        return f"index {index[:100]!r} is not a pg-boss job index as declared"
    dropped = _DROP.fullmatch(sql)
    if dropped is not None:
        index = _ident(dropped["index"])
        if _ident(dropped["schema"]) == schema and index in {
            f"{table}_{s}" for s in RETIRED_SUFFIXES
        }:
            return None
        return f"dropping {index[:100]!r} is not a pg-boss migration step"
    return "not an index build of a pg-boss migration"


__all__ = ["KNOWN_INDEXES", "RETIRED_SUFFIXES", "bam_refusal", "built_index"]
