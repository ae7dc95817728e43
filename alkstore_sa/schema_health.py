"""Is a pg-boss schema the schema its version row claims, and is every index usable?

What ``alkstore db check`` reports and ``alkstore db upgrade`` refuses or heals
(the "Wire the migrations into your Alembic environment" page, "Checking and healing a schema"):

- the *expected catalog* of each pg-boss schema version we install (26 to 46): its
  tables and columns, indexes, constraints, functions and enum types. It is a snapshot
  of a fresh ``migrate.upgrade(schema_version=N)`` kept next to this module
  (``schema_catalogs.json``, written by ``tools/gen_catalogs.py``; a test regenerates it
  and compares), so a check reads the live catalog once and needs no scratch schema;
- :func:`diagnose`: the live catalog compared with the one its version row names, plus
  INVALID indexes (an interrupted ``CREATE INDEX CONCURRENTLY`` or ``REINDEX
  CONCURRENTLY``), job-table indexes a background build never made, unfinished ``bam``
  rows, and our Alembic revision against the version row;
- :func:`heal`: rebuilds what :func:`diagnose` marks :attr:`Severity.HEAL`, concurrently.

Each :class:`Finding` is one of three severities. ``REFUSE``: the catalog is not the
version's (something missing, or another version's object present); nothing is written
until an operator looks. ``HEAL``: an index build that did not finish; ``alkstore db
upgrade`` finishes it. ``WARN``: something we do not know (an index a user added on
``job``), listed and left alone.
"""

from __future__ import annotations

import enum
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

from sqlalchemy import Connection, text

from .errors import shown
from .schema_record import (
    LOCK_POLL_SECONDS,
    autocommit,
    installed_version,
    lock_key_sql,
    migration_lock,
    recorded_version,
)

__all__ = [
    "BAM_CLAIM_GRACE_SECONDS",
    "CATALOG_RESOURCE",
    "CORRECTNESS_INDEXES",
    "JOB_COMMON",
    "LOCK_POLL_SECONDS",
    "SCHEMA_PLACEHOLDER",
    "Catalog",
    "Diagnosis",
    "Finding",
    "Severity",
    "diagnose",
    "expected_catalog",
    "heal",
    "job_indexes",
    "known_versions",
    "lock_key_sql",
    "migration_lock",
    "partition_indexes",
    "profile_catalogs",
    "read_catalog",
    "shape",
    "unfinished_builds",
    "unshape",
]

log = logging.getLogger(__name__)

CATALOG_RESOURCE = "schema_catalogs.json"
"""The expected catalogs, one per schema version, in this package."""

JOB_COMMON = "job_common"
SCHEMA_PLACEHOLDER = "<schema>"

CORRECTNESS_INDEXES: Mapping[str, str] = {
    "i13": "upsert by key (one queued upsert per key: without it an upsert can insert a "
    "second job instead of updating the first)",
    "i8": "key_strict_fifo (one active, retrying or failed job per key: without it two jobs "
    "of one key can run at once)",
}
"""Job-table index suffixes whose absence changes results, not just speed (pg-boss 12.38
names these two; the other unique job indexes keep the singleton, stately, exclusive and
throttled jobs single, and are reported as needed for correctness too)."""


class Severity(enum.Enum):
    """How :func:`diagnose` rates a :class:`Finding`."""

    REFUSE = "refuse"
    """The catalog is not its version's: ``db upgrade`` refuses and changes nothing."""
    HEAL = "heal"
    """An unfinished or broken index build: ``db upgrade`` rebuilds it."""
    WARN = "warn"
    """Something we do not know about, left alone."""


@dataclass(frozen=True)
class Finding:
    """One difference between a schema and what its version should be."""

    severity: Severity
    kind: str
    """``missing table``, ``invalid index``, ``unfinished build``, ``extra index``..."""
    name: str
    """The object: ``job_common_i13``, ``queue.retained_count``, ``job_now()``..."""
    table: str | None = None
    """The table an index or column belongs to."""
    detail: str = ""
    """What differs, what the index is for, and what to do."""
    queue: str | None = None
    """The queue whose own job table :attr:`table` is (partitioned queues only)."""

    def __str__(self) -> str:
        where = f" on {self.table}" if self.table and self.kind.endswith("index") else ""
        if self.queue is not None:
            where += f" (queue {shown(self.queue)})"
        return f"{self.kind} {self.name}{where}" + (f": {self.detail}" if self.detail else "")

    def as_dict(self) -> dict[str, Any]:
        """The finding as plain values (``--json``)."""
        return {
            "severity": self.severity.value,
            "kind": self.kind,
            "name": self.name,
            "table": self.table,
            "detail": self.detail,
            "queue": self.queue,
        }


