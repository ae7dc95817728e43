"""Interop, start-up: one schema, created by either side, accepted by the other.

Node pg-boss checks only ``<schema>.version`` (its start-up version check); our migration adopts
a schema Node installed at version 26 (docs/how-to/alembic.md). These tests prove both ways.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from support import catalog
from support.node import (
    NodeError,
    NodeFactory,
    function_bodies,
    in_tx,
    node,
    node_modules,
    node_url,
    schema_version,
)

from alkstore_sa import SchemaVersionError, cli, migrate
from alkstore_sa.names import SEND_IT_QUEUE

__all__ = ["node", "node_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop


@pytest.fixture
def empty_schema(engine: Engine) -> Iterator[str]:
    """A schema name with nothing in it yet; dropped after the test."""
    name = "t_" + uuid.uuid4().hex[:12]
    yield name
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


def structure(engine: Engine, schema: str) -> catalog.Catalog:
    """The schema's catalog without the version row (Node's timekeeper stamps cron_on)."""
    snap = catalog.snapshot(engine, schema)
    del snap["version"]
    return snap


def test_node_starts_without_migrating_on_a_schema_made_by_alkstore_db_upgrade(
    engine: Engine, database_url: str, empty_schema: str, node: NodeFactory
) -> None:
    where = ["--database-url", database_url, "--schema", empty_schema]
    code = cli.main([*where, "db", "upgrade", "--schema-version", "26"])
    assert code == 0

    boss = node(empty_schema, migrate=False)
    boss.call("createQueue", "mail", {})
    job_id = boss.call("send", "mail", {"to": "a@example.com"})
    [job] = boss.call("fetch", "mail")
    assert job["id"] == job_id and job["data"] == {"to": "a@example.com"}
    assert boss.errors() == []


def test_node_start_with_migrate_changes_no_catalog_object(
    engine: Engine, schema: str, node: NodeFactory
) -> None:
    before = structure(engine, schema)
    bodies = function_bodies(engine, schema)
    # Everything on, so every start-up step runs (install check, send-it queue, cron).
    boss = node(schema, migrate=True, supervise=True, schedule=True)
    assert boss.call("getQueue", SEND_IT_QUEUE) is not None
    boss.close()

    catalog.assert_same(before, structure(engine, schema), ("before Node", "after Node"))
    assert function_bodies(engine, schema) == bodies
    assert schema_version(engine, schema) == [26]
    assert boss.errors() == []


def test_node_refuses_to_start_without_migrating_on_a_missing_schema(
    empty_schema: str, node: NodeFactory
) -> None:
    with pytest.raises(NodeError, match="not installed"):
        node(empty_schema, migrate=False)


@pytest.mark.parametrize("runner", ["migrate.upgrade", "alkstore db upgrade"])
def test_our_migration_adopts_a_schema_created_by_node(
    engine: Engine, database_url: str, empty_schema: str, node: NodeFactory, runner: str
) -> None:
    boss = node(empty_schema, migrate=True, schedule=True)
    boss.close()
    before = structure(engine, empty_schema)
    bodies = function_bodies(engine, empty_schema)
    assert len(before["indexes"]) >= 8 and len(bodies) == 2

    if runner == "migrate.upgrade":
        migrate.upgrade(engine, empty_schema, schema_version=26)
    else:
        args = ["--database-url", database_url, "--schema", empty_schema, "db", "upgrade"]
        args += ["--schema-version", "26"]
        assert cli.main(args) == 0

    # Alembic's bookkeeping table (left out of the snapshot) is the only addition;
    # nothing is duplicated, altered or replaced.
    catalog.assert_same(before, structure(engine, empty_schema), ("Node", "adopted"))
    assert function_bodies(engine, empty_schema) == bodies
    assert schema_version(engine, empty_schema) == [26]
    assert migrate.current(engine, empty_schema) == "alkstore_0001"
    assert migrate.check(engine, empty_schema) == 26


def test_python_works_on_a_schema_created_by_node(
    engine: Engine, empty_schema: str, node: NodeFactory
) -> None:
    boss = node(empty_schema, migrate=True)
    boss.call("createQueue", "from-node", {})
    node_job = boss.call("send", "from-node", {"n": 1})
    boss.close()
    migrate.upgrade(engine, empty_schema, schema_version=26)

    in_tx(engine, empty_schema, lambda q: q.create_queue("from-python", retry_limit=1))
    job_id = in_tx(engine, empty_schema, lambda q: q.send("from-python", {"n": 2}))
    [job] = in_tx(engine, empty_schema, lambda q: q.fetch("from-python"))
    in_tx(engine, empty_schema, lambda q: q.complete("from-python", job.id, {"ok": True}))
    done = in_tx(engine, empty_schema, lambda q: q.get_job("from-python", job_id))
    assert job.id == job_id
    assert done.state == "completed" and done.output == {"ok": True}
    [theirs] = in_tx(engine, empty_schema, lambda q: q.fetch("from-node"))
    assert str(theirs.id) == node_job and theirs.data == {"n": 1}


def test_our_migration_refuses_a_node_schema_at_another_version(
    engine: Engine, empty_schema: str, node: NodeFactory
) -> None:
    node(empty_schema, migrate=True).close()
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{empty_schema}".version SET version = 25'))
    with pytest.raises(SchemaVersionError):
        migrate.upgrade(engine, empty_schema, schema_version=26)
