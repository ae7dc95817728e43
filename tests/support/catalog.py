"""A snapshot of everything PostgreSQL's catalog says about one schema, for comparisons.

Two schemas built by different means (Node pg-boss's construction plan, our Alembic
revision, an offline SQL script) are equal for our purposes when their snapshots are
equal. A snapshot is a mapping from a section name (``columns``, ``indexes``, ...) to
lines of text; every occurrence of the schema's own name is replaced by ``<schema>`` so
that two schemas with different names can be compared, and a failing comparison shows
a unified diff of those lines.

Function *bodies* are left out on purpose: ours are our own code and are compared by
behaviour (``tests/test_sql_functions.py``). Everything else about a function (name,
arguments, result, language, volatility, strictness, security, settings) is included.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Mapping
from typing import Any

from sqlalchemy import Connection, Engine, text

Catalog = dict[str, list[str]]

IGNORED_TABLES = frozenset(
    {"alkstore_alembic_version", "alkstore_job_attempt", "alkstore_claim", "alkstore_claimer"}
)
"""Tables of ours that are not part of pg-boss's contract (with their indexes and sequences)."""

_RELATIONS = """
SELECT c.relname, c.relkind, c.relpersistence, c.relispartition,
       pg_get_expr(c.relpartbound, c.oid) AS bound,
       CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END AS partkey,
       c.reloptions,
       (SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent
         WHERE i.inhrelid = c.oid) AS parent,
       t.relname AS owner_table
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_index x ON x.indexrelid = c.oid
  LEFT JOIN pg_class t ON t.oid = x.indrelid
 WHERE n.nspname = :schema
"""

_COLUMNS = """
SELECT c.relname, a.attname,
       row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum) AS position,
       format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull,
       pg_get_expr(d.adbin, d.adrelid) AS "default", a.attidentity, a.attgenerated,
       a.attcollation <> 0 AND a.attcollation <> t.typcollation AS own_collation,
       a.attislocal, a.attinhcount
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_type t ON t.oid = a.atttypid
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
 WHERE n.nspname = :schema AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
   AND a.attnum > 0 AND NOT a.attisdropped
"""

_CONSTRAINTS = """
SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid) AS definition,
       k.conislocal, k.coninhcount, p.conname AS parent
  FROM pg_constraint k
  JOIN pg_class c ON c.oid = k.conrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_constraint p ON p.oid = k.conparentid
 WHERE n.nspname = :schema
"""

_INDEXES = """
SELECT c.relname AS table_name, i.relname AS index_name,
       pg_get_indexdef(x.indexrelid) AS definition,
       x.indisprimary, x.indisvalid,
       (SELECT p.relname FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent
         WHERE h.inhrelid = i.oid) AS parent
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_class c ON c.oid = x.indrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :schema
"""

_TYPES = """
SELECT t.typname, t.typtype,
       (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
          FROM pg_enum e WHERE e.enumtypid = t.oid) AS labels
  FROM pg_type t
  JOIN pg_namespace n ON n.oid = t.typnamespace
  LEFT JOIN pg_class r ON r.oid = t.typrelid
 WHERE n.nspname = :schema
   AND t.typtype <> 'c'                                     -- row types of tables
   AND NOT (t.typcategory = 'A' AND t.typelem <> 0          -- their array types
            AND EXISTS (SELECT 1 FROM pg_type e
                         WHERE e.oid = t.typelem AND e.typtype = 'c'))
"""

_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args,
       pg_get_function_result(p.oid) AS result, l.lanname, p.prokind, p.provolatile,
       p.proisstrict, p.prosecdef, p.proparallel, p.proconfig
  FROM pg_proc p
  JOIN pg_namespace n ON n.oid = p.pronamespace
  JOIN pg_language l ON l.oid = p.prolang
 WHERE n.nspname = :schema
"""

_TRIGGERS = """
SELECT c.relname, g.tgname, pg_get_triggerdef(g.oid) AS definition
  FROM pg_trigger g
  JOIN pg_class c ON c.oid = g.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :schema AND NOT g.tgisinternal