@dataclass(frozen=True)
class Diagnosis:
    """What :func:`diagnose` found in one schema."""

    schema: str
    version: int | None
    """The pg-boss version row (``None``: not installed; ``-1``: a table without a row)."""
    recorded: int | None
    """The schema version our Alembic revision records (``None``: none recorded)."""
    findings: tuple[Finding, ...] = ()
    closest: int | None = None
    """With refusals: the schema version whose catalog differs least from the live one."""
    profile: str = "postgres"
    """The backend profile whose catalog the schema was compared with: ``postgres``, or one
    whose plain tables (``noTablePartitioning``) the schema has."""

    def of(self, severity: Severity) -> list[Finding]:
        """The findings of one severity."""
        return [f for f in self.findings if f.severity is severity]

    @property
    def refusals(self) -> list[Finding]:
        """Differences that make ``db upgrade`` refuse."""
        return self.of(Severity.REFUSE)

    @property
    def to_heal(self) -> list[Finding]:
        """Unfinished index builds ``db upgrade`` finishes."""
        return self.of(Severity.HEAL)

    @property
    def warnings(self) -> list[Finding]:
        """Unknown objects, left alone."""
        return self.of(Severity.WARN)


# --------------------------------------------------------------------------- catalogs


@dataclass
class Catalog:
    """The pg-boss objects of one schema, its own name replaced by ``<schema>``.

    Job partition tables other than ``job_common`` and the day partitions of
    ``queue_stats`` are not listed; :attr:`partitions` maps each job partition to its
    indexes, written as if the table were ``job_common``.
    """

    tables: dict[str, dict[str, str]] = field(default_factory=dict)
    """table -> column -> ``type`` or ``type not null``."""
    indexes: dict[str, list[str]] = field(default_factory=dict)
    """index -> ``[table, definition]``."""
    constraints: dict[str, str] = field(default_factory=dict)
    """``table.constraint`` -> definition."""
    functions: list[str] = field(default_factory=list)
    """``name(identity arguments)``."""
    types: dict[str, str] = field(default_factory=dict)
    """enum type -> its labels, comma separated."""
    partitions: dict[str, dict[str, str]] = field(default_factory=dict)
    """job partition -> index suffix -> its :func:`shape` (live only)."""
    invalid: dict[str, list[str]] = field(default_factory=dict)
    """INVALID index -> ``[table, definition, relkind of the table]`` (live only)."""
    policies: dict[str, str] = field(default_factory=dict)
    """job partition -> the policy of its queue (live only)."""
    queues: dict[str, str] = field(default_factory=dict)
    """job partition -> the name of its queue (live only)."""

    def as_json(self) -> dict[str, Any]:
        """The parts kept in ``schema_catalogs.json``."""
        return {
            "tables": self.tables,
            "indexes": self.indexes,
            "constraints": self.constraints,
            "functions": self.functions,
            "types": self.types,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Catalog:
        """A catalog read back from :meth:`as_json`."""
        return cls(
            tables={t: dict(c) for t, c in data["tables"].items()},
            indexes={i: list(v) for i, v in data["indexes"].items()},
            constraints=dict(data["constraints"]),
            functions=list(data["functions"]),
            types=dict(data["types"]),
        )


OWN_PREFIX = "alkstore_"
"""Tables of ours in the schema (the revision table, the attempt history) start with this;
the catalog read here, like pg-boss's drift check, sets them aside."""

_TABLES = """
SELECT c.relname, c.relkind,
       (SELECT p.relname FROM pg_inherits h JOIN pg_class p ON p.oid = h.inhparent
         WHERE h.inhrelid = c.oid) AS parent
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :schema AND c.relkind IN ('r', 'p')
"""

_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod) AS type, a.attnotnull
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :schema AND c.relkind IN ('r', 'p') AND a.attnum > 0
   AND NOT a.attisdropped
"""

_INDEXES = """
SELECT i.relname AS name, t.relname AS "table", t.relkind, x.indisvalid AS valid,
       pg_get_indexdef(x.indexrelid) AS definition
  FROM pg_index x
  JOIN pg_class i ON i.oid = x.indexrelid
  JOIN pg_class t ON t.oid = x.indrelid
  JOIN pg_namespace n ON n.oid = i.relnamespace
 WHERE n.nspname = :schema
"""

_CONSTRAINTS = """
SELECT c.relname, k.conname, pg_get_constraintdef(k.oid) AS definition
  FROM pg_constraint k
  JOIN pg_class c ON c.oid = k.conrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :schema
   -- PostgreSQL 18 keeps NOT NULL as a constraint row too; a column's nullability is
   -- compared with the columns, so these rows would only repeat it.
   AND k.contype <> 'n'
"""

_FUNCTIONS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid) AS args
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :schema
"""

