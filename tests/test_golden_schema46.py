"""Golden schema 46: our revisions build what Node pg-boss 12.38.0 builds.

The oracle is the pinned npm package in ``tests/interop46`` (run by the Node 22 installed
next to it):

- its construction plan (``getConstructionPlans``), a fresh install at 46, which declares
  every column in place;
- its own migration, run by its ``pg-boss migrate`` command line (the background index
  builds inline, on ``job_common`` and every partition), applied to a schema 26 that Node
  pg-boss 11.1.2 installed. Columns added after 26 are appended, so this is the catalog
  our chain of revisions must give, column order included.

A fresh ``migrate.upgrade(schema_version=46)`` runs the same chain of revisions from
26 (docs/concepts/compatibility.md), so it equals the migrated catalog, and the
construction plan's catalog but for column order. Function bodies are not compared: ours
are our own code (``support.catalog``).

Without our revisions 27 to 46 these tests fail (an unknown revision), they do not skip.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, inspect
from support import catalog
from support.node import (
    NodeBoss46,
    function_bodies,
    node46,
    node46_modules,
    node_connection_string,
    node_url,
    pgboss46_migrate,
    schema_version,
)
from support.pgboss_plans import client_statements, construction_plan46
from support.schemas import (
    drop_schema,
    install,
    install_with_node_plan,
    random_schema,
    run_script,
)

from alkstore_sa import migrate

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

QUEUES: list[list[Any]] = [
    ["create-queue", "plain", {}],
    ["create-queue", "parted", {"partition": True}],
    ["create-queue", "parted-singleton", {"policy": "singleton", "partition": True}],
    ["create-queue", "stately", {"policy": "stately"}],
]
"""Queues created at 26 (with Node 11.1.2's own statements) before migrating: the
background index builds must reach every partition table."""

SCHEMA46_TABLES = {
    "version",
    "queue",
    "schedule",
    "subscription",
    "bam",
    "job",
    "job_common",
    "warning",
    "queue_stats",
    "job_dependency",
    "instance",
}


@pytest.fixture
def new_schema(engine: Engine) -> Iterator[Callable[[], str]]:
    """``new_schema()``: a fresh schema name, dropped after the test."""
    made: list[str] = []

    def new() -> str:
        made.append(random_schema("g46_"))
        return made[-1]

    yield new
    for name in made:
        drop_schema(engine, name)


def _create_queues(database_url: str, schema: str) -> None:
    for statement in client_statements([schema], QUEUES)[schema]:
        run_script(database_url, statement)


def _node_migrated(
    engine: Engine, database_url: str, schema: str, *, queues: bool
) -> catalog.Catalog:
    """Node 11.1.2 installs 26 (and the queues), Node 12.38.0's CLI migrates it to 46."""
    install_with_node_plan(database_url, schema)
    if queues:
        _create_queues(database_url, schema)
    pgboss46_migrate(node_connection_string(database_url), schema)
    return catalog.snapshot(engine, schema)


def _ours(engine: Engine, database_url: str, schema: str, *, queues: bool) -> catalog.Catalog:
    """Our 26 (and the same queues, with the same statements), then our revisions to 46."""
    migrate.upgrade(engine, schema, schema_version=26)
    if queues:
        _create_queues(database_url, schema)
    migrate.upgrade(engine, schema, schema_version=46)
    return catalog.snapshot(engine, schema)


def _pending(engine: Engine, schema: str) -> list[tuple[str, int, str, str | None]]:
    return [row for row in catalog.bam_rows(engine, schema) if row[2] != "completed"]


@pytest.mark.interop
def test_node_oracle_catalogs_are_schema_46(
    node46_modules: None, engine: Engine, database_url: str, new_schema: Callable[[], str]
) -> None:
    # Guards the comparisons below: an empty or partial oracle would compare equal too.
    migrated = _node_migrated(engine, database_url, new_schema(), queues=True)
    fresh_name = new_schema()
    run_script(database_url, construction_plan46(fresh_name))
    fresh = catalog.snapshot(engine, fresh_name)
    for found in (migrated, fresh):
        assert catalog.structural(found)["version"] == ["46"]
        tables = {line.split()[0] for line in found["relations"] if " kind=r " in line}
        tables |= {line.split()[0] for line in found["relations"] if " kind=p " in line}
        assert tables >= SCHEMA46_TABLES
        indexes = {line.split(":")[0] for line in found["indexes"]}
        assert indexes >= {f"job_common_i{n}" for n in range(1, 18) if n != 5}
        assert "job_common_i5" not in indexes  # v40 retires it
    # The background builds reached every partition table, not only job_common.
    partitions = [line.split()[0] for line in migrated["relations"] if line.endswith(" parent=job")]
    assert len(partitions) == 3  # job_common and the two partitioned queues
    indexes = {line.split(":")[0] for line in migrated["indexes"]}
    for table in partitions:
        assert indexes >= {f"{table}_i{n}" for n in (7, 11, 12, 13, 14, 15, 16, 17)}


@pytest.mark.interop
def test_fresh_upgrade_to_46_equals_node_migrating_an_empty_26_column_order_included(
    node46_modules: None, engine: Engine, database_url: str, new_schema: Callable[[], str]
) -> None:
    theirs = _node_migrated(engine, database_url, new_schema(), queues=False)
    ours_name = new_schema()
    migrate.upgrade(engine, ours_name, schema_version=46)
    ours = catalog.snapshot(engine, ours_name)
    catalog.assert_same(
        catalog.structural(theirs),
        catalog.structural(ours),
        ("pg-boss 12.38.0 migrating 11.1.2's 26", "alkstore upgrade to 46"),
    )
    assert _pending(engine, ours_name) == []
    assert migrate.current(engine, ours_name) == "alkstore_0046"


@pytest.mark.interop
def test_fresh_upgrade_to_46_equals_the_construction_plan_but_for_column_order(
    node46_modules: None, engine: Engine, database_url: str, new_schema: Callable[[], str]
) -> None:
    theirs_name = new_schema()
    run_script(database_url, construction_plan46(theirs_name))
    theirs = catalog.snapshot(engine, theirs_name)
    ours_name = new_schema()
    migrate.upgrade(engine, ours_name, schema_version=46)
    ours = catalog.snapshot(engine, ours_name)
    catalog.assert_same(
        catalog.structural(theirs, column_order=False),
        catalog.structural(ours, column_order=False),
        ("pg-boss 12.38.0 construction plan", "alkstore upgrade to 46"),
    )


@pytest.mark.interop
def test_our_26_upgraded_to_46_equals_node_migrating_node_1112s_26_with_partitions(
    node46_modules: None, engine: Engine, database_url: str, new_schema: Callable[[], str]
) -> None:
    theirs = _node_migrated(engine, database_url, new_schema(), queues=True)
    ours_name = new_schema()
    ours = _ours(engine, database_url, ours_name, queues=True)
    catalog.assert_same(
        catalog.structural(theirs),
        catalog.structural(ours),
        ("pg-boss 12.38.0 migrating 11.1.2's 26", "alkstore 26 upgraded to 46"),
    )
    assert _pending(engine, ours_name) == []


@pytest.mark.interop
def test_node_1238_started_on_our_46_finds_nothing_to_do(
    node46: Callable[..., NodeBoss46],
    engine: Engine,
    database_url: str,
    new_schema: Callable[[], str],
) -> None:
    schema = new_schema()
    _ours(engine, database_url, schema, queues=True)
    # Our attempt history is in the schema Node checks (docs/concepts/attempt-history.md).
    assert "alkstore_job_attempt" in inspect(engine).get_table_names(schema=schema)
    before = catalog.snapshot(engine, schema)
    bam_before = catalog.bam_rows(engine, schema)
    bodies_before = function_bodies(engine, schema)

    boss = node46(schema, migrate=True)
    # The background-migration runner polls as soon as start() resolves.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and boss.call("isBamWorking"):
        time.sleep(0.1)
    time.sleep(0.5)
    statuses = {row["status"]: row["count"] for row in boss.call("getBamStatus")}
    drift = boss.call("detectSchemaDrift")
    boss.call("stop")
    assert boss.close() == 0
    assert boss.errors() == []

    assert schema_version(engine, schema) == [46]
    assert set(statuses) <= {"completed"}, statuses
    assert catalog.bam_rows(engine, schema) == bam_before
    assert function_bodies(engine, schema) == bodies_before
    # Structural: the runner stamps version.bam_on when it polls, which is data, not DDL.
    catalog.assert_same(
        catalog.structural(before),
        catalog.structural(catalog.snapshot(engine, schema)),
        ("before", "after Node start"),
    )
    # pg-boss's own drift check finds every table, column, index and constraint it
    # expects; only function bodies may differ (ours are our own code).
    assert {k: v for k, v in drift.items() if k not in ("ok", "mismatchedFunctions")} == {
        "missingTables": [],
        "missing": [],
        "building": [],
        "invalid": [],
        "extraIndexes": [],
        "mismatched": [],
        "missingFunctions": [],
        "columnDrift": [],
        "constraintDrift": [],
        "enumDrift": None,
    }


FAST_TIER_DOWNGRADES = frozenset({27, 38, 46})
"""The first step past 26 (the background-build table arrives), the step that adds
key-strict FIFO's head index, and the newest; the slow tier runs the other seventeen."""


@pytest.mark.parametrize(
    "version",
    [
        pytest.param(v, marks=() if v in FAST_TIER_DOWNGRADES else pytest.mark.slow)
        for v in range(27, 47)
    ],
)
def test_downgrade_from_each_version_returns_the_catalog_of_the_one_before(
    version: int, engine: Engine, database_url: str, new_schema: Callable[[], str]
) -> None:
    schema = new_schema()
    # The step under test is the upgrade to `version` and back; the schema before it comes
    # from the offline script (the same catalog, tests/test_fast_schema.py).
    install(database_url, schema, version - 1)
    expected = catalog.structural(catalog.snapshot(engine, schema))
    migrate.upgrade(engine, schema, schema_version=version)
    assert catalog.structural(catalog.snapshot(engine, schema))["version"] == [str(version)]
    migrate.downgrade(engine, schema, schema_version=version - 1)
    catalog.assert_same(
        expected,
        catalog.structural(catalog.snapshot(engine, schema)),
        (f"upgraded to {version - 1}", f"upgraded to {version}, downgraded to {version - 1}"),
    )
    assert migrate.current(engine, schema) == migrate.revision_for(version - 1)
    assert _pending(engine, schema) == []
