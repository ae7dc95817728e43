"""Revisions alkstore_0027 … alkstore_0037: pg-boss schema versions 27 to 37.

The reference for each version is Node pg-boss 12.38.0 itself (``tests/interop46``):
its own migrations up to that version, applied to a schema 26 made by Node pg-boss
11.1.2 with the background index builds run inline (as its ``pg-boss migrate`` command
line does). Our revision to the same version must give the same catalog, column order
included, and create the same queues afterwards. Downgrades go back to exactly the
schema-26 catalog; the index builds reach partitions created before the upgrade, leave
no ``bam`` row behind, and an interrupted build is healed by the next upgrade.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError
from support import catalog
from support.node import node46_modules, node_connection_string, run_node46
from support.schemas import drop_schema, install_with_node_plan, random_schema

from alkstore_sa import SchemaVersionError, migrate

__all__ = ["node46_modules"]  # fixture used below

QUEUES_AT_26: list[tuple[str, dict[str, Any]]] = [
    ("parted", {"partition": True}),
    ("parted-singleton", {"partition": True, "policy": "singleton"}),
    ("shared", {}),
]
"""Queues that exist before the upgrade: the index builds must reach their partitions."""

QUEUES_AFTER: list[tuple[str, dict[str, Any]]] = [
    ("later-fifo", {"partition": True, "policy": "key_strict_fifo"}),
    ("later-exclusive", {"partition": True, "policy": "exclusive", "heartbeatSeconds": 30}),
    ("later-short", {"partition": True, "policy": "short", "notify": True}),
    ("later-stately", {"partition": True, "policy": "stately"}),
    ("later-shared", {"policy": "singleton", "notify": True, "retryLimit": 5}),
]
"""Queues created by the schema's own create_queue() after the upgrade."""

# Migrates a schema to the version given, with pg-boss 12.38.0's own migration list
# cut at that version and its background builds inlined over the live partitions.
NODE_MIGRATE_TO = """
import pg from 'pg';
import * as store from './node_modules/pg-boss/dist/migrationStore.js';
const [url, schema, target] = process.argv.slice(1);
const client = new pg.Client({ connectionString: url });
await client.connect();
const from = (await client.query(`SELECT version FROM ${schema}.version`)).rows[0].version;
const partitionTables = (await client.query(
  `SELECT table_name, policy FROM ${schema}.queue WHERE partition = true`)).rows
  .map(r => ({ tableName: r.table_name, policy: r.policy }));
const migrations = store.getAll(schema).filter(m => m.version <= Number(target));
const { sql, concurrent } = store.migrateCommands(
  schema, Number(from), migrations, false, { inlineAsync: true, partitionTables });
await client.query(sql);
for (const statement of concurrent) await client.query(statement);
await client.end();
"""


def _revision(version: int) -> str:
    return "alkstore_0001" if version == 26 else f"alkstore_00{version}"


def _create_queues(engine: Engine, schema: str, queues: list[tuple[str, dict[str, Any]]]) -> None:
    with engine.begin() as conn:
        for name, options in queues:
            conn.execute(
                text(f'SELECT "{schema}".create_queue(:name, CAST(:options AS jsonb))'),
                {"name": name, "options": json.dumps({"policy": "standard", **options})},
            )


def _schema26(engine: Engine, database_url: str, schema: str) -> None:
    install_with_node_plan(database_url, schema)
    _create_queues(engine, schema, QUEUES_AT_26)


def _queue_rows(engine: Engine, schema: str) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text(f'SELECT * FROM "{schema}".queue ORDER BY name')).mappings()
        return [{k: v for k, v in r.items() if k not in ("created_on", "updated_on")} for r in rows]


def _scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), params).scalar()


@pytest.fixture
def schemas(engine: Engine) -> Iterator[list[str]]:
    """Two fresh schema names, dropped after the test."""
    names = [random_schema(), random_schema()]
    try:
        yield names
    finally:
        for name in names:
            drop_schema(engine, name)