_TYPES = """
SELECT t.typname, string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder) AS labels
  FROM pg_type t
  JOIN pg_namespace n ON n.oid = t.typnamespace
  JOIN pg_enum e ON e.enumtypid = t.oid
 WHERE n.nspname = :schema
 GROUP BY t.typname
"""


def read_catalog(conn: Connection, schema: str) -> Catalog:
    """The live catalog of ``schema`` (a handful of catalog queries, no writes)."""
    quoted = conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
    own = re.compile(r'(?<![\w"])' + re.escape(quoted) + r"\.")

    def norm(value: str) -> str:
        return own.sub(SCHEMA_PLACEHOLDER + ".", value)

    def rows(sql: str) -> list[Any]:
        return list(conn.execute(text(sql), {"schema": schema}))

    kept: set[str] = set()
    job_partitions: set[str] = set()
    for name, _kind, parent in rows(_TABLES):
        if name.startswith(OWN_PREFIX) or parent == "queue_stats":
            continue  # ours (the revision table, the attempt history), or a stats day
        if parent == "job" and name != JOB_COMMON:
            job_partitions.add(name)
            continue
        kept.add(name)
    found = Catalog()
    for table, column, type_, notnull in rows(_COLUMNS):
        if table in kept:
            found.tables.setdefault(table, {})[column] = norm(type_) + (
                " not null" if notnull else ""
            )
    found.partitions = {t: {} for t in job_partitions}
    for name, table, relkind, valid, definition in rows(_INDEXES):
        if definition is None:
            continue  # dropped while this was read (a concurrent build's leftover)
        if not valid:
            found.invalid[name] = [table, norm(definition), relkind]
        if table in kept:
            found.indexes[name] = [table, norm(definition)]
        elif table in job_partitions and name.startswith(table + "_"):
            suffix = name[len(table) + 1 :]
            found.partitions[table][suffix] = shape(norm(definition), name, table)
    if job_partitions and "queue" in kept:
        for table, policy, queue in conn.execute(
            text(f"SELECT table_name, policy, name FROM {quoted}.queue WHERE partition")
        ):
            if table in job_partitions:
                found.policies[str(table)] = str(policy)
                found.queues[str(table)] = str(queue)
    found.constraints = {
        f"{table}.{name}": norm(definition)
        for table, name, definition in rows(_CONSTRAINTS)
        if table in kept
    }
    found.functions = sorted({f"{name}({norm(args)})" for name, args in rows(_FUNCTIONS)})
    found.types = {name: labels for name, labels in rows(_TYPES)}
    return found


def shape(definition: str, name: str, table: str) -> str:
    """An index definition without its name, as if its table were ``job_common``.

    What two job tables' indexes of one kind have in common (pg-boss names each
    ``<table>_<suffix>``; at schema 26 ``job_common``'s are ``job_<suffix>``).
    """
    return definition.replace(f"INDEX {name} ON ", "INDEX ON ", 1).replace(
        f"{SCHEMA_PLACEHOLDER}.{table} ", f"{SCHEMA_PLACEHOLDER}.{JOB_COMMON} ", 1
    )


def unshape(shaped: str, name: str, table: str) -> str:
    """:func:`shape` undone: the definition of index ``name`` on ``table``."""
    return shaped.replace("INDEX ON ", f"INDEX {name} ON ", 1).replace(
        f"{SCHEMA_PLACEHOLDER}.{JOB_COMMON} ", f"{SCHEMA_PLACEHOLDER}.{table} ", 1
    )


_POLICY = re.compile(r"\(policy = '([^']+)'::text\)")


def _policy_of(definition: str) -> str | None:
    """The queue policy an index is limited to (``None``: every job table has it)."""
    found = _POLICY.search(definition)
    return None if found is None else found.group(1)


def _job_suffix(index: str) -> str | None:
    # The primary key is a constraint: not rebuilt as an index, so not a job index here.
    for prefix in (JOB_COMMON + "_", "job_"):
        if index.startswith(prefix) and index != f"{JOB_COMMON}_pkey":
            return index[len(prefix) :]
    return None


def job_indexes(catalog: Catalog) -> dict[str, tuple[str, str]]:
    """``job_common``'s indexes in ``catalog``: suffix -> (name, definition)."""
    out = {}
    for name, (table, definition) in catalog.indexes.items():
        suffix = _job_suffix(name)
        if table == JOB_COMMON and suffix is not None:
            out[suffix] = (name, definition)
    return out


def partition_indexes(catalog: Catalog, policy: str | None) -> dict[str, str]:
    """What a job partition of a queue with ``policy`` should have: suffix -> shape."""
    return {
        suffix: shape(definition, name, JOB_COMMON)
        for suffix, (name, definition) in job_indexes(catalog).items()
        if _policy_of(definition) in (None, policy)
    }


@cache
def _raw() -> dict[str, Any]:
    raw = resources.files(__package__).joinpath(CATALOG_RESOURCE).read_text("utf-8")
    return dict(json.loads(raw))