"""


def _ignored(name: str | None, ignore: Collection[str]) -> bool:
    return name is not None and any(name == t or name.startswith(t + "_") for t in ignore)


def snapshot(
    bind: Engine | Connection, schema: str, ignore: Collection[str] = IGNORED_TABLES
) -> Catalog:
    """The catalog facts of ``schema`` as sorted lines per section.

    Objects of the tables in ``ignore`` (and those tables) are left out.
    """
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return snapshot(conn, schema, ignore)
    conn = bind
    quoted = conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
    own_name = re.compile(r'(?<![\w"])' + re.escape(quoted) + r"\.")

    def rows(sql: str) -> list[Any]:
        return list(conn.execute(text(sql), {"schema": schema}).mappings())

    def norm(value: object) -> str:
        return "-" if value is None else own_name.sub("<schema>.", str(value))

    exists = conn.execute(
        text("SELECT count(*) FROM pg_namespace WHERE nspname = :schema"), {"schema": schema}
    ).scalar_one()
    catalog: Catalog = {"schema": [f"exists={bool(exists)}"]}

    catalog["relations"] = sorted(
        f"{r.relname} kind={r.relkind} persistence={r.relpersistence} "
        f"partition={r.relispartition} bound={norm(r.bound)} partkey={norm(r.partkey)} "
        f"options={norm(r.reloptions)} parent={norm(r.parent)}"
        for r in rows(_RELATIONS)
        if not _ignored(r.relname, ignore) and not _ignored(r.owner_table, ignore)
    )
    columns = sorted(
        (r.relname, r.position, r) for r in rows(_COLUMNS) if not _ignored(r.relname, ignore)
    )
    catalog["columns"] = [
        f"{name}.{r.attname} #{pos} {norm(r.type)} notnull={r.attnotnull} "
        f"default={norm(r.default)} identity={r.attidentity or '-'} "
        f"generated={r.attgenerated or '-'} collation={r.own_collation} "
        f"local={r.attislocal} inherited={r.attinhcount}"
        for name, pos, r in columns
    ]
    catalog["constraints"] = sorted(
        f"{r.relname}: {r.conname} ({r.contype}) {norm(r.definition)} local={r.conislocal} "
        f"inherited={r.coninhcount} parent={norm(r.parent)}"
        for r in rows(_CONSTRAINTS)
        if not _ignored(r.relname, ignore)
    )
    catalog["indexes"] = sorted(
        f"{r.index_name}: {norm(r.definition)} primary={r.indisprimary} valid={r.indisvalid} "
        f"parent={norm(r.parent)}"
        for r in rows(_INDEXES)
        if not _ignored(r.table_name, ignore)
    )
    catalog["types"] = sorted(f"{r.typname} ({r.typtype}) {norm(r.labels)}" for r in rows(_TYPES))
    catalog["functions"] = sorted(
        f"{r.proname}({norm(r.args)}) returns {norm(r.result)} language={r.lanname} "
        f"kind={r.prokind} volatile={r.provolatile} strict={r.proisstrict} "
        f"secdef={r.prosecdef} parallel={r.proparallel} config={norm(r.proconfig)}"
        for r in rows(_FUNCTIONS)
    )
    catalog["triggers"] = sorted(
        f"{r.relname}: {r.tgname} {norm(r.definition)}"
        for r in rows(_TRIGGERS)
        if not _ignored(r.relname, ignore)
    )
    has_version = conn.execute(
        text("SELECT to_regclass(quote_ident(:schema) || '.version') IS NOT NULL"),
        {"schema": schema},
    ).scalar_one()
    catalog["version"] = (
        sorted(str(tuple(r)) for r in conn.execute(text(f"SELECT * FROM {quoted}.version")))
        if has_version
        else []
    )
    return catalog


_DAY_PARTITION = re.compile(r"\bqueue_stats_\d{8}")
_TIMESTAMP = re.compile(r"'\d{4}-\d{2}-\d{2}[^']*'")
_POSITION = re.compile(r" #\d+ ")


def structural(catalog: Mapping[str, list[str]], *, column_order: bool = True) -> Catalog:
    """The shape of a schema, without what depends on the day or on history.

    - ``queue_stats`` day partitions (pg-boss names them after the UTC day they hold,
      and creates them for the day it installs or migrates) read ``queue_stats_<day>``,
      and their bounds ``'<day>'``;
    - the ``version`` section keeps the version number only (the other columns are
      timestamps of pg-boss's background passes);
    - without ``column_order``, column positions are dropped: pg-boss's construction
      plan declares columns where a migration had to append them.
    """
    shaped: Catalog = {}
    for section, lines in catalog.items():
        out = []
        for line in lines:
            line = _DAY_PARTITION.sub("queue_stats_<day>", line)
            if section == "relations":
                line = _TIMESTAMP.sub("'<day>'", line)
            if section == "version":
                line = line.split(",")[0].lstrip("(").rstrip(")")
            if section == "columns" and not column_order:
                line = _POSITION.sub(" ", line)
            out.append(line)
        shaped[section] = sorted(out)
    return shaped


def sections_without(catalog: Mapping[str, list[str]], *names: str) -> Catalog:
    """``catalog`` without the named sections."""
    return {k: list(v) for k, v in catalog.items() if k not in names}


def bam_rows(bind: Engine | Connection, schema: str) -> list[tuple[str, int, str, str | None]]:
    """``(name, version, status, table_name)`` of every row of ``<schema>.bam``, sorted.

    pg-boss's background-migration queue; empty when the table does not exist.
    """
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return bam_rows(conn, schema)
    exists = bind.execute(
        text("SELECT to_regclass(quote_ident(:s) || '.bam') IS NOT NULL"), {"s": schema}
    ).scalar_one()
    if not exists:
        return []
    quoted = bind.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
    found = bind.execute(
        text(f"SELECT name, version, status, table_name FROM {quoted}.bam ORDER BY 1, 2, 4, 3")
    )
    return [(r[0], int(r[1]), str(r[2]), r[3]) for r in found]


def render(catalog: Mapping[str, list[str]]) -> list[str]:
    """One line per fact, prefixed by its section, in a stable order."""
    return [f"[{section}] {line}" for section in sorted(catalog) for line in catalog[section]]


def diff(
    expected: Mapping[str, list[str]],
    actual: Mapping[str, list[str]],
    labels: tuple[str, str] = ("expected", "actual"),
) -> str:
    """A unified diff of two snapshots; empty when they are equal."""
    return "\n".join(
        difflib.unified_diff(
            render(expected), render(actual), fromfile=labels[0], tofile=labels[1], lineterm="", n=1
        )
    )


def assert_same(
    expected: Mapping[str, list[str]],
    actual: Mapping[str, list[str]],
    labels: tuple[str, str] = ("expected", "actual"),
) -> None:
    """Fail with a readable diff unless the two snapshots are equal."""
    found = diff(expected, actual, labels)
    assert not found, "catalogs differ:\n" + found


def object_count(
    bind: Engine | Connection, schema: str, ignore: Collection[str] = IGNORED_TABLES
) -> int:
    """How many relations, types and functions ``schema`` holds, outside ``ignore``."""
    snap = snapshot(bind, schema, ignore)
    return len(snap["relations"]) + len(snap["types"]) + len(snap["functions"])