@pytest.mark.interop
@pytest.mark.parametrize("version", range(27, 38))
def test_upgrade_to_each_version_equals_pg_boss_12_38_migrating_schema_26_to_it(
    version: int,
    engine: Engine,
    database_url: str,
    node46_modules: None,
    schemas: list[str],
) -> None:
    theirs, ours = schemas
    for schema in schemas:
        _schema26(engine, database_url, schema)

    run_node46(
        "--input-type=module",
        "-e",
        NODE_MIGRATE_TO,
        node_connection_string(database_url),
        theirs,
        str(version),
    )
    migrate.upgrade(database_url, schema=ours, revision=_revision(version))
    catalog.assert_same(
        catalog.snapshot(engine, theirs), catalog.snapshot(engine, ours), ("pg-boss 12.38", "ours")
    )

    # The create_queue() each version installs builds the same partitions as pg-boss's.
    later = [q for q in QUEUES_AFTER if version >= 28 or q[1].get("policy") != "key_strict_fifo"]
    for schema in schemas:
        _create_queues(engine, schema, later)
    catalog.assert_same(
        catalog.snapshot(engine, theirs), catalog.snapshot(engine, ours), ("pg-boss 12.38", "ours")
    )
    assert _queue_rows(engine, ours) == _queue_rows(engine, theirs)


@pytest.mark.interop
@pytest.mark.parametrize("version", [27, 28, 31, 32, 33, 37])
def test_downgrade_from_each_version_restores_the_schema_26_catalog(
    version: int, engine: Engine, database_url: str, schemas: list[str]
) -> None:
    reference, ours = schemas
    for schema in schemas:
        _schema26(engine, database_url, schema)
    migrate.upgrade(database_url, schema=ours, revision=_revision(version))
    # Partitions created at the new version must come back in schema 26's shape too.
    later = [q for q in QUEUES_AFTER if q[1].get("policy") != "key_strict_fifo"]
    _create_queues(engine, ours, later)

    migrate.downgrade(database_url, schema=ours, revision="alkstore_0001")

    _create_queues(engine, reference, later)
    catalog.assert_same(
        catalog.snapshot(engine, reference), catalog.snapshot(engine, ours), ("26", "downgraded")
    )
    assert _scalar(engine, f'SELECT version FROM "{ours}".version') == 26


@pytest.mark.interop
def test_index_builds_reach_job_common_and_old_partitions_and_leave_no_bam_rows(
    engine: Engine, database_url: str, schemas: list[str]
) -> None:
    schema = schemas[0]
    _schema26(engine, database_url, schema)
    migrate.upgrade(database_url, schema=schema, revision=_revision(37))

    partition = _scalar(engine, f"SELECT table_name FROM \"{schema}\".queue WHERE name = 'parted'")
    expected = {f"job_common_i{n}" for n in (5, 7, 8, 9)} | {f"{partition}_i{n}" for n in (5, 7, 9)}
    with engine.connect() as conn:
        found: dict[str, bool] = dict(
            conn.execute(
                text(
                    "SELECT i.relname, x.indisvalid FROM pg_index x "
                    "JOIN pg_class i ON i.oid = x.indexrelid "
                    "JOIN pg_namespace n ON n.oid = i.relnamespace "
                    "WHERE n.nspname = :s AND i.relname = ANY(:names)"
                ),
                {"s": schema, "names": sorted(expected)},
            ).all()
        )
        fetch_index = conn.execute(
            text("SELECT pg_get_indexdef(to_regclass(:i))"), {"i": f'"{schema}".job_common_i5'}
        ).scalar_one()
        pending = conn.execute(text(f'SELECT count(*) FROM "{schema}".bam')).scalar_one()
    assert found == dict.fromkeys(expected, True)
    assert "NOT blocked" in fetch_index and "INCLUDE" not in fetch_index
    assert pending == 0


@pytest.mark.interop
def test_an_invalid_index_left_by_an_interrupted_build_is_rebuilt_by_the_next_upgrade(
    engine: Engine, database_url: str, schemas: list[str]
) -> None:
    schema = schemas[0]
    _schema26(engine, database_url, schema)
    migrate.upgrade(database_url, schema=schema, revision=_revision(27))
    # What an interrupted run leaves: the version row says 27, the revision is not
    # recorded, and the build failed half-way (an INVALID index under the right name).
    with engine.connect() as conn:
        conn.execute(text(f'DROP INDEX "{schema}".job_common_i7'))
        conn.execute(
            text(f"UPDATE \"{schema}\".alkstore_alembic_version SET version_num = 'alkstore_0001'")
        )
        for _ in range(2):
            conn.execute(
                text(f"INSERT INTO \"{schema}\".job (name, data) VALUES ('shared', '{{}}')")
            )
        conn.commit()
    failing = f'CREATE UNIQUE INDEX CONCURRENTLY job_common_i7 ON "{schema}".job_common (name)'
    with (
        engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn,
        pytest.raises(DBAPIError, match="could not create unique index"),
    ):
        conn.execute(text(failing))
    leftover = "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(:i)"
    assert _scalar(engine, leftover, i=f'"{schema}".job_common_i7') is False

    migrate.upgrade(database_url, schema=schema, revision=_revision(27))

    with engine.connect() as conn:
        valid, definition = conn.execute(
            text(
                "SELECT x.indisvalid, pg_get_indexdef(x.indexrelid) FROM pg_index x "
                "WHERE x.indexrelid = to_regclass(:i)"
            ),
            {"i": f'"{schema}".job_common_i7'},
        ).one()
    assert valid is True
    assert "(name, group_id)" in definition and "UNIQUE" not in definition
    assert migrate.current(database_url, schema=schema) == _revision(27)
    assert _scalar(engine, f'SELECT version FROM "{schema}".version') == 27