@cache
def _expected_all() -> dict[int, Catalog]:
    return {int(v): Catalog.from_json(data) for v, data in _raw()["versions"].items()}


@cache
def _expected_profiles() -> dict[int, dict[str, Catalog]]:
    return {
        int(v): {name: Catalog.from_json(data) for name, data in by_profile.items()}
        for v, by_profile in _raw().get("profiles", {}).items()
    }


def expected_catalog(version: int, profile: str = "postgres") -> Catalog | None:
    """The catalog a fresh install of pg-boss schema ``version`` has under the backend
    ``profile`` (``None`` if unknown). Only profiles whose schema differs have their own:
    ``cockroachdb`` and ``yugabytedb`` at 46."""
    if profile == "postgres":
        return _expected_all().get(version)
    return _expected_profiles().get(version, {}).get(profile)


def profile_catalogs(version: int) -> dict[str, Catalog]:
    """The catalogs of ``version`` under the profiles whose schema is not PostgreSQL's."""
    return dict(_expected_profiles().get(version, {}))


def known_versions() -> list[int]:
    """The schema versions with an expected catalog."""
    return sorted(_expected_all())


# --------------------------------------------------------------------------- diagnosis


def _purpose(version: int, suffix: str | None, definition: str) -> str:
    unique = " UNIQUE INDEX " in f" {definition}"
    if suffix is not None and unique and suffix in CORRECTNESS_INDEXES:
        return f"needed for correctness at {version}: {CORRECTNESS_INDEXES[suffix]}"
    if unique:
        return "needed for correctness: a unique index that keeps jobs of one key single"
    return "speed only (queries run without it, more slowly)"


def _compare(live: Catalog, want: Catalog, version: int) -> list[Finding]:
    """Differences of ``live`` from ``want``, rated; without INVALID and ``bam`` ones."""
    others = _known_elsewhere(version)
    return [
        *_table_findings(live, want, version, others),
        *_index_findings(live, want, version, others),
        *_partition_findings(live, want, version, others),
        *_constraint_findings(live, want, version, others),
        *_function_findings(live, want, version, others),
        *_type_findings(live, want),
    ]


def _extra(
    live: Catalog, version: int, kind: str, name: str, known: set[str], table: str | None = None
) -> Finding:
    """An object ``live`` has and ``version`` does not: an index of another version on
    a job table is healed (dropped), any other object of another version refused, and
    one of no version we know left alone."""
    if (
        name in known
        and kind == "extra index"
        and (table == JOB_COMMON or table in live.partitions)
    ):
        detail = (
            f"an index of another pg-boss schema version, not of {version} (left by an "
            "unfinished migration): `alkstore db upgrade` drops it"
        )
        return Finding(Severity.HEAL, kind, name, table, detail)
    if name in known:
        return Finding(
            Severity.REFUSE,
            kind,
            name,
            table,
            f"an object of another schema version, not of {version}",
        )
    return Finding(
        Severity.WARN, kind, name, table, f"not part of pg-boss schema {version}; left alone"
    )


def _table_findings(
    live: Catalog, want: Catalog, version: int, others: Mapping[str, set[str]]
) -> list[Finding]:
    """Tables and columns: missing or different ones refused, extra ones as :func:`_extra`."""
    out: list[Finding] = []
    R = Severity.REFUSE
    for table, columns in want.tables.items():
        have = live.tables.get(table)
        if have is None:
            out.append(Finding(R, "missing table", table, table))
            continue
        for column, type_ in columns.items():
            if column not in have:
                out.append(Finding(R, "missing column", f"{table}.{column}", table, type_))
            elif have[column] != type_:
                out.append(
                    Finding(
                        R,
                        "column differs",
                        f"{table}.{column}",
                        table,
                        f"expected {type_}, found {have[column]}",
                    )
                )
        for column in have.keys() - columns.keys():
            out.append(
                _extra(live, version, "extra column", f"{table}.{column}", others["columns"], table)
            )
    for table in live.tables.keys() - want.tables.keys():
        out.append(_extra(live, version, "extra table", table, others["tables"], table))
    return out


