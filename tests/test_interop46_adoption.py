"""``alkstore db upgrade`` adopting a schema Node pg-boss 12.38.0 made itself.

No revision of ours is recorded in such a schema. When its catalog is the one its version
row names (unfinished index builds aside, which the upgrade heals after), the upgrade
records our revision of that version and goes on from there; a catalog that is not the
version's is refused, and nothing is written. A schema at 46 is made by Node's ``start()``
or by its construction plan; one at 27 to 45 by that plan and then Node's own rollback
plans (``support.interop46.make_node_schema_at``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support import catalog
from support.interop46 import construction_script, make_node_schema_at
from support.node import NodeBoss46, node46, node46_modules, node_url
from support.schemas import drop_schema, random_schema, run_script

from alkstore_sa import (
    InvalidOptionsError,
    QueueService,
    SchemaCatalogError,
    SchemaVersionError,
    migrate,
    schema_health,
)
from alkstore_sa.cli import main

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop


@pytest.fixture
def new_schema(engine: Engine) -> Iterator[Callable[[], str]]:
    made: list[str] = []

    def new() -> str:
        made.append(random_schema("adopt_"))
        return made[-1]

    yield new
    for name in made:
        drop_schema(engine, name)


@pytest.fixture
def node_at(
    engine: Engine, database_url: str, node46_modules: None
) -> Iterator[Callable[[int], str]]:
    """``node_at(N)``: a fresh schema Node pg-boss 12.38.0 made at version N."""
    made: list[str] = []

    def make(version: int) -> str:
        made.append(make_node_schema_at(engine, database_url, version, prefix="adopt_"))
        return made[-1]

    yield make
    for name in made:
        drop_schema(engine, name)


def _cli(capsys: pytest.CaptureFixture[str], database_url: str, *argv: str) -> tuple[int, Any]:
    capsys.readouterr()
    code = main([*argv, "--json", "--database-url", database_url])
    out = capsys.readouterr()
    return code, json.loads(out.out) if out.out.strip() else out.err


def _column_order(engine: Engine, schema: str, table: str) -> list[str]:
    with engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = "
                    "to_regclass(quote_ident(:s) || '.' || quote_ident(:t)) "
                    "AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum"
                ),
                {"s": schema, "t": table},
            ).scalars()
        )


def _revision_table(engine: Engine, schema: str) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT to_regclass(quote_ident(:s) || '.alkstore_alembic_version')"),
                {"s": schema},
            ).scalar()
        )


def _diagnosis(engine: Engine, schema: str) -> schema_health.Diagnosis:
    with engine.connect() as conn:
        return schema_health.diagnose(conn, schema)


def test_db_upgrade_adopts_the_46_node_1238_start_made_and_changes_nothing(
    node46: Callable[..., NodeBoss46],
    engine: Engine,
    database_url: str,
    new_schema: Callable[[], str],
    capsys: pytest.CaptureFixture[str],
    spoken46: None,
) -> None:
    schema = new_schema()
    boss = node46(schema, migrate=True)
    boss.call("createQueue", "node-parted", {"partition": True})
    boss.call("createQueue", "node-shared", {})
    node_job = boss.call("send", "node-parted", {"from": "node"})
    boss.close()

    # Node's fresh install declares its columns in another order than our migrated 46:
    # the catalog comparison must not depend on it.
    ours = new_schema()
    run_script(database_url, construction_script("alkstore", ours))
    theirs_order = _column_order(engine, schema, "job_common")
    ours_order = _column_order(engine, ours, "job_common")
    assert theirs_order != ours_order
    assert sorted(theirs_order) == sorted(ours_order)

    before = catalog.snapshot(engine, schema)
    code, result = _cli(capsys, database_url, "db", "upgrade", "--schema", schema)
    assert code == 0, result
    assert result["status"] == "adopted"
    assert result["revision"] == "alkstore_0046"
    assert result["message"].startswith("adopted the schema 46 Node pg-boss created")
    assert result["healed"] == [
        "adopted schema 46, which Node pg-boss made without our revisions: recorded "
        "revision alkstore_0046 (its catalog is version 46's)"
    ]
    assert migrate.current(engine, schema) == "alkstore_0046"
    catalog.assert_same(before, catalog.snapshot(engine, schema), ("node", "after adoption"))

    code, report = _cli(capsys, database_url, "db", "check", "--schema", schema)
    assert code == 0, report
    assert report["findings"] == []

    with Session(engine) as session, session.begin():
        service = QueueService(session, schema=schema)
        [fetched] = service.fetch("node-parted")
        assert (str(fetched.id), fetched.data) == (node_job, {"from": "node"})
        service.complete("node-parted", fetched)
        own = service.send("node-shared", {"from": "python"})
    with Session(engine) as session, session.begin():
        [again] = QueueService(session, schema=schema).fetch("node-shared")
        assert again.id == own

    code, result = _cli(capsys, database_url, "db", "upgrade", "--schema", schema)
    assert code == 0, result
    assert (result["status"], result["revision"]) == ("unchanged", "alkstore_0046")
    assert result["message"] == "already at schema 46; nothing to do"


def test_a_node_46_missing_a_job_column_is_refused_and_nothing_is_written(
    engine: Engine, node_at: Callable[[int], str]
) -> None:
    schema = node_at(46)
    with engine.begin() as conn:
        conn.execute(text(f'ALTER TABLE "{schema}".job DROP COLUMN output'))
    before = catalog.snapshot(engine, schema)
    with pytest.raises(SchemaCatalogError) as refused:
        migrate.upgrade(engine, schema)
    assert "missing column job.output" in str(refused.value)
    assert "missing column job_common.output" in str(refused.value)
    assert refused.value.found == 46
    catalog.assert_same(before, catalog.snapshot(engine, schema), ("before", "after refusal"))
    assert not _revision_table(engine, schema)
    assert migrate.current(engine, schema) is None


@pytest.mark.parametrize("interrupted", ["index dropped", "index dropped, bam row pending"])
def test_a_node_46_with_an_unfinished_index_build_is_adopted_and_healed(
    engine: Engine, node_at: Callable[[int], str], interrupted: str
) -> None:
    schema = node_at(46)
    with engine.begin() as conn:
        conn.execute(text(f'DROP INDEX "{schema}".job_common_i11'))
        if "bam" in interrupted:
            conn.execute(
                text(
                    f'INSERT INTO "{schema}".bam (name, version, status, table_name, command) '
                    "VALUES ('job_i11', 46, 'pending', 'job_common', 'CREATE INDEX ...')"
                )
            )
    found = _diagnosis(engine, schema)
    assert found.refusals == [] and found.recorded is None
    assert "missing index job_common_i11" in [f"{f.kind} {f.name}" for f in found.to_heal]

    result = migrate.upgrade(engine, schema)

    assert (result.before, result.found, result.revision) == (None, 46, "alkstore_0046")
    assert result.healed[0].startswith("adopted schema 46, which Node pg-boss made")
    assert "built job_common_i11 on job_common (schema 46's definition)" in result.healed
    if "bam" in interrupted:
        assert result.healed[-1] == "completed 1 unfinished background build row(s) in bam"
        assert catalog.bam_rows(engine, schema) == [("job_i11", 46, "completed", "job_common")]
    after = _diagnosis(engine, schema)
    assert (after.version, after.recorded, list(after.findings)) == (46, 46, [])
    assert migrate.check(engine, schema) == 46


@pytest.mark.parametrize("version", [27, 38])
def test_a_schema_node_made_at_an_earlier_version_is_adopted_and_upgraded_to_46(
    engine: Engine, node_at: Callable[[int], str], version: int
) -> None:
    schema = node_at(version)
    assert _diagnosis(engine, schema).findings == ()

    result = migrate.upgrade(engine, schema)

    assert (result.before, result.found, result.revision) == (None, version, "alkstore_0046")
    assert result.healed == (
        f"adopted schema {version}, which Node pg-boss made without our revisions: recorded "
        f"revision alkstore_{version:04d} (its catalog is version {version}'s)",
    )
    after = _diagnosis(engine, schema)
    assert (after.version, after.recorded, list(after.findings)) == (46, 46, [])


def test_a_schema_node_made_at_40_is_adopted_at_40_and_refused_below_it(
    engine: Engine,
    database_url: str,
    node_at: Callable[[int], str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    schema = node_at(40)
    before = catalog.snapshot(engine, schema)
    with pytest.raises(InvalidOptionsError) as refused:
        migrate.upgrade(engine, schema, schema_version=38)
    message = str(refused.value)
    assert "is at pg-boss schema version 40, which Node pg-boss made" in message
    assert "upgrade cannot go down to 38. Nothing was changed" in message
    assert "`alkstore db downgrade --schema-version 38`" in message
    code, err = _cli(
        capsys, database_url, "db", "upgrade", "--schema-version", "38", "--schema", schema
    )
    assert code == 2 and "upgrade cannot go down to 38" in err
    catalog.assert_same(before, catalog.snapshot(engine, schema), ("before", "after refusal"))
    assert not _revision_table(engine, schema)

    result = migrate.upgrade(engine, schema, schema_version=40)
    assert (result.before, result.found, result.revision) == (None, 40, "alkstore_0040")
    catalog.assert_same(before, catalog.snapshot(engine, schema), ("node", "after adoption"))
    assert _diagnosis(engine, schema).recorded == 40
    # Adopted, going back is the explicit downgrade the refusal named.
    migrate.downgrade(engine, schema, schema_version=38)
    assert migrate.current(engine, schema) == "alkstore_0038"
    after = _diagnosis(engine, schema)
    assert (after.version, list(after.findings)) == (38, [])


def test_alembic_upgrade_on_a_node_46_still_refuses_and_names_both_ways_to_adopt(
    engine: Engine, node_at: Callable[[int], str]
) -> None:
    # What an application's own Alembic environment meets: revision alkstore_0001 runs
    # without the adoption of migrate.upgrade() and refuses, changing nothing.
    from alembic import command

    schema = node_at(46)
    before = catalog.snapshot(engine, schema)
    cfg = migrate.alembic_config(schema)
    with engine.connect() as conn:
        cfg.attributes["connection"] = conn
        with pytest.raises(SchemaVersionError, match="built by Node pg-boss") as refused:
            command.upgrade(cfg, "alkstore@head")
        conn.rollback()
    message = str(refused.value)
    assert "`alkstore db upgrade --schema-version 46` once" in message
    assert "`alembic stamp alkstore@alkstore_0046`" in message
    catalog.assert_same(before, catalog.snapshot(engine, schema), ("before", "after refusal"))
    assert migrate.current(engine, schema) is None
