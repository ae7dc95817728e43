"""Creating and dropping throw-away schemas, and running SQL scripts as psql would.

A fresh schema per test comes from :func:`install`: the SQL script our migrations render
offline (``migrate.offline_sql``) is made once per session and version for
:data:`TEMPLATE_SCHEMA`, then renamed and run in one round trip. That is about four times
faster than ``migrate.upgrade`` (which also reads the catalog twice, to check and heal), and
``tests/test_fast_schema.py`` proves it builds exactly the catalog the online migrations
build. Tests whose subject is the migration path itself still call ``migrate.upgrade``.

The ``schema`` and ``schema46`` fixtures take theirs from a :class:`SchemaPool`: a schema a
test left with exactly the catalog it was installed with is emptied and handed to a later
test instead of being dropped, which costs a fifth of building one.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy import Engine, make_url, text

from alkstore_sa import migrate
from alkstore_sa._engine_cache import engine_state

from .pgboss_plans import construction_plan

TEMPLATE_SCHEMA = "t_zztemplatezz"
"""The name the offline scripts are rendered for once, then renamed (the ``z`` keeps it
apart from every :func:`random_schema` name, which is hexadecimal)."""

_scripts: dict[int, str] = {}


HOSTILE_NAMES = os.environ.get("ALKSTORE_TEST_SCHEMA_NAMES") == "hostile"
"""With ``ALKSTORE_TEST_SCHEMA_NAMES=hostile``, every test schema has a name that must be
quoted everywhere (upper case, a space, a hyphen, letters beyond ASCII): a sweep of the
suite over such names (docs/development.md)."""


def random_schema(prefix: str = "t_") -> str:
    """A schema name no other test uses."""
    if HOSTILE_NAMES:
        return f"{prefix}Ünï Jobs-{uuid.uuid4().hex[:12]}"
    return prefix + uuid.uuid4().hex[:12]


def libpq_url(database_url: str) -> str:
    """The SQLAlchemy URL of the tests as a libpq URL, for plain psycopg."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def run_script(database_url: str, sql: str) -> None:
    """Run a multi-statement script in autocommit mode (its own BEGIN/COMMIT apply)."""
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        conn.execute(sql.encode())


def migration_script(version: int, schema: str) -> str:
    """The script ``migrate.upgrade(..., schema_version=version)`` runs, for ``schema``.

    Our revisions name their schema only as an identifier or inside string literals that
    the upgrade would have written with the new name, so renaming the template's script
    gives the script rendered for ``schema`` (``tests/test_fast_schema.py`` checks both
    the text and the catalog it builds).
    """
    if version not in _scripts:
        _scripts[version] = migrate.offline_sql(TEMPLATE_SCHEMA, schema_version=version)
    return _scripts[version].replace(TEMPLATE_SCHEMA, schema)


def install(database_url: str, schema: str, version: int) -> None:
    """Create ``schema`` at pg-boss schema ``version`` with our revisions, in one round trip
    (a name that needs quotes: by ``migrate.upgrade``, the template script's names being
    bare)."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", schema):
        migrate.upgrade(database_url, schema, schema_version=version)
        return
    run_script(database_url, migration_script(version, schema))


def install_with_node_plan(database_url: str, schema: str) -> None:
    """Create ``schema`` exactly as Node pg-boss 11.1.2 does on first start."""
    run_script(database_url, construction_plan(schema))


def drop_schema(engine: Engine, schema: str) -> None:
    with engine.begin() as conn:
        quoted = conn.execute(text("SELECT quote_ident(:s)"), {"s": schema}).scalar_one()
        conn.execute(text(f"DROP SCHEMA IF EXISTS {quoted} CASCADE"))


@contextmanager
def throwaway(engine: Engine, *names: str) -> Iterator[None]:
    """Drop the named schemas afterwards, whatever happens."""
    try:
        yield
    finally:
        for name in names:
            drop_schema(engine, name)


def schema_exists(engine: Engine, schema: str) -> bool:
    with engine.connect() as conn:
        found = conn.execute(
            text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
        ).scalar_one()
    return bool(found)


# The schema's catalog as one digest: its relations, columns and defaults, indexes (and
# whether valid), constraints, functions (by body), types and enum labels, triggers,
# owners and privileges, and the rows of its revision table. Rows of the other tables are
# data, which a pooled schema has emptied.
_NS = "(SELECT oid FROM pg_namespace WHERE nspname = :s)"
"""The schema's namespace by its name as stored (``to_regnamespace`` would parse it)."""