def _index_findings(
    live: Catalog, want: Catalog, version: int, others: Mapping[str, set[str]]
) -> list[Finding]:
    """Indexes of the listed tables: a job index missing or different is healed, any
    other refused; extra ones as :func:`_extra` (``REINDEX`` leftovers are reported as
    INVALID instead)."""
    out: list[Finding] = []
    R, H = Severity.REFUSE, Severity.HEAL
    for name, (table, definition) in want.indexes.items():
        suffix = _job_suffix(name) if table == JOB_COMMON else None
        found = live.indexes.get(name)
        if found is None:
            if suffix is not None:
                out.append(
                    Finding(
                        H,
                        "missing index",
                        name,
                        table,
                        f"{_purpose(version, suffix, definition)}; an index build "
                        "that never ran: `alkstore db upgrade` builds it",
                    )
                )
            else:
                out.append(Finding(R, "missing index", name, table))
        elif found[1] != definition:
            sev = H if suffix is not None else R
            out.append(
                Finding(
                    sev,
                    "index differs",
                    name,
                    table,
                    f"expected `{definition}`, found `{found[1]}`"
                    + ("; `alkstore db upgrade` rebuilds it" if sev is H else ""),
                )
            )
    for name in live.indexes.keys() - want.indexes.keys():
        table = live.indexes[name][0]
        if _is_rebuild_leftover(name):
            continue  # reported as INVALID leftovers
        out.append(_extra(live, version, "extra index", name, others["indexes"], table))
    return out


def _partition_findings(
    live: Catalog, want: Catalog, version: int, others: Mapping[str, set[str]]
) -> list[Finding]:
    """The indexes of each job partition against ``job_common``'s for its queue's
    policy: missing or different ones healed, extra ones as :func:`_extra`."""
    out: list[Finding] = []
    H = Severity.HEAL
    for table, have_by_suffix in sorted(live.partitions.items()):
        expected = partition_indexes(want, live.policies.get(table))
        for suffix, wanted in sorted(expected.items()):
            name = f"{table}_{suffix}"
            got = have_by_suffix.get(suffix)
            if got is None:
                out.append(
                    Finding(
                        H,
                        "missing index",
                        name,
                        table,
                        f"{_purpose(version, suffix, wanted)}; an index build "
                        "that never ran: `alkstore db upgrade` builds it",
                    )
                )
            elif got != wanted:
                out.append(
                    Finding(
                        H,
                        "index differs",
                        name,
                        table,
                        f"expected `{unshape(wanted, name, table)}`, found "
                        f"`{unshape(got, name, table)}`; `alkstore db upgrade` "
                        "rebuilds it",
                    )
                )
        for suffix in have_by_suffix.keys() - expected.keys():
            if suffix != "pkey" and not _is_rebuild_leftover(suffix):
                out.append(
                    _extra(
                        live,
                        version,
                        "extra index",
                        f"{table}_{suffix}",
                        {f"{table}_{s}" for s in others["job_suffixes"]},
                        table,
                    )
                )
    return out


def _constraint_findings(
    live: Catalog, want: Catalog, version: int, others: Mapping[str, set[str]]
) -> list[Finding]:
    """Constraints: missing or different ones refused, extra ones as :func:`_extra`."""
    out: list[Finding] = []
    for name, definition in want.constraints.items():
        table = name.split(".", 1)[0]
        if name not in live.constraints:
            out.append(Finding(Severity.REFUSE, "missing constraint", name, table, definition))
        elif live.constraints[name] != definition:
            out.append(
                Finding(
                    Severity.REFUSE,
                    "constraint differs",
                    name,
                    table,
                    f"expected {definition}, found {live.constraints[name]}",
                )
            )
    for name in live.constraints.keys() - want.constraints.keys():
        out.append(
            _extra(
                live,
                version,
                "extra constraint",
                name,
                others["constraints"],
                name.split(".", 1)[0],
            )
        )
    return out


def _function_findings(
    live: Catalog, want: Catalog, version: int, others: Mapping[str, set[str]]
) -> list[Finding]:
    """Functions: missing ones refused, extra ones as :func:`_extra`."""
    out = [
        Finding(Severity.REFUSE, "missing function", fn)
        for fn in sorted(set(want.functions) - set(live.functions))
    ]
    for fn in sorted(set(live.functions) - set(want.functions)):
        out.append(_extra(live, version, "extra function", fn, others["functions"]))
    return out


def _type_findings(live: Catalog, want: Catalog) -> list[Finding]:
    """Enum types: missing ones, or ones with other labels, refused (extra ones are not
    looked at)."""
    out: list[Finding] = []
    for type_, labels in want.types.items():
        if type_ not in live.types:
            out.append(Finding(Severity.REFUSE, "missing type", type_, None, labels))
        elif live.types[type_] != labels:
            out.append(
                Finding(
                    Severity.REFUSE,
                    "type differs",
                    type_,
                    None,
                    f"expected labels {labels}, found {live.types[type_]}",
                )
            )
    return out


@cache
def _known_elsewhere(version: int) -> dict[str, set[str]]:
    """Objects of the other schema versions that ``version`` does not have."""
    want = _expected_all()[version]
    out: dict[str, set[str]] = {
        k: set()
        for k in ("tables", "columns", "indexes", "constraints", "functions", "job_suffixes")
    }
    for other, cat in _expected_all().items():
        if other == version:
            continue
        out["tables"] |= cat.tables.keys() - want.tables.keys()
        out["columns"] |= {f"{t}.{c}" for t, cols in cat.tables.items() for c in cols} - {
            f"{t}.{c}" for t, cols in want.tables.items() for c in cols
        }
        out["indexes"] |= cat.indexes.keys() - want.indexes.keys()
        out["constraints"] |= cat.constraints.keys() - want.constraints.keys()
        out["functions"] |= set(cat.functions) - set(want.functions)
    out["job_suffixes"] = {s for s in (_job_suffix(i) for i in out["indexes"]) if s is not None}
    return out


