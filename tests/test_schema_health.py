"""Bad schemas: interrupted index builds, a version row its catalog does not match, races.

- ``alkstore db check`` names every INVALID index (an interrupted ``CREATE INDEX
  CONCURRENTLY``, a ``*_ccnew`` left by an interrupted ``REINDEX CONCURRENTLY``), every
  job-table index a background build never made and every unfinished ``bam`` row, says
  whether it matters for correctness or speed only, and exits 1; ``alkstore db upgrade``
  heals them, even at the target version.
- A version row whose catalog is not that version's is refused, naming what differs,
  before anything is written; an index a user added is only a warning.
- Two ``alkstore db upgrade`` at once: one does the work, the other waits for pg-boss's
  migration lock and finds nothing to do.

Interrupted builds are real ones: a ``CREATE INDEX CONCURRENTLY`` waiting for a writer's
transaction is cancelled, which leaves PostgreSQL's INVALID index behind.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from psycopg.errors import QueryCanceled
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session
from support import catalog
from support.schemas import drop_schema, random_schema

import alkstore_sa
from alkstore_sa import (
    QueueService,
    SchemaCatalogError,
    UnfinishedIndexBuildError,
    migrate,
    schema_health,
)
from alkstore_sa.cli import main

ROOT = Path(alkstore_sa.__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "alkstore_sa.cli"]


@pytest.fixture
def fresh(engine: Engine) -> Iterator[str]:
    name = random_schema("h_")
    yield name
    drop_schema(engine, name)


def _install(
    engine: Engine, schema: str, version: int, *queues: tuple[str, dict[str, Any]]
) -> None:
    migrate.upgrade(engine, schema, schema_version=version)
    with Session(engine) as session, session.begin():
        service = QueueService(session, schema=schema)
        for name, options in queues:
            service.create_queue(name, **options)


QUEUES46: tuple[tuple[str, dict[str, Any]], ...] = (
    ("plain", {}),
    ("fifo-own", {"policy": "key_strict_fifo", "partition": True}),
    ("single-own", {"policy": "singleton", "partition": True}),
    ("std-own", {"partition": True}),
)


def _sql(engine: Engine, statement: str, **params: Any) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(statement), params)
        return list(result.all()) if result.returns_rows else []


def _table_of(engine: Engine, schema: str, queue: str) -> str:
    return str(
        _sql(engine, f'SELECT table_name FROM "{schema}".queue WHERE name = :q', q=queue)[0][0]
    )


def _invalid(engine: Engine, schema: str) -> list[str]:
    return [
        r[0]
        for r in _sql(
            engine,
            "SELECT c.relname FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = :s AND NOT x.indisvalid ORDER BY 1",
            s=schema,
        )
    ]


def _interrupted(
    engine: Engine, database_url: str, schema: str, table: str, statement: str
) -> None:
    """Run ``statement`` (a CONCURRENTLY build on ``table``) and cancel it mid-way.

    A writer's open transaction on ``table`` makes the build wait after it has created
    its (INVALID) index; cancelling it then leaves that index behind, as a killed
    ``pg-boss`` build or an interrupted migration does.
    """
    builder = create_engine(database_url, isolation_level="AUTOCOMMIT")
    errors: list[DBAPIError] = []
    pid: list[int] = []
    try:
        with engine.connect() as writer:
            writer.execute(text(f'LOCK TABLE "{schema}"."{table}" IN ROW EXCLUSIVE MODE'))

            def build() -> None:
                with builder.connect() as conn:
                    pid.append(int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one()))
                    try:
                        conn.execute(text(statement))
                    except DBAPIError as exc:
                        errors.append(exc)

            thread = threading.Thread(target=build)
            thread.start()
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                waiting = pid and _sql(
                    engine,
                    "SELECT 1 FROM pg_stat_activity WHERE pid = :p AND wait_event_type = 'Lock'",
                    p=pid[0],
                )
                if waiting:
                    break
                time.sleep(0.05)
            _sql(engine, "SELECT pg_cancel_backend(:p)", p=pid[0])
            thread.join(30)
            writer.rollback()
    finally:
        builder.dispose()
    assert len(errors) == 1 and isinstance(errors[0].orig, QueryCanceled), errors


def _check(database_url: str, schema: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    capsys.readouterr()
    code = main(["db", "check", "--json", "--database-url", database_url, "--schema", schema])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else out.err


def _upgrade(
    database_url: str, schema: str, capsys: pytest.CaptureFixture[str], version: int = 46
) -> tuple[int, Any, str]:
    capsys.readouterr()
    code = main(
        [
            "db",
            "upgrade",
            "--schema-version",
            str(version),
            "--json",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ]
    )
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else None, out.err


def _clean46(engine: Engine, schema: str) -> None:
    """``schema`` has exactly the catalog of a fresh 46 (its queues' tables aside)."""
    with engine.connect() as conn:
        found = schema_health.diagnose(conn, schema)
    assert found.version == 46
    assert list(found.findings) == []


# ----------------------------------------------------------------- the expected catalogs


@pytest.mark.slow  # every version's catalog, migrated and read
def test_the_catalog_file_is_what_our_revisions_build(engine: Engine) -> None:
    spec = importlib.util.spec_from_file_location(
        "gen_catalogs", ROOT / "tools" / "gen_catalogs.py"
    )
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    regenerated = generator.render(generator.generate(engine))
    stored = (ROOT / "alkstore_sa" / schema_health.CATALOG_RESOURCE).read_text(encoding="utf-8")
    assert json.loads(stored) == json.loads(regenerated), "run: python tools/gen_catalogs.py"
    assert sorted(int(v) for v in json.loads(stored)["versions"]) == list(range(26, 47))


@pytest.mark.parametrize("version", [26, 27, 38, 40, 46])
def test_a_fresh_install_with_partitioned_queues_of_every_policy_has_no_findings(
    version: int, engine: Engine, fresh: str
) -> None:
    # Queues made at 26 (what the runtime speaks below 46), then migrated with the schema.
    policies = ["standard", "short", "singleton", "stately"]
    if version == 46:
        policies += ["exclusive", "key_strict_fifo"]
    made = version if version == 46 else 26
    _install(
        engine, fresh, made, *((f"own-{p}", {"policy": p, "partition": True}) for p in policies)
    )
    migrate.upgrade(engine, fresh, schema_version=version)
    with engine.connect() as conn:
        found = schema_health.diagnose(conn, fresh)
        live = schema_health.read_catalog(conn, fresh)
    assert (found.version, found.recorded, list(found.findings)) == (version, version, [])
    assert len(live.partitions) == len(policies)  # the partitions were looked at


# ----------------------------------------------------------------- INVALID indexes


def test_an_interrupted_build_of_job_i13_is_named_as_needed_for_correctness_and_healed(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(engine, fresh, 46, *QUEUES46)
    _sql(engine, f'DROP INDEX "{fresh}".job_common_i13')
    definition = (
        f'CREATE UNIQUE INDEX CONCURRENTLY job_common_i13 ON "{fresh}".job_common '
        "(name, singleton_key) WHERE state = 'created' AND upsert_by_key"
    )
    _interrupted(engine, database_url, fresh, "job_common", definition)
    assert _invalid(engine, fresh) == ["job_common_i13"]

    code, report = _check(database_url, fresh, capsys)
    assert code == 1
    assert report["status"] == "failed"
    (finding,) = report["findings"]
    assert (finding["severity"], finding["kind"], finding["name"], finding["table"]) == (
        "heal",
        "invalid index",
        "job_common_i13",
        "job_common",
    )
    assert "needed for correctness at 46: upsert by key" in finding["detail"]
    assert "alkstore db upgrade" in finding["detail"]
    with pytest.raises(UnfinishedIndexBuildError, match="job_common_i13") as caught:
        migrate.check(engine, fresh)
    assert caught.value.version == 46

    code, result, err = _upgrade(database_url, fresh, capsys)
    assert code == 0, err
    assert result["status"] == "healed"
    assert result["healed"] == ["rebuilt the INVALID index job_common_i13 on job_common"]
    assert _invalid(engine, fresh) == []
    _clean46(engine, fresh)
    assert migrate.check(engine, fresh) == 46
    # Rebuilt with the definition it had: the upsert is unique again.
    defs = _sql(engine, "SELECT pg_get_indexdef(:i ::regclass)", i=f'"{fresh}".job_common_i13')
    assert "UNIQUE" in defs[0][0] and "upsert_by_key" in defs[0][0]


def test_an_interrupted_build_on_a_partition_is_speed_only_and_healed(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(engine, fresh, 46, *QUEUES46)
    table = _table_of(engine, fresh, "std-own")
    _sql(engine, f'DROP INDEX "{fresh}"."{table}_i15"')
    _interrupted(
        engine,
        database_url,
        fresh,
        table,
        f'CREATE INDEX CONCURRENTLY "{table}_i15" ON "{fresh}"."{table}" (name, created_on)',
    )
    code, report = _check(database_url, fresh, capsys)
    assert code == 1
    (finding,) = report["findings"]
    assert (finding["name"], finding["table"], finding["queue"]) == (
        f"{table}_i15",
        table,
        "std-own",
    )
    assert finding["detail"].startswith("speed only")

    code, result, _ = _upgrade(database_url, fresh, capsys)
    assert code == 0 and result["healed"] == [f"rebuilt the INVALID index {table}_i15 on {table}"]
    _clean46(engine, fresh)


def test_a_reindex_concurrently_leftover_is_named_and_dropped(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(engine, fresh, 46, *QUEUES46)
    _interrupted(
        engine,
        database_url,
        fresh,
        "job_common",
        f'REINDEX INDEX CONCURRENTLY "{fresh}".job_common_i11',
    )
    assert _invalid(engine, fresh) == ["job_common_i11_ccnew"]
    code, report = _check(database_url, fresh, capsys)
    assert code == 1
    (finding,) = report["findings"]
    assert (finding["kind"], finding["name"]) == ("invalid index", "job_common_i11_ccnew")
    assert "REINDEX CONCURRENTLY" in finding["detail"]

    code, result, _ = _upgrade(database_url, fresh, capsys)
    assert code == 0
    assert result["healed"] == [
        "dropped job_common_i11_ccnew on job_common, a leftover of an interrupted REINDEX"
    ]
    assert _invalid(engine, fresh) == []
    _clean46(engine, fresh)


@pytest.mark.slow  # builds every background index
def test_missing_background_builds_and_their_bam_rows_are_finished(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # What a Node start() killed before its background runner finished leaves: the
    # migration committed, the bam rows pending, the indexes not built.
    _install(engine, fresh, 46, *QUEUES46)
    fifo = _table_of(engine, fresh, "fifo-own")
    _sql(engine, f'DROP INDEX "{fresh}".job_common_i8; DROP INDEX "{fresh}"."{fifo}_i8"')
    _sql(
        engine,
        f'INSERT INTO "{fresh}".bam (name, version, status, table_name, command) VALUES '
        "('job_i8', 46, 'pending', 'job_common', 'CREATE UNIQUE INDEX ...'), "
        "('job_i8', 46, 'in_progress', :t, 'CREATE UNIQUE INDEX ...')",
        t=fifo,
    )
    code, report = _check(database_url, fresh, capsys)
    assert code == 1
    kinds = sorted((f["kind"], f["name"]) for f in report["findings"])
    assert kinds == [
        *sorted([("missing index", "job_common_i8"), ("missing index", f"{fifo}_i8")]),
        ("unfinished build", "job_i8 (version 46)"),
        ("unfinished build", "job_i8 (version 46)"),
    ]
    missing = [f for f in report["findings"] if f["kind"] == "missing index"]
    assert all("needed for correctness at 46: key_strict_fifo" in f["detail"] for f in missing)

    code, result, _ = _upgrade(database_url, fresh, capsys)
    assert code == 0
    assert result["healed"] == [
        "built job_common_i8 on job_common (schema 46's definition)",
        f"built {fifo}_i8 on {fifo} (schema 46's definition)",
        "completed 2 unfinished background build row(s) in bam",
    ]
    assert catalog.bam_rows(engine, fresh) == sorted(
        [("job_i8", 46, "completed", "job_common"), ("job_i8", 46, "completed", fifo)]
    )
    _clean46(engine, fresh)


def test_an_interrupted_migration_is_named_and_finished_by_its_own_revision(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Revision 46 committed its transaction (the version row reads 46) but was stopped
    # during its index builds: our revision still records 45, job_common_i16 is missing.
    _install(engine, fresh, 46, *QUEUES46)
    _sql(engine, f'DROP INDEX "{fresh}".job_common_i16')
    _sql(engine, f"UPDATE \"{fresh}\".alkstore_alembic_version SET version_num = 'alkstore_0045'")
    code, report = _check(database_url, fresh, capsys)
    assert code == 1
    assert [(f["severity"], f["kind"], f["name"]) for f in report["findings"]] == [
        ("heal", "missing index", "job_common_i16"),
        ("warn", "version disagrees", "alkstore_alembic_version"),
    ]
    assert report["findings"][0]["detail"].startswith("speed only")

    code, result, _ = _upgrade(database_url, fresh, capsys)
    assert code == 0 and result["status"] == "upgraded" and result["healed"] == []
    _clean46(engine, fresh)


# ----------------------------------------------------------------- version row vs catalog


def test_a_version_row_its_catalog_does_not_match_is_refused_before_anything_is_written(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(engine, fresh, 46, *QUEUES46)
    _sql(engine, f'UPDATE "{fresh}".version SET version = 44')
    _sql(engine, f"UPDATE \"{fresh}\".alkstore_alembic_version SET version_num = 'alkstore_0044'")
    before = catalog.snapshot(engine, fresh)

    with pytest.raises(SchemaCatalogError) as caught:
        migrate.upgrade(engine, fresh, schema_version=46)
    error = caught.value
    assert (error.schema, error.version, error.closest) == (fresh, 44, 46)
    assert "says pg-boss schema version 44 but its catalog is not version 44's" in str(error)
    assert "extra column queue.retained_count: an object of another schema version" in str(error)
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("before", "after refusal"))

    code, _, err = _upgrade(database_url, fresh, capsys)
    assert code == 1 and "closest to version 46" in err and len(err.strip().splitlines()) == 1
    code, report = _check(database_url, fresh, capsys)
    assert code == 1 and report["closest_version"] == 46
    named = [f for f in report["findings"] if f["name"] == "queue.retained_count"]
    assert [(f["severity"], f["kind"]) for f in named] == [("refuse", "extra column")]
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("before", "after the CLI"))


def test_a_missing_column_and_a_changed_type_are_named(
    engine: Engine, fresh: str, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    _install(engine, fresh, 46)
    _sql(engine, f'ALTER TABLE "{fresh}".queue DROP COLUMN retained_count')
    _sql(engine, f'ALTER TABLE "{fresh}".instance ALTER COLUMN host TYPE varchar(300)')
    with pytest.raises(SchemaCatalogError) as caught:
        migrate.check(engine, fresh)
    assert caught.value.problems == (
        "column differs instance.host: expected text not null, "
        "found character varying(300) not null",
        "missing column queue.retained_count: integer",
    )
    with pytest.raises(SchemaCatalogError):
        migrate.upgrade(engine, fresh, schema_version=46)
    code, report = _check(database_url, fresh, capsys)
    assert code == 1 and [f["severity"] for f in report["findings"]] == ["refuse", "refuse"]


def test_an_index_a_user_added_is_a_warning_and_left_alone(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _install(engine, fresh, 46, *QUEUES46)
    _sql(engine, f'CREATE INDEX my_created_on ON "{fresh}".job_common (created_on)')
    code, report = _check(database_url, fresh, capsys)
    assert code == 0 and report["status"] == "ok"
    assert report["findings"] == [
        {
            "severity": "warn",
            "kind": "extra index",
            "name": "my_created_on",
            "table": "job_common",
            "detail": "not part of pg-boss schema 46; left alone",
            "queue": None,
        }
    ]
    assert migrate.upgrade(engine, fresh, schema_version=46).healed == ()
    assert _sql(engine, "SELECT to_regclass(:i) IS NOT NULL", i=f'"{fresh}".my_created_on') == [
        (True,)
    ]


def test_our_revision_ahead_of_the_version_row_is_refused(
    engine: Engine, fresh: str, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    _install(engine, fresh, 26)
    _sql(engine, f"UPDATE \"{fresh}\".alkstore_alembic_version SET version_num = 'alkstore_0046'")
    with pytest.raises(SchemaCatalogError, match="our revision records schema 46 but the version"):
        migrate.check(engine, fresh)
    code, _, err = _upgrade(database_url, fresh, capsys)
    assert code == 1 and "our revision records schema 46" in err


def test_a_version_row_node_moved_past_our_revision_is_a_warning_and_upgrade_records_it(
    engine: Engine, fresh: str, capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    # What Node pg-boss 12.38 starting with migrate: true leaves (tested against Node in
    # test_interop46_upgrade_races.py): the 46 catalog, our revision still at 26.
    _install(engine, fresh, 46, *QUEUES46)
    _sql(engine, f"UPDATE \"{fresh}\".alkstore_alembic_version SET version_num = 'alkstore_0001'")
    code, report = _check(database_url, fresh, capsys)
    assert code == 0
    assert [(f["severity"], f["kind"]) for f in report["findings"]] == [
        ("warn", "version disagrees")
    ]
    code, result, _ = _upgrade(database_url, fresh, capsys)
    assert code == 0 and result["revision"] == "alkstore_0046"
    assert "recorded schema 46, which Node pg-boss migrated the schema to" in result["message"]
    _clean46(engine, fresh)


# ----------------------------------------------------------------- races


def _lock_key(database: str, schema: str) -> int:
    digest = hashlib.sha224(f"{database}.pgboss.{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def advisory_holders(engine: Engine, key: int) -> list[tuple[int, bool]]:
    """``(pid, granted)`` of every session holding or awaiting advisory lock ``key``."""
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    return [
        (int(r[0]), bool(r[1]))
        for r in _sql(
            engine,
            "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid::bigint = :hi AND objid::bigint = :lo ORDER BY granted DESC, pid",
            hi=unsigned >> 32,
            lo=unsigned & 0xFFFFFFFF,
        )
    ]


@pytest.mark.subprocess
def test_upgrade_holds_pg_boss_migration_lock_key_while_it_works(
    engine: Engine, database_url: str, fresh: str
) -> None:
    _install(engine, fresh, 26)
    database = str(_sql(engine, "SELECT current_database()")[0][0])
    key = _lock_key(database, fresh)
    errors: list[BaseException] = []
    with engine.connect() as blocker:
        # The upgrade takes the lock, then waits on the version row this transaction holds.
        blocker.execute(text(f'LOCK TABLE "{fresh}".version IN ACCESS EXCLUSIVE MODE'))

        def run() -> None:
            try:
                migrate.upgrade(database_url, fresh, schema_version=46)
            except BaseException as exc:  # reported below
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 30
        while not advisory_holders(engine, key) and time.monotonic() < deadline:
            time.sleep(0.05)
        holders = advisory_holders(engine, key)
        blocker.rollback()
    thread.join(60)
    assert errors == []
    assert len(holders) == 1 and holders[0][1], holders
    assert advisory_holders(engine, key) == []  # released afterwards
    _clean46(engine, fresh)


def _cli(database_url: str, *argv: str, app: str = "alkstore-test") -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env["PGAPPNAME"] = app  # libpq's application_name: finds these sessions, not others'
    return subprocess.Popen(
        [*CLI, *argv, "--database-url", database_url, "--json"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _lock_pollers(engine: Engine, app: str) -> int:
    """Sessions named ``app`` whose last statement tried pg-boss's migration lock (waiting
    upgrades); the name keeps other tests' upgrades, in parallel workers, out of the count."""
    found = _sql(
        engine,
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
        "AND application_name = :app AND query LIKE 'SELECT pg_try_advisory_lock(%'",
        app=app,
    )
    return int(found[0][0])


@pytest.mark.subprocess
def test_two_upgrades_at_once_one_works_the_other_waits_and_finds_nothing_to_do(
    engine: Engine, database_url: str, fresh: str
) -> None:
    database = str(_sql(engine, "SELECT current_database()")[0][0])
    key = _lock_key(database, fresh)
    argv = ("db", "upgrade", "--schema-version", "46", "--schema", fresh)
    app = f"alkstore-test-{fresh}"
    before = _lock_pollers(engine, app)
    with engine.connect() as holder:
        # Both start while the lock is held, so both are waiting when it is released.
        holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        holder.commit()
        procs = [_cli(database_url, *argv, app=app), _cli(database_url, *argv, app=app)]
        deadline = time.monotonic() + 60
        while _lock_pollers(engine, app) < before + 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        waiting = _lock_pollers(engine, app) - before
        assert all(p.poll() is None for p in procs)  # neither went ahead
        assert _sql(engine, "SELECT to_regclass(:t)", t=f'"{fresh}".version') == [(None,)]
        holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        holder.commit()
    outcomes = [p.communicate(timeout=120) for p in procs]
    assert waiting >= 2
    assert [p.returncode for p in procs] == [0, 0], outcomes
    statuses = sorted(json.loads(out)["status"] for out, _ in outcomes)
    assert statuses == ["unchanged", "upgraded"], outcomes
    assert migrate.current(engine, fresh) == "alkstore_0046"
    _clean46(engine, fresh)
    assert catalog.bam_rows(engine, fresh) == []