@pytest.mark.interop
def test_upgrade_refuses_a_schema_another_program_migrated_and_changes_nothing(
    engine: Engine, database_url: str, schemas: list[str]
) -> None:
    schema = schemas[0]
    _schema26(engine, database_url, schema)
    migrate.upgrade(database_url, schema=schema, revision=_revision(26))
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{schema}".version SET version = 30'))

    with pytest.raises(SchemaVersionError, match="is at version 30"):
        migrate.upgrade(database_url, schema=schema, revision=_revision(27))

    assert _scalar(engine, "SELECT to_regclass(:t)::text", t=f'"{schema}".bam') is None
    assert migrate.current(database_url, schema=schema) == _revision(26)


@pytest.mark.interop
def test_upgrade_waits_while_pg_boss_migration_lock_is_held(
    engine: Engine, database_url: str, schemas: list[str]
) -> None:
    schema = schemas[0]
    _schema26(engine, database_url, schema)
    database = _scalar(engine, "SELECT current_database()")
    # pg-boss's migration key: the first 8 bytes of SHA-224 of "<db>.pgboss.<schema>".
    digest = hashlib.sha224(f"{database}.pgboss.{schema}".encode()).digest()
    key = int.from_bytes(digest[:8], "big", signed=True)

    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            migrate.upgrade(database_url, schema=schema, revision=_revision(28))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            done.set()

    with engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        worker = threading.Thread(target=run)
        worker.start()
        time.sleep(1.5)
        assert not done.is_set()
        assert _scalar(engine, f'SELECT version FROM "{schema}".version') == 26
        holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        holder.commit()
    worker.join(timeout=60)
    assert errors == []
    assert _scalar(engine, f'SELECT version FROM "{schema}".version') == 28


def test_job_table_functions_point_a_command_at_each_job_table(
    engine: Engine, database_url: str, schemas: list[str]
) -> None:
    schema = "job_intake_" + schemas[0][2:]  # a name containing "job_i", as pg-boss 12.26 allows
    schemas.append(schema)
    # Node pg-boss 11.1.2's create_queue() cannot handle such a name: build it with ours.
    migrate.upgrade(database_url, schema=schema, revision=_revision(37))
    _create_queues(engine, schema, QUEUES_AT_26)
    partition = _scalar(engine, f"SELECT table_name FROM \"{schema}\".queue WHERE name = 'parted'")
    with engine.begin() as conn:
        formatted = conn.execute(
            text(f'SELECT "{schema}".job_table_format(:c, :t)'),
            {"c": f"CREATE INDEX job_i42 ON {schema}.job (name)", "t": partition},
        ).scalar_one()
        conn.execute(
            text(f'SELECT "{schema}".job_table_run(:c)'),
            {"c": f"CREATE INDEX job_i42 ON {schema}.job (name)"},
        )
        conn.execute(
            text(f"SELECT \"{schema}\".job_table_run_async('probe', 37, :c)"),
            {"c": f"DROP INDEX {schema}.job_i42"},
        )
        built = conn.execute(
            text(
                "SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :s AND c.relname LIKE '%\\_i42'"
            ),
            {"s": schema},
        ).scalar_one()
        queued = conn.execute(
            text(f"SELECT table_name, command FROM \"{schema}\".bam WHERE status = 'pending'")
        ).all()
    assert formatted == f"CREATE INDEX {partition}_i42 ON {schema}.{partition} (name)"
    assert built == 3  # job_common and the two partitions
    assert sorted(queued) == sorted(
        (t, f"DROP INDEX {schema}.{t}_i42")
        for t in (
            "job_common",
            partition,
            _scalar(
                engine, f"SELECT table_name FROM \"{schema}\".queue WHERE name = 'parted-singleton'"
            ),
        )
    )