def _is_rebuild_leftover(name: str) -> bool:
    return re.search(r"_cc(new|old)\d*$", name) is not None


def _invalid_findings(live: Catalog, version: int) -> list[Finding]:
    out = []
    for name, (table, definition, relkind) in sorted(live.invalid.items()):
        if _is_rebuild_leftover(name):
            detail = (
                "a leftover of an interrupted REINDEX CONCURRENTLY; the index it was "
                "rebuilding is still there. `alkstore db upgrade` drops it"
            )
            out.append(Finding(Severity.HEAL, "invalid index", name, table, detail))
        elif relkind == "p":
            detail = (
                "INVALID on a partitioned table (a partition lacks its index): create "
                "the partition's index and ALTER INDEX ... ATTACH PARTITION"
            )
            out.append(Finding(Severity.REFUSE, "invalid index", name, table, detail))
        else:
            suffix = _job_suffix(name) if table == JOB_COMMON else name[len(table) + 1 :]
            detail = (
                f"{_purpose(version, suffix, definition)}; INVALID (an interrupted "
                "CREATE INDEX CONCURRENTLY): PostgreSQL keeps it up to date but never "
                "uses it. `alkstore db upgrade` drops and rebuilds it concurrently"
            )
            out.append(Finding(Severity.HEAL, "invalid index", name, table, detail))
    return out


def unfinished_builds(conn: Connection, schema: str) -> list[tuple[str, int, str, str]]:
    """``(name, version, status, table_name)`` of the ``bam`` rows not completed.

    pg-boss's background index builds (schema 27 on); empty without a ``bam`` table.
    """
    quoted = conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
    exists = conn.execute(
        text("SELECT to_regclass(:t) IS NOT NULL"), {"t": f"{quoted}.bam"}
    ).scalar_one()
    if not exists:
        return []
    found = conn.execute(
        text(
            f"SELECT name, version, status, table_name FROM {quoted}.bam "
            "WHERE status <> 'completed' ORDER BY version, name, table_name"
        )
    )
    return [(str(r[0]), int(r[1]), str(r[2]), str(r[3])) for r in found]


def diagnose(conn: Connection, schema: str) -> Diagnosis:
    """Compare ``schema`` with the catalog its version row names; list what differs.

    Reads only the catalog, the version row, our Alembic revision and ``bam``. A
    version row we have no catalog for (not installed, or not 26 to 46) gives a
    diagnosis without findings: :func:`alkstore_sa.migrate.check` refuses those first.
    """
    version = installed_version(conn, schema)
    recorded = recorded_version(conn, schema)
    want = expected_catalog(version) if version is not None else None
    if version is None or want is None:
        return Diagnosis(schema, version, recorded)
    live = read_catalog(conn, schema)
    profile = "postgres"
    plain = profile_catalogs(version)
    if plain and JOB_COMMON not in live.tables:
        # No shared partition: pg-boss's plain tables, compared with the profile's
        # catalog that differs least (cockroachdb and yugabytedb differ in two flags).
        def refusals(name: str) -> int:
            found = _compare(live, plain[name], version)
            return sum(1 for f in found if f.severity is Severity.REFUSE)

        profile = min(sorted(plain), key=refusals)
        want = plain[profile]
    findings = [
        replace(f, queue=live.queues.get(f.table)) if f.table in live.queues else f
        for f in _compare(live, want, version) + _invalid_findings(live, version)
    ]
    for name, bam_version, status, table in unfinished_builds(conn, schema):
        findings.append(
            Finding(
                Severity.HEAL,
                "unfinished build",
                f"{name} (version {bam_version})",
                table,
                f"a background index build pg-boss queued is {status}; "
                "`alkstore db upgrade` builds what is missing and completes it",
            )
        )
    if recorded is not None and recorded != version:
        if recorded > version:
            findings.append(
                Finding(
                    Severity.REFUSE,
                    "version disagrees",
                    "alkstore_alembic_version",
                    None,
                    f"our revision records schema {recorded} but the version row says "
                    f"{version}: the version row was set back by hand or restored",
                )
            )
        else:
            findings.append(
                Finding(
                    Severity.WARN,
                    "version disagrees",
                    "alkstore_alembic_version",
                    None,
                    f"our revision records schema {recorded}, the version row says "
                    f"{version} (Node pg-boss migrated it, or an upgrade was interrupted); "
                    "`alkstore db upgrade` records it",
                )
            )
    rank = {Severity.REFUSE: 0, Severity.HEAL: 1, Severity.WARN: 2}
    findings.sort(key=lambda f: (rank[f.severity], f.kind, f.name))
    closest = None
    refused = any(f.severity is Severity.REFUSE and f.kind != "version disagrees" for f in findings)
    if refused and profile == "postgres":
        closest = _closest(live, version)
    return Diagnosis(schema, version, recorded, tuple(findings), closest, profile)