_FINGERPRINT = f"""
SELECT md5(string_agg(x, '|' ORDER BY x)) FROM (
  SELECT 'c:' || c.relname || ':' || c.relkind::text || ':' || c.relowner::text || ':'
         || coalesce(c.relacl::text, '') AS x
    FROM pg_class c WHERE c.relnamespace = {_NS}
  UNION ALL
  SELECT 'a:' || c.relname || '.' || a.attname || ':' || a.atttypid::text || ':'
         || a.attnotnull::text || ':' || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE c.relnamespace = {_NS} AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'i:' || pg_get_indexdef(i.indexrelid) || ':' || i.indisvalid::text
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
   WHERE c.relnamespace = {_NS}
  UNION ALL
  SELECT 'k:' || conname || ':' || pg_get_constraintdef(oid)
    FROM pg_constraint WHERE connamespace = {_NS}
  UNION ALL
  SELECT 'p:' || proname || ':' || md5(prosrc) || ':' || proargtypes::text || ':'
         || proowner::text || ':' || coalesce(proacl::text, '')
    FROM pg_proc WHERE pronamespace = {_NS}
  UNION ALL
  SELECT 't:' || typname FROM pg_type WHERE typnamespace = {_NS}
  UNION ALL
  SELECT 'e:' || e.enumlabel || ':' || e.enumsortorder::text
    FROM pg_enum e JOIN pg_type t ON t.oid = e.enumtypid
   WHERE t.typnamespace = {_NS}
  UNION ALL
  SELECT 'g:' || g.tgname || ':' || g.tgenabled::text
    FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid
   WHERE c.relnamespace = {_NS}
  UNION ALL
  SELECT 'n:' || nspowner::text || ':' || coalesce(nspacl::text, '')
    FROM pg_namespace WHERE nspname = :s
) catalog
"""

# The tables whose rows a test writes: every table of the schema but partitions (emptied
# with their parent), the version row (put back as installed) and our revision table.
_DATA_TABLES = f"""
SELECT quote_ident(c.relname) FROM pg_class c
 WHERE c.relnamespace = {_NS} AND c.relkind IN ('r', 'p')
   AND NOT c.relispartition AND c.relname NOT IN ('version', 'alkstore_alembic_version')
 ORDER BY c.relname
"""


class SchemaPool:
    """Fresh schemas at 26 or 46 (under a backend profile too) for the tests of one
    process, reused where that is safe.

    :meth:`take` hands out an installed schema; :meth:`give_back` empties it for a later
    test when its catalog is still the one it was installed with (the digest
    :data:`_FINGERPRINT`), and drops it otherwise: a test that ran DDL, migrated, added a
    partition or changed a grant leaves nothing behind. Emptied means every table
    truncated and its sequences restarted (as installed) and the version row put back as it was;
    the engines' caches of the schema are forgotten, as for a schema made anew under its
    name. Whatever cannot be emptied at once (a lock another session still holds) is
    dropped instead.
    """

    def __init__(self, database_url: str, engine: Engine) -> None:
        self.database_url = database_url
        self.engine = engine
        self._free: dict[tuple[int, str | None], list[str]] = {}
        # name -> ((version, backend), catalog digest, version row as JSON), as installed
        self._installed: dict[str, tuple[tuple[int, str | None], str, str]] = {}

    def take(self, version: int, backend: str | None = None) -> str:
        """A schema at ``version`` as :func:`install` makes it; with a ``backend`` profile,
        as ``migrate.upgrade`` builds it under that profile (46 only)."""
        key = (version, backend)
        free = self._free.setdefault(key, [])
        if free:
            return free.pop()
        name = random_schema()
        try:
            if backend is None:
                install(self.database_url, name, version)
            else:
                migrate.upgrade(self.engine, name, schema_version=version, backend=backend)
            with self.engine.connect() as conn:
                digest = conn.execute(text(_FINGERPRINT), {"s": name}).scalar_one()
                rows = conn.execute(text(f'SELECT json_agg(v) FROM "{name}".version v')).scalar()
        except Exception:
            drop_schema(self.engine, name)  # never left behind, whatever failed
            raise
        self._installed[name] = (key, digest, json.dumps(rows))
        return name

    def give_back(self, name: str) -> None:
        """Keep ``name`` for a later test if it can be emptied safely; else drop it."""
        key, digest, version_rows = self._installed[name]
        engine_state(self.engine).forget(name)
        try:
            with self.engine.begin() as conn:
                conn.execute(text("SET LOCAL lock_timeout = '5s'"))
                if conn.execute(text(_FINGERPRINT), {"s": name}).scalar_one() != digest:
                    raise _Changed(name)
                tables = conn.execute(text(_DATA_TABLES), {"s": name}).scalars().all()
                listed = ", ".join(f'"{name}".{t}' for t in tables)
                conn.execute(text(f"TRUNCATE {listed} RESTART IDENTITY"))
                conn.execute(text(f'DELETE FROM "{name}".version'))
                conn.execute(
                    text(
                        f'INSERT INTO "{name}".version SELECT * FROM '
                        f'json_populate_recordset(NULL::"{name}".version, CAST(:rows AS json))'
                    ),
                    {"rows": version_rows},
                )
        except Exception:
            del self._installed[name]
            drop_schema(self.engine, name)
            return
        self._free[key].append(name)

    def close(self) -> None:
        """Drop every schema this pool made and has not dropped: kept or still taken."""
        for name in list(self._installed):
            drop_schema(self.engine, name)
            del self._installed[name]
        self._free.clear()


class _Changed(Exception):
    """The schema's catalog is not the one it was installed with."""
