"""Interop at schema 46: Node pg-boss 12.38.0 and our schema, each on the other's.

- Node 12.38.0 started on our schema 26 migrates it itself (its background runner builds
  the indexes); the result is what its command line gives, and what our revisions give.
- Node 12.38.0's ``createQueue`` on our 46 runs our ``create_queue`` function: the queue
  rows, partitions and indexes equal those its own function makes, and a job goes through.
- After Node migrated the schema, our runtime refuses it and ``alkstore db current`` says
  who moved it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine
from support import catalog
from support.node import (
    NodeBoss46,
    node46,
    node46_modules,
    node_connection_string,
    node_url,
    pgboss46_migrate,
    schema_version,
)
from support.pgboss_plans import client_statements
from support.schemas import drop_schema, install_with_node_plan, random_schema, run_script

from alkstore_sa import UnfinishedIndexBuildError, migrate
from alkstore_sa.cli import main

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop

QUEUES_26: list[list[Any]] = [
    ["create-queue", "plain", {}],
    ["create-queue", "parted", {"partition": True}],
    ["create-queue", "parted-stately", {"policy": "stately", "partition": True}],
]

POLICIES_46 = ["standard", "short", "singleton", "stately", "exclusive", "key_strict_fifo"]


@pytest.fixture
def new_schema(engine: Engine) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def new() -> str:
        made.append(random_schema("i46_"))
        return made[-1]

    yield new
    for name in made:
        drop_schema(engine, name)


def _create_queues_26(database_url: str, schema: str) -> None:
    for statement in client_statements([schema], QUEUES_26)[schema]:
        run_script(database_url, statement)


def _wait_for_bam(boss: NodeBoss46, timeout: float = 60) -> dict[str, int]:
    """Wait until Node's background runner has no pending or running row; its status."""
    deadline = time.monotonic() + timeout
    while True:
        statuses = {row["status"]: row["count"] for row in boss.call("getBamStatus")}
        if set(statuses) <= {"completed", "failed"} and not boss.call("isBamWorking"):
            return statuses
        if time.monotonic() > deadline:
            return statuses
        time.sleep(0.2)


def test_node_1238_started_on_our_26_migrates_it_as_its_command_line_and_our_revisions_do(
    node46: Callable[..., NodeBoss46],
    engine: Engine,
    database_url: str,
    new_schema: Callable[[], str],
) -> None:
    by_node = new_schema()
    migrate.upgrade(engine, by_node, schema_version=26)
    _create_queues_26(database_url, by_node)
    boss = node46(by_node, migrate=True)
    statuses = _wait_for_bam(boss)
    boss.close()
    assert set(statuses) == {"completed"}, statuses
    assert schema_version(engine, by_node) == [46]

    by_cli = new_schema()
    install_with_node_plan(database_url, by_cli)
    _create_queues_26(database_url, by_cli)
    pgboss46_migrate(node_connection_string(database_url), by_cli)
    catalog.assert_same(
        catalog.structural(catalog.snapshot(engine, by_cli)),
        catalog.structural(catalog.snapshot(engine, by_node)),
        ("pg-boss migrate (CLI)", "pg-boss 12.38.0 start() on our 26"),
    )

    ours = new_schema()
    migrate.upgrade(engine, ours, schema_version=26)
    _create_queues_26(database_url, ours)
    migrate.upgrade(engine, ours, schema_version=46)
    catalog.assert_same(
        catalog.structural(catalog.snapshot(engine, by_node)),
        catalog.structural(catalog.snapshot(engine, ours)),
        ("pg-boss 12.38.0 start() on our 26", "alkstore 26 upgraded to 46"),
    )


def test_after_node_1238_migrated_our_26_the_runtime_accepts_it_and_db_current_says_so(
    node46: Callable[..., NodeBoss46],
    engine: Engine,
    database_url: str,
    new_schema: Callable[[], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    schema = new_schema()
    migrate.upgrade(engine, schema, schema_version=26)
    node46(schema, migrate=True).close()
    # Stopped before its background runner built the indexes: the version is spoken, and
    # the check names what is left (docs/how-to/alembic.md, "Checking and healing").
    with pytest.raises(UnfinishedIndexBuildError, match="missing index job_common_i13") as left:
        migrate.check(engine, schema)
    assert left.value.version == 46
    capsys.readouterr()
    code = main(["db", "current", "--json", "--database-url", database_url, "--schema", schema])
    assert code == 0
    assert json.loads(capsys.readouterr().out) == {
        "schema": schema,
        "revision": "alkstore_0001",
        "version": 46,
        "node_releases": "Node pg-boss 12.38.0",
        "message": "schema 46 (Node pg-boss 12.38.0); our revision alkstore_0001 left it at 26",
    }


def test_node_1238_create_queue_on_our_46_equals_its_own_and_a_job_goes_through(
    node46: Callable[..., NodeBoss46],
    engine: Engine,
    database_url: str,
    new_schema: Callable[[], str],
) -> None:
    theirs, ours = new_schema(), new_schema()
    install_with_node_plan(database_url, theirs)
    pgboss46_migrate(node_connection_string(database_url), theirs)
    migrate.upgrade(engine, ours, schema_version=46)
    for schema in (theirs, ours):
        boss = node46(schema, migrate=False)
        for policy in POLICIES_46:
            for partition in (False, True):
                name = f"{policy}-{'p' if partition else 'c'}"
                boss.call("createQueue", name, {"policy": policy, "partition": partition})
        job_id = boss.call("send", "standard-p", {"n": 1})
        [job] = boss.call("fetch", "standard-p")
        assert job["id"] == job_id
        boss.call("complete", "standard-p", job_id, {"done": True})
        assert boss.call("getJobById", "standard-p", job_id)["state"] == "completed"
        assert boss.errors() == []
        boss.close()
    theirs_snap = catalog.structural(catalog.snapshot(engine, theirs))
    ours_snap = catalog.structural(catalog.snapshot(engine, ours))
    catalog.assert_same(theirs_snap, ours_snap, ("pg-boss create_queue", "our create_queue"))
    partitions = [r for r in ours_snap["relations"] if r.endswith(" parent=job")]
    assert len(partitions) == 1 + len(POLICIES_46)  # job_common and one per policy


def test_construction_scripts_renamed_equal_made(node46_modules: None) -> None:
    # The interop tests build their schemas from one script per maker, renamed
    # (support.interop46.construction_script): renaming must give what each maker writes.
    from support.interop46 import construction_script, node_plan

    name = random_schema("i46_")
    assert construction_script("alkstore", name) == migrate.offline_sql(name, schema_version=46)
    assert construction_script("node", name) == node_plan(name)