def _closest(live: Catalog, version: int) -> int | None:
    def refusals(v: int) -> int:
        cat = _expected_all()[v]
        return sum(1 for f in _compare(live, cat, v) if f.severity is not Severity.WARN)

    scores = {v: refusals(v) for v in known_versions()}
    best = min(scores, key=lambda v: (scores[v], abs(v - version)))
    return None if best == version else best


# --------------------------------------------------------------------------- healing


def _building(conn: Connection, schema: str, index: str) -> int | None:
    """The pid of a session building ``index`` right now, if any."""
    found = conn.execute(
        text(
            "SELECT p.pid FROM pg_stat_progress_create_index p WHERE p.index_relid = "
            "to_regclass(quote_ident(:s) || '.' || quote_ident(:i))"
        ),
        {"s": schema, "i": index},
    ).scalar()
    return None if found is None else int(found)


def _concurrently(definition: str, *, if_not_exists: bool = False) -> str:
    head, sep, tail = definition.partition(" INDEX ")
    return head + sep + "CONCURRENTLY " + ("IF NOT EXISTS " if if_not_exists else "") + tail


def _wait_for_builds(conn: Connection, schema: str, names: Sequence[str]) -> None:
    for name in names:
        pid = _building(conn, schema, name)
        if pid is None:
            continue
        log.info(
            "index %s.%s is being built by session %s: waiting for it",
            schema,
            name,
            pid,
            extra={"action": "heal_wait", "schema": schema, "index": name, "pid": pid},
        )
        while _building(conn, schema, name) is not None:
            time.sleep(0.2)


class _Healer:
    """Runs the healing statements: one commit each, ``CONCURRENTLY`` unless ``conn`` is
    inside a transaction its caller owns (then plainly, inside it)."""

    def __init__(self, conn: Connection, schema: str, version: int, *, concurrently: bool) -> None:
        self.conn, self.schema, self.version = conn, schema, version
        self.concurrently = concurrently
        self.quoted = str(conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one())
        if self.concurrently:
            conn.commit()  # the statement above began one
        self.done: list[str] = []

    def run(self, sql: str) -> None:
        self.conn.execute(text(sql.replace(SCHEMA_PLACEHOLDER + ".", self.quoted + ".")))
        if self.concurrently:
            self.conn.commit()

    def drop(self, name: str) -> None:
        how = "CONCURRENTLY " if self.concurrently else ""
        quoted = self.conn.dialect.identifier_preparer.quote(name)
        self.run(f"DROP INDEX {how}IF EXISTS {SCHEMA_PLACEHOLDER}.{quoted}")

    def create(self, definition: str) -> None:
        if self.concurrently:
            definition = _concurrently(definition, if_not_exists=True)
        else:
            head, sep, tail = definition.partition(" INDEX ")
            definition = head + sep + "IF NOT EXISTS " + tail
        self.run(definition)

    def wait(self, names: Sequence[str]) -> None:
        if self.concurrently:
            _wait_for_builds(self.conn, self.schema, names)
            self.conn.commit()

    def index(self, name: str, table: str, wanted: str, found: str | None) -> None:
        """Make index ``name`` on ``table`` be ``wanted`` (``found``: what it is now)."""
        if found == wanted:
            return
        self.wait([name])
        if found is not None:
            self.drop(name)
        self.create(wanted)
        verb = "rebuilt" if found is not None else "built"
        self.done.append(f"{verb} {name} on {table} (schema {self.version}'s definition)")


def heal(conn: Connection, schema: str) -> list[str]:
    """Finish ``schema``'s unfinished index builds; return one line per thing done.

    Drops each INVALID index concurrently and rebuilds it ``CONCURRENTLY`` with its own
    definition (``*_ccnew``/``*_ccold`` leftovers of ``REINDEX CONCURRENTLY`` are only
    dropped), builds the job-table indexes the version expects but lacks, rebuilds those
    whose definition is not the version's, drops job-table indexes of other pg-boss
    versions, then marks the unfinished ``bam`` rows of the version and before completed
    (nothing is left for a Node background runner to do). An index another session is
    building is waited for first.

    ``conn`` should hold :func:`migration_lock`. Outside a transaction every statement
    commits on its own; inside one the caller owns, the indexes are built without
    ``CONCURRENTLY``, inside it. Nothing is done when :func:`diagnose` finds a refusal.
    """
    if conn.in_transaction():
        return _heal(conn, schema, concurrently=False)
    with autocommit(conn):
        return _heal(conn, schema, concurrently=True)


