"""Golden schema: our migration builds exactly what Node pg-boss 11.1.2 builds.

The reference is ``PgBoss.getConstructionPlans(schema)`` of the pinned npm package,
applied to an empty schema. Every catalog fact is compared (tables, column order,
types, defaults, nullability, constraints, indexes, partitions, partition key, enum
labels, function signatures, the version row), except the bodies of the two SQL
functions, which are our own code and are compared by behaviour in
``test_sql_functions.py``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import Engine
from support import catalog, pgboss_plans
from support.node import node46_modules
from support.schemas import (
    install_with_node_plan,
    random_schema,
    schema_exists,
    throwaway,
)

from alkstore_sa import migrate

__all__ = ["node46_modules"]  # a fixture


def _node_catalog(engine: Engine, database_url: str, schema: str) -> catalog.Catalog:
    # pg-boss writes the schema name into its SQL unquoted, so PostgreSQL folds it
    # to lower case: the objects land in lower(schema).
    landed = schema.lower()
    with throwaway(engine, landed):
        install_with_node_plan(database_url, schema)
        return catalog.snapshot(engine, landed)


def _our_catalog(engine: Engine, schema: str) -> catalog.Catalog:
    with throwaway(engine, schema):
        migrate.upgrade(engine, schema, schema_version=26)
        return catalog.snapshot(engine, schema)


@pytest.mark.interop
def test_migration_catalog_equals_pgboss_construction_plan(
    engine: Engine, database_url: str
) -> None:
    schema = random_schema()
    theirs = _node_catalog(engine, database_url, schema)
    ours = _our_catalog(engine, schema)
    catalog.assert_same(theirs, ours, ("pg-boss 11.1.2", "alkstore migration"))


@pytest.mark.interop
def test_golden_catalog_covers_every_schema26_object(engine: Engine, database_url: str) -> None:
    # Guards the comparison itself: an empty or partial snapshot would compare equal too.
    theirs = _node_catalog(engine, database_url, random_schema())
    relations = {line.split()[0] for line in theirs["relations"]}
    assert relations == {
        "version",
        "version_pkey",
        "queue",
        "queue_pkey",
        "schedule",
        "schedule_pkey",
        "subscription",
        "subscription_pkey",
        "job",
        "job_pkey",
        "job_common",
        "job_common_pkey",
        *(f"job_i{n}" for n in range(1, 7)),
    }
    assert theirs["types"] == [
        "_job_state (b) -",  # the enum's array type
        "job_state (e) created,retry,active,completed,cancelled,failed",
    ]
    assert [f.split("(")[0] for f in theirs["functions"]] == ["create_queue", "delete_queue"]
    assert theirs["version"] == ["(26, None)"]
    assert len([c for c in theirs["columns"] if c.startswith("job.")]) == 22


@pytest.mark.interop
def test_migration_quotes_a_mixed_case_schema_name(engine: Engine, database_url: str) -> None:
    schema = random_schema("Boss_Q_")
    theirs = _node_catalog(engine, database_url, schema)
    with throwaway(engine, schema):
        migrate.upgrade(engine, schema, schema_version=26)
        ours = catalog.snapshot(engine, schema)
        # Everything is in the schema spelled exactly as given, nothing in its folded twin.
        assert not schema_exists(engine, schema.lower())
    catalog.assert_same(theirs, ours, ("pg-boss 11.1.2 (folded name)", "alkstore migration"))


@pytest.mark.interop
def test_pgboss_folds_a_mixed_case_schema_name_to_lower_case(
    engine: Engine, database_url: str
) -> None:
    # Documented interop caveat: Node pg-boss given "Boss_Q" works in schema boss_q,
    # so a Python service sharing its queues must be given the lower-case name.
    schema = random_schema("Boss_Q_")
    with throwaway(engine, schema.lower()):
        install_with_node_plan(database_url, schema)
        assert schema_exists(engine, schema.lower())
        assert not schema_exists(engine, schema)


def test_snapshot_diff_names_the_differing_fact(engine: Engine) -> None:
    # The failure message must point at the difference, not dump two catalogs.
    schema = random_schema()
    with throwaway(engine, schema):
        migrate.upgrade(engine, schema, schema_version=26)
        before = catalog.snapshot(engine, schema)
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP INDEX "{schema}".job_i6')
        after = catalog.snapshot(engine, schema)
    found = catalog.diff(before, after)
    assert "-[indexes] job_i6: CREATE UNIQUE INDEX job_i6 ON <schema>.job_common" in found
    changed = [line for line in found.splitlines() if line.startswith(("-[", "+["))]
    assert changed and all(line.startswith("-[") and "job_i6" in line for line in changed)


@pytest.mark.interop
@pytest.mark.parametrize("name", ["t_0123456789ab", "MixedCase_Name"])
def test_node_plans_renamed_from_the_template_are_the_plans_node_writes(
    name: str, node46_modules: None
) -> None:
    # The tests ask Node for each version's plan once and rename it (support.pgboss_plans).
    assert pgboss_plans.TEMPLATE_SCHEMA not in pgboss_plans.construction_plan(name)
    assert pgboss_plans.construction_plan(name) == pgboss_plans.construction_plan_from_node(name)
    assert pgboss_plans.construction_plan46(name) == pgboss_plans.construction_plan46_from_node(
        name
    )
