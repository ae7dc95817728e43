"""The tests' fast schema (``support.schemas.install``) is the schema the migrations build.

Most tests get their schema from our revisions' offline script, rendered once per session
for a template name and renamed (milliseconds, against a quarter of a second for
``migrate.upgrade``). These tests keep that shortcut from drifting: for each version the
runtime speaks, the renamed script is the script rendered for the real name, and running it
builds the same catalog, function bodies, version row and recorded revision as the online
upgrade does.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support import catalog, upkeep
from support.schemas import (
    TEMPLATE_SCHEMA,
    SchemaPool,
    install,
    libpq_url,
    migration_script,
    random_schema,
    schema_exists,
    throwaway,
)
from support.upkeep import CatalogVacuum

from alkstore_sa import QueueService, migrate

VERSIONS = [26, 46]


def _bodies(engine: Engine, schema: str) -> list[tuple[str, str, str]]:
    # Function bodies, with the schema's own name written as <schema>: the catalog
    # snapshot leaves bodies out, and here they must match too.
    sql = text(
        "SELECT p.proname, pg_get_function_identity_arguments(p.oid), "
        "replace(p.prosrc, :s, '<schema>') "
        "FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = :s ORDER BY 1, 2"
    )
    with engine.connect() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(sql, {"s": schema})]


@pytest.mark.parametrize("version", VERSIONS)
def test_renamed_script_is_the_script_rendered_for_the_name(version: int) -> None:
    # The renaming serves lower-case words (``install`` builds any other name online).
    name = "t_" + uuid.uuid4().hex[:12]
    assert TEMPLATE_SCHEMA not in migration_script(version, name)
    assert migration_script(version, name) == migrate.offline_sql(name, schema_version=version)


@pytest.mark.parametrize("version", VERSIONS)
def test_fast_schema_has_the_catalog_the_online_upgrade_builds(
    engine: Engine, database_url: str, version: int
) -> None:
    online, fast = random_schema(), random_schema()
    with throwaway(engine, online, fast):
        migrate.upgrade(engine, online, schema_version=version)
        install(database_url, fast, version)

        catalog.assert_same(
            catalog.structural(catalog.snapshot(engine, online, ignore=())),
            catalog.structural(catalog.snapshot(engine, fast, ignore=())),
            labels=("migrate.upgrade", "support.schemas.install"),
        )
        online_bodies, fast_bodies = _bodies(engine, online), _bodies(engine, fast)
        assert online_bodies == fast_bodies
        assert len(fast_bodies) > 0
        assert migrate.current(engine, fast) == migrate.current(engine, online)
        assert migrate.current(engine, fast) == migrate.revision_for(version)
        assert migrate.current_version(engine, fast) == version
        # And it is healthy by the same check the services run at start.
        assert migrate.check(engine, fast) == version


def test_the_catalog_vacuum_takes_turns_between_test_workers(database_url: str) -> None:
    # tests/support/upkeep.py: one pass at a time across the workers of a run.
    vacuum = CatalogVacuum(database_url)
    assert vacuum.vacuum_once() is True
    with psycopg.connect(libpq_url(database_url), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", (upkeep._LOCK_KEY,))
        assert vacuum.vacuum_once() is False
        other.execute("SELECT pg_advisory_unlock(%s)", (upkeep._LOCK_KEY,))
    assert vacuum.vacuum_once() is True


@pytest.mark.parametrize("version", VERSIONS)
def test_a_pooled_schema_comes_back_empty_with_its_catalog_and_version_row(
    engine: Engine, database_url: str, version: int
) -> None:
    pool = SchemaPool(database_url, engine)
    try:
        name = pool.take(version)
        before = catalog.snapshot(engine, name, ignore=())
        with engine.connect() as conn:
            version_row = conn.execute(text(f'SELECT * FROM "{name}".version')).all()
        with Session(engine) as session, session.begin():
            service = QueueService(session, schema=name)
            service.create_queue("pooled")
            assert service.send("pooled", {"n": 1}) is not None
        with engine.begin() as conn:
            conn.execute(text(f'UPDATE "{name}".version SET cron_on = now()'))
        pool.give_back(name)

        assert pool.take(version) == name
        assert catalog.snapshot(engine, name, ignore=()) == before
        with engine.connect() as conn:
            assert conn.execute(text(f'SELECT * FROM "{name}".version')).all() == version_row
            for table in ("queue", "job"):
                count = conn.execute(text(f'SELECT count(*) FROM "{name}".{table}')).scalar()
                assert count == 0, table
        pool.give_back(name)
    finally:
        pool.close()
    assert not schema_exists(engine, name)


def test_a_schema_whose_catalog_a_test_changed_is_dropped_not_pooled(
    engine: Engine, database_url: str
) -> None:
    pool = SchemaPool(database_url, engine)
    try:
        name = pool.take(26)
        with Session(engine) as session, session.begin():
            # A partitioned queue gets its own table: the catalog is no longer as installed.
            QueueService(session, schema=name).create_queue("own", partition=True)
        pool.give_back(name)
        assert not schema_exists(engine, name)
        other = pool.take(26)
        assert other != name
    finally:
        pool.close()
    # Closing drops what the pool made, a schema still taken too: no test leaves one behind.
    assert not schema_exists(engine, other)