BAM_CLAIM_GRACE_SECONDS = 10
"""A ``bam`` row another session marked ``in_progress`` this recently counts as being
built even before its build shows in ``pg_stat_progress_create_index``."""


def _others_building(conn: Connection, schema: str) -> bool:
    """Whether another session is building an index here, or has just claimed a
    ``bam`` row to build one (a Node pg-boss background runner)."""
    building = conn.execute(
        text(
            "SELECT count(*) FROM pg_stat_progress_create_index p "
            "JOIN pg_class c ON c.oid = p.relid JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :s AND p.pid <> pg_backend_pid()"
        ),
        {"s": schema},
    ).scalar_one()
    if building:
        return True
    quoted = conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
    if conn.execute(text("SELECT to_regclass(:t)"), {"t": f"{quoted}.bam"}).scalar() is None:
        return False
    claimed = conn.execute(
        text(
            f"SELECT count(*) FROM {quoted}.bam WHERE status = 'in_progress' "
            f"AND started_on > now() - make_interval(secs => {BAM_CLAIM_GRACE_SECONDS})"
        )
    ).scalar_one()
    return bool(claimed)


def _claim_builds(conn: Connection, schema: str) -> None:
    """Let a running Node background runner finish its current build, then take its
    remaining ``bam`` rows (``in_progress``, as its own claim does), so that it and
    :func:`heal` never build on one table at once (two concurrent builds there can
    deadlock). Rows left ``in_progress`` by an interrupted heal go stale, and Node
    retries them (finding the index valid or rebuilding it)."""
    quoted = conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
    if conn.execute(text("SELECT to_regclass(:t)"), {"t": f"{quoted}.bam"}).scalar() is None:
        return
    while True:
        while _others_building(conn, schema):
            time.sleep(0.2)
        conn.execute(
            text(
                f"UPDATE {quoted}.bam SET status = 'in_progress', started_on = now() "
                "WHERE status IN ('pending', 'failed')"
            )
        )
        if not _others_building(conn, schema):
            return


def _heal(conn: Connection, schema: str, *, concurrently: bool) -> list[str]:
    if concurrently and diagnose(conn, schema).to_heal:
        _claim_builds(conn, schema)
    first = diagnose(conn, schema)
    want = expected_catalog(first.version) if first.version is not None else None
    if want is None or first.version is None or first.refusals or not first.to_heal:
        if concurrently and conn.in_transaction():
            conn.commit()  # end the read-only transaction diagnose() began
        return []
    healer = _Healer(conn, schema, first.version, concurrently=concurrently)
    live = read_catalog(conn, schema)
    healer.wait(list(live.invalid))
    live = read_catalog(conn, schema)
    for name, (table, definition, relkind) in sorted(live.invalid.items()):
        if relkind == "p":
            continue
        healer.drop(name)
        if _is_rebuild_leftover(name):
            healer.done.append(f"dropped {name} on {table}, a leftover of an interrupted REINDEX")
            continue
        healer.create(definition)
        healer.done.append(f"rebuilt the INVALID index {name} on {table}")
    for finding in first.to_heal:
        if finding.kind == "extra index":
            healer.wait([finding.name])
            healer.drop(finding.name)
            healer.done.append(f"dropped {finding.name} on {finding.table}: {finding.detail}")
    live = read_catalog(conn, schema)
    for name, definition in sorted(job_indexes(want).values()):
        current = live.indexes.get(name)
        healer.index(name, JOB_COMMON, definition, None if current is None else current[1])
    for table in sorted(live.partitions):
        for suffix, wanted in sorted(partition_indexes(want, live.policies.get(table)).items()):
            name = f"{table}_{suffix}"
            got = live.partitions[table].get(suffix)
            healer.index(
                name,
                table,
                unshape(wanted, name, table),
                None if got is None else unshape(got, name, table),
            )
    after = diagnose(conn, schema)
    if all(f.kind == "unfinished build" for f in after.to_heal):
        pending = unfinished_builds(conn, schema)
        if pending:
            healer.run(
                f"UPDATE {SCHEMA_PLACEHOLDER}.bam SET status = 'completed', error = NULL, "
                "started_on = COALESCE(started_on, now()), completed_on = now() "
                f"WHERE status <> 'completed' AND version <= {int(first.version)}"
            )
            healer.done.append(
                f"completed {len(pending)} unfinished background build row(s) in bam"
            )
    for line in healer.done:
        log.info(
            "schema %s healed: %s",
            schema,
            line,
            extra={"action": "heal", "schema": schema, "healed": line},
        )
    return healer.done
