"""A fresh schema under a backend profile with schema flags (``cockroachdb``, ``yugabytedb``).

pg-boss 12.38 builds its schema differently under five *schema flags* (the "Database
backends" page): ``noTablePartitioning`` makes ``job`` and ``queue_stats`` plain tables
(no ``job_common``, no day partitions, no partition helper functions, ``create_queue``
and ``delete_queue`` without partitions, and an index ``queue_stats_i2`` for retention
by delete); ``noDeferrableConstraints`` makes the two queue foreign keys of ``job``
immediate; ``noCoveringIndexes`` leaves ``INCLUDE`` out of every index;
``inlineTableIndexes`` only changes how CockroachDB is told the same indexes (pg-boss turns
it off on PostgreSQL itself), and ``noAddColumnBackfill`` only what later migrations
may write.

Our revisions build the partitioned schema. :func:`apply` turns a schema they have
just built, with no rows yet, into the one pg-boss builds under the flags, in the
same transaction: ``job`` and ``queue_stats`` are made again as plain tables with the
same columns and defaults, and the constraints and indexes the partitioned schema has on
``job_common`` (the indexes of ``queue_stats``) are made on them, read from the catalog
just built, so each future schema version's indexes follow without a change here.
The tests compare the result with Node pg-boss 12.38's own install under the same profile
(the "Database backends" page).
"""

from __future__ import annotations

import re
from collections.abc import Collection

from sqlalchemy import Connection, text

from ..errors import SchemaProfileError
from ..schema_versions import NEWEST_KNOWN_SCHEMA_VERSION

__all__ = ["apply", "builds_plain"]


_PARTITION_FUNCTIONS = (
    "job_table_format(text, text)",
    "job_table_run(text, text, text)",
    "job_table_run_async(text, integer, text, text, text)",
)

_DEFERRED = " DEFERRABLE INITIALLY DEFERRED"
_INCLUDE = re.compile(r" INCLUDE \([^)]*\)")

_CREATE_QUEUE = """
CREATE OR REPLACE FUNCTION {s}.create_queue(queue_name text, options jsonb)
RETURNS void
LANGUAGE plpgsql
AS $body$
BEGIN
  -- One job table for every queue: no partition to build, and an existing queue is
  -- left exactly as it is.
  INSERT INTO {s}.queue AS q ({columns})
  SELECT {values}
  ON CONFLICT DO NOTHING;
END;
$body$
"""

_DELETE_QUEUE = """
CREATE OR REPLACE FUNCTION {s}.delete_queue(queue_name text)
RETURNS void
LANGUAGE plpgsql
AS $body$
BEGIN
  DELETE FROM {s}.job WHERE name = queue_name;
  DELETE FROM {s}.queue WHERE name = queue_name;
END;
$body$
"""


def builds_plain(flags: Collection[str]) -> bool:
    """Whether a schema built under ``flags`` has plain (unpartitioned) tables."""
    return "noTablePartitioning" in flags


def apply(conn: Connection, schema: str, flags: Collection[str]) -> list[str]:
    """Turn the freshly built, empty ``schema`` into the one pg-boss builds under ``flags``;
    what was done, one line each. Nothing to do without ``noTablePartitioning``: the
    other schema flags only change a plain table's DDL or later migrations."""
    if not builds_plain(flags):
        return []
    s = conn.dialect.identifier_preparer.quote_schema(schema)
    immediate = "noDeferrableConstraints" in flags
    covering = "noCoveringIndexes" not in flags

    def run(sql: str) -> None:
        conn.execute(text(sql))

    def defs(sql: str, table: str) -> list[tuple[str, str]]:
        rows = conn.execute(text(sql), {"t": f"{s}.{table}"})
        return [(str(r[0]), str(r[1])) for r in rows]

    indexes = defs(
        "SELECT c.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x "
        "JOIN pg_class c ON c.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(:t) AND NOT x.indisprimary ORDER BY c.relname",
        "job_common",
    )
    constraints = defs(
        "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
        "WHERE conrelid = to_regclass(:t) AND contype IN ('f', 'c') ORDER BY conname",
        "job_common",
    )
    stats_indexes = defs(
        "SELECT c.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x "
        "JOIN pg_class c ON c.oid = x.indexrelid "
        "WHERE x.indrelid = to_regclass(:t) AND NOT x.indisprimary ORDER BY c.relname",
        "queue_stats",
    )
    held = f"SELECT (SELECT count(*) FROM {s}.job) + (SELECT count(*) FROM {s}.queue)"
    if conn.execute(text(held)).scalar_one():
        # Unreachable through migrate.upgrade, which applies a profile to a schema it has
        # just created; a caller that names a schema in use gets the library's refusal.
        raise SchemaProfileError(
            schema,
            NEWEST_KNOWN_SCHEMA_VERSION,
            "a profile with noTablePartitioning",
            "it already holds queues or jobs, and only a fresh install is rebuilt as plain tables",
        )

    def moved(definition: str, old: str, new: str) -> str:
        # pg_get_indexdef names the index and its table: both move to the plain table.
        out = re.sub(rf"INDEX {old}_", f"INDEX {new}_", definition, count=1)
        # The schema as written there may hold spaces (quoted), never a period.
        out = re.sub(rf" ON (?:ONLY )?([^.]+)\.{old} USING ", rf" ON \1.{new} USING ", out, count=1)
        return out if covering else _INCLUDE.sub("", out)

    done = []
    # job: a plain table with job's columns and defaults, its constraints and indexes.
    run(f"CREATE TABLE {s}.job_plain (LIKE {s}.job INCLUDING DEFAULTS INCLUDING GENERATED)")
    run(f"DROP TABLE {s}.job")  # with job_common, its one partition
    run(f"ALTER TABLE {s}.job_plain RENAME TO job")
    run(f"ALTER TABLE {s}.job ADD PRIMARY KEY (name, id)")
    for name, definition in constraints:
        if name == "cjc":
            continue
        if immediate:
            definition = definition.replace(_DEFERRED, "")
        run(f'ALTER TABLE {s}.job ADD CONSTRAINT "{name}" {definition}')
    for _name, definition in indexes:
        run(moved(definition, "job_common", "job"))
    for signature in _PARTITION_FUNCTIONS:
        run(f"DROP FUNCTION IF EXISTS {s}.{signature}")
    done.append("job: a plain table (noTablePartitioning)")

    # queue_stats: a plain table, kept by deleting old rows (queue_stats_i2).
    run(
        f"CREATE TABLE {s}.queue_stats_plain "
        f"(LIKE {s}.queue_stats INCLUDING DEFAULTS INCLUDING GENERATED)"
    )
    run(f"DROP TABLE {s}.queue_stats")  # with its day partitions
    run(f"ALTER TABLE {s}.queue_stats_plain RENAME TO queue_stats")
    run(f"ALTER TABLE {s}.queue_stats ADD PRIMARY KEY (id)")
    for _name, definition in stats_indexes:
        run(moved(definition, "queue_stats", "queue_stats"))
    run(f"CREATE INDEX queue_stats_i2 ON {s}.queue_stats (captured_on, id)")
    done.append("queue_stats: a plain table (noTablePartitioning)")

    run(_create_queue(conn, s))
    run(_DELETE_QUEUE.format(s=s))
    done.append("create_queue, delete_queue: one job table")
    return done


def _create_queue(conn: Connection, s: str) -> str:
    # The queue row's columns are the partitioned create_queue's (the head version's),
    # with partition false and table_name 'job'.
    from .functions_38_46 import QUEUE_COLUMNS_46

    written = [
        (c, "false" if c == "partition" else "'job'" if c == "table_name" else e)
        for c, e in QUEUE_COLUMNS_46
    ]
    return _CREATE_QUEUE.format(
        s=s,
        columns=", ".join(c for c, _ in written),
        values=", ".join(e.replace("@S@", s) for _, e in written),
    )
