"""The three ways to run the migrations, adoption of Node's schema, downgrade, autogenerate.

(A) inside an application's own Alembic environment (a throw-away project per test),
(B) standalone through ``alkstore db upgrade``, (C) offline SQL. Each way, aimed at schema
26, must give the catalog of Node pg-boss 11.1.2's construction plan (the golden
reference); aimed at the default (46), the catalog ``migrate.upgrade`` builds at 46
(tests/test_golden_schema46.py compares that one with pg-boss 12.38.0).
"""

from __future__ import annotations

import argparse
import ast
import gc
import io
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Column, Engine, Integer, MetaData, Table, Text, text
from support import catalog
from support.pgboss_plans import client_statements
from support.schemas import (
    drop_schema,
    install_with_node_plan,
    random_schema,
    run_script,
    schema_exists,
    throwaway,
)

from alkstore_sa import (
    ForeignRevisionError,
    SchemaNotInstalledError,
    SchemaVersionError,
    alembic_filters,
    migrate,
)
from alkstore_sa.cli import main
from alkstore_sa.migrations import VERSIONS_DIR, foreign_revisions
from alkstore_sa.models import metadata as alkstore_metadata

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def reference(engine: Engine, database_url: str) -> catalog.Catalog:
    """The catalog of Node pg-boss 11.1.2's construction plan."""
    schema = random_schema()
    with throwaway(engine, schema):
        install_with_node_plan(database_url, schema)
        return catalog.snapshot(engine, schema)


@pytest.fixture(scope="module")
def reference46(engine: Engine) -> catalog.Catalog:
    """The shape of the schema 46 that ``migrate.upgrade`` builds."""
    schema = random_schema()
    with throwaway(engine, schema):
        migrate.upgrade(engine, schema, schema_version=46)
        return catalog.structural(catalog.snapshot(engine, schema))


@pytest.fixture
def fresh(engine: Engine) -> Iterator[str]:
    """A schema name, dropped after the test whatever created it."""
    name = random_schema()
    with throwaway(engine, name):
        yield name


# --------------------------------------------------------------------- (A) user env

USER_ENV = """
from alembic import context
from sqlalchemy import Column, Integer, MetaData, Table, Text, engine_from_config, pool

from alkstore_sa import alembic_filters

APP = {app!r}
config = context.config
target_metadata = MetaData(schema=APP)
Table("customer", target_metadata, Column("id", Integer, primary_key=True), Column("name", Text))

common = dict(target_metadata=target_metadata, version_table={version_table!r},
              include_schemas=True, **alembic_filters.combine())

if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"),
                      literal_binds=config.attributes.get("literal_binds", True), **common)
    with context.begin_transaction():
        context.run_migrations()
else:
    engine = engine_from_config(config.get_section(config.config_ini_section, {{}}),
                                prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as connection:
        context.configure(connection=connection, **common)
        with context.begin_transaction():
            context.run_migrations()
"""

USER_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "app_0001"
down_revision = None
branch_labels = ("app",)
depends_on = None


def upgrade():
    op.execute(sa.schema.CreateSchema({app!r}, if_not_exists=True))
    op.create_table("customer", sa.Column("id", sa.Integer, primary_key=True),
                    sa.Column("name", sa.Text), schema={app!r})


def downgrade():
    op.drop_table("customer", schema={app!r})
    op.execute(sa.schema.DropSchema({app!r}))
"""

USER_INI = """
[alembic]
script_location = %(here)s/migrations
version_locations = %(here)s/migrations/versions alkstore_sa:migrations/versions
path_separator = space
"""


@dataclass
class UserProject:
    """An application with its own Alembic environment, table and revision."""

    root: Path
    app_schema: str
    version_table: str
    database_url: str

    def config(self, schema: str | None = None, *, via: str = "x") -> Config:
        cfg = Config(str(self.root / "alembic.ini"))
        cfg.set_main_option("sqlalchemy.url", self.database_url)
        cfg.output_buffer = io.StringIO()
        if schema is not None and via == "x":
            cfg.cmd_opts = argparse.Namespace(x=[f"alkstore_schema={schema}"])
        elif schema is not None:
            cfg.attributes["alkstore_schema"] = schema
        return cfg

    def recorded(self, engine: Engine) -> set[str]:
        with engine.connect() as conn:
            rows = conn.execute(text(f"SELECT version_num FROM public.{self.version_table}"))
            return {r[0] for r in rows}


@pytest.fixture
def user_project(tmp_path: Path, engine: Engine, database_url: str) -> Iterator[UserProject]:
    app = random_schema("app_")
    version_table = "alembic_version_" + uuid.uuid4().hex[:8]
    versions = tmp_path / "migrations" / "versions"
    versions.mkdir(parents=True)
    (tmp_path / "alembic.ini").write_text(USER_INI)
    (tmp_path / "migrations" / "env.py").write_text(
        USER_ENV.format(app=app, version_table=version_table)
    )
    (versions / "app_0001_customer.py").write_text(USER_REVISION.format(app=app))
    try:
        yield UserProject(tmp_path, app, version_table, database_url)
    finally:
        drop_schema(engine, app)
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS public.{version_table}"))


def _tables(engine: Engine, schema: str) -> set[str]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT tablename FROM pg_tables WHERE schemaname = :s"), {"s": schema}
        )
        return {r[0] for r in rows}


def test_user_environment_upgrade_heads_creates_user_table_and_queue_schema_46(
    user_project: UserProject, engine: Engine, fresh: str, reference46: catalog.Catalog
) -> None:
    command.upgrade(user_project.config(fresh), "heads")
    assert _tables(engine, user_project.app_schema) == {"customer"}
    assert user_project.recorded(engine) == {"app_0001", "alkstore_0046"}
    assert migrate.current_version(engine, fresh) == 46
    catalog.assert_same(
        reference46, catalog.structural(catalog.snapshot(engine, fresh)), ("migrate", "user env")
    )


@pytest.mark.interop
def test_user_environment_upgrade_to_the_26_revision_builds_the_golden_catalog(
    user_project: UserProject, engine: Engine, fresh: str, reference: catalog.Catalog
) -> None:
    command.upgrade(user_project.config(fresh), "alkstore@alkstore_0001")
    assert user_project.recorded(engine) == {"alkstore_0001"}
    catalog.assert_same(reference, catalog.snapshot(engine, fresh), ("pg-boss", "user env"))


def test_user_environment_reads_the_schema_from_config_attributes(
    user_project: UserProject, engine: Engine, fresh: str
) -> None:
    command.upgrade(user_project.config(fresh, via="attributes"), "alkstore@head")
    assert "job_common" in _tables(engine, fresh)
    assert user_project.recorded(engine) == {"alkstore_0046"}


def test_user_environment_upgrade_alkstore_head_leaves_the_user_branch_alone(
    user_project: UserProject, engine: Engine, fresh: str
) -> None:
    command.upgrade(user_project.config(fresh), "alkstore@head")
    assert not schema_exists(engine, user_project.app_schema)
    assert user_project.recorded(engine) == {"alkstore_0046"}


def test_user_environment_stays_at_26_by_its_revision_and_moves_between_26_and_46(
    user_project: UserProject, engine: Engine, fresh: str
) -> None:
    # The one folder the environment lists holds every version: the 26 revision stops
    # there, "heads" goes on to 46, and the 26 revision brings it back.
    cfg = user_project.config(fresh)
    assert cfg.get_main_option("version_locations", "").split()[-1] == (
        "alkstore_sa:migrations/versions"
    )
    command.upgrade(cfg, "alkstore@alkstore_0001")
    assert migrate.current_version(engine, fresh) == 26
    assert migrate.check(engine, fresh) == 26
    command.upgrade(user_project.config(fresh), "heads")
    assert migrate.current_version(engine, fresh) == 46
    assert user_project.recorded(engine) == {"app_0001", "alkstore_0046"}
    command.downgrade(user_project.config(fresh), "alkstore@alkstore_0001")
    assert migrate.current_version(engine, fresh) == 26
    assert user_project.recorded(engine) == {"app_0001", "alkstore_0001"}


def test_user_environment_downgrade_of_alkstore_base_removes_only_the_queue_schema(
    user_project: UserProject, engine: Engine, fresh: str
) -> None:
    command.upgrade(user_project.config(fresh), "heads")
    command.downgrade(user_project.config(fresh), "alkstore@base")
    assert not schema_exists(engine, fresh)
    assert _tables(engine, user_project.app_schema) == {"customer"}
    assert user_project.recorded(engine) == {"app_0001"}


def test_user_environment_records_what_another_program_migrated_with_stamp(
    user_project: UserProject, engine: Engine, fresh: str
) -> None:
    # docs/concepts/compatibility.md: after Node 12.38 moved our 26 to 46, "heads" refuses
    # (nothing changed) until the environment records it with a stamp.
    command.upgrade(user_project.config(fresh), "alkstore@alkstore_0001")
    migrate.upgrade(engine, fresh, schema_version=46)  # the other program, its own history
    before = catalog.snapshot(engine, fresh)
    with pytest.raises(SchemaVersionError, match="another program"):
        command.upgrade(user_project.config(fresh), "alkstore@head")
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("before", "after refusal"))
    assert user_project.recorded(engine) == {"alkstore_0001"}
    command.stamp(user_project.config(fresh), "alkstore@alkstore_0046")
    assert user_project.recorded(engine) == {"alkstore_0046"}
    command.upgrade(user_project.config(fresh), "heads")
    assert user_project.recorded(engine) == {"app_0001", "alkstore_0046"}


@pytest.mark.parametrize("literal_binds", [True, False])
def test_user_environment_offline_sql_of_heads_builds_schema_46(
    user_project: UserProject,
    engine: Engine,
    database_url: str,
    fresh: str,
    reference46: catalog.Catalog,
    literal_binds: bool,
) -> None:
    cfg = user_project.config(fresh)
    cfg.attributes["literal_binds"] = literal_binds  # our revisions must not depend on it
    command.upgrade(cfg, "heads", sql=True)
    script = cfg.output_buffer.getvalue()  # type: ignore[union-attr]
    assert not schema_exists(engine, fresh)  # offline: nothing ran
    run_script(database_url, script)
    found = catalog.structural(catalog.snapshot(engine, fresh))
    catalog.assert_same(reference46, found, ("migrate", "offline SQL"))
    assert _tables(engine, user_project.app_schema) == {"customer"}


@pytest.mark.interop
def test_user_environment_offline_sql_of_the_26_revision_builds_the_golden_catalog(
    user_project: UserProject,
    engine: Engine,
    database_url: str,
    fresh: str,
    reference: catalog.Catalog,
) -> None:
    cfg = user_project.config(fresh)
    command.upgrade(cfg, "alkstore@alkstore_0001", sql=True)
    run_script(database_url, cfg.output_buffer.getvalue())  # type: ignore[union-attr]
    catalog.assert_same(reference, catalog.snapshot(engine, fresh), ("pg-boss", "offline SQL"))


@pytest.mark.interop
def test_user_environment_adopts_a_schema_created_by_node(
    user_project: UserProject, engine: Engine, database_url: str, fresh: str
) -> None:
    install_with_node_plan(database_url, fresh)
    before = catalog.snapshot(engine, fresh)
    command.upgrade(user_project.config(fresh), "alkstore@alkstore_0001")
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("node", "after adoption"))
    assert user_project.recorded(engine) == {"alkstore_0001"}
    # "heads" then takes the adopted schema on to 46.
    command.upgrade(user_project.config(fresh), "heads")
    assert migrate.current_version(engine, fresh) == 46
    assert user_project.recorded(engine) == {"app_0001", "alkstore_0046"}


# --------------------------------------------------------------------- (B) standalone


@pytest.mark.interop
def test_cli_db_upgrade_to_26_builds_the_golden_catalog(
    engine: Engine,
    database_url: str,
    fresh: str,
    reference: catalog.Catalog,
    capsys: pytest.CaptureFixture[str],
) -> None:
    where = ["--database-url", database_url, "--schema", fresh]
    assert main(["db", "upgrade", "--schema-version", "26", *where]) == 0
    assert "upgraded to schema 26" in capsys.readouterr().out
    catalog.assert_same(reference, catalog.snapshot(engine, fresh), ("pg-boss", "alkstore db"))
    assert migrate.current(engine, fresh) == "alkstore_0001"


def test_cli_db_upgrade_builds_schema_46_by_default(
    engine: Engine,
    database_url: str,
    fresh: str,
    reference46: catalog.Catalog,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["db", "upgrade", "--database-url", database_url, "--schema", fresh]) == 0
    assert "upgraded to schema 46" in capsys.readouterr().out
    found = catalog.structural(catalog.snapshot(engine, fresh))
    catalog.assert_same(reference46, found, ("migrate 46", "alkstore db"))
    assert migrate.current(engine, fresh) == "alkstore_0046"


@pytest.mark.interop
def test_console_script_upgrades_in_a_subprocess(
    engine: Engine, database_url: str, fresh: str, reference: catalog.Catalog
) -> None:
    env = {**os.environ, "ALKSTORE_DATABASE_URL": database_url, "ALKSTORE_SCHEMA": fresh}
    done = subprocess.run(
        [sys.executable, "-m", "alkstore_sa.cli", "db", "upgrade", "--schema-version=26", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert '"status": "upgraded"' in done.stdout
    catalog.assert_same(reference, catalog.snapshot(engine, fresh), ("pg-boss", "subprocess"))


def test_cli_db_upgrade_records_a_schema_node_moved_past_our_revision(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/concepts/compatibility.md: db upgrade records the version Node migrated to.
    migrate.upgrade(engine, fresh)
    with engine.begin() as conn:  # as if Node 12.38 had migrated our 26
        conn.execute(
            text(f"UPDATE \"{fresh}\".alkstore_alembic_version SET version_num = 'alkstore_0001'")
        )
    before = catalog.snapshot(engine, fresh)
    where = ["--database-url", database_url, "--schema", fresh]
    assert main(["db", "upgrade", *where]) == 0
    assert "recorded schema 46, which Node pg-boss migrated the schema to" in (
        capsys.readouterr().out
    )
    assert migrate.current(engine, fresh) == "alkstore_0046"
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("before", "after recording"))
    assert main(["db", "upgrade", *where]) == 0
    assert "already at schema 46; nothing to do" in capsys.readouterr().out


def test_upgrade_twice_changes_nothing(engine: Engine, fresh: str) -> None:
    migrate.upgrade(engine, fresh)
    before = catalog.snapshot(engine, fresh)
    migrate.upgrade(engine, fresh)
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("first", "second"))


def test_upgrade_accepts_a_libpq_url(database_url: str, engine: Engine, fresh: str) -> None:
    libpq = database_url.replace("postgresql+psycopg://", "postgresql://")
    migrate.upgrade(libpq, fresh)
    assert migrate.check(libpq, fresh) == 46


# --------------------------------------------------------------------- (C) offline


@pytest.mark.interop
def test_db_sql_script_builds_the_golden_catalog(
    engine: Engine,
    database_url: str,
    fresh: str,
    reference: catalog.Catalog,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["db", "sql", "--schema-version", "26", "--schema", fresh]) == 0
    script = capsys.readouterr().out
    assert "CREATE TABLE" in script and not schema_exists(engine, fresh)
    run_script(database_url, script)
    catalog.assert_same(reference, catalog.snapshot(engine, fresh), ("pg-boss", "db sql"))
    assert migrate.current(engine, fresh) == "alkstore_0001"


@pytest.mark.parametrize("version", ["26", "46"])
def test_db_sql_script_installs_functions_that_work(
    engine: Engine, database_url: str, fresh: str, capsys: pytest.CaptureFixture[str], version: str
) -> None:
    # The catalog comparison ignores function bodies: run them. A "%" doubled by the
    # offline renderer breaks format() in create_queue for partitioned queues.
    assert main(["db", "sql", "--schema-version", version, "--schema", fresh]) == 0
    script = capsys.readouterr().out
    if version == "26":
        assert "%%" not in script  # (46's create_queue writes a "%%" of its own)
    run_script(database_url, script)
    with engine.begin() as conn:
        partitioned = """'{"policy": "standard", "partition": true}'::jsonb"""
        conn.execute(text(f"""SELECT "{fresh}".create_queue('p', {partitioned})"""))
        conn.execute(
            text(f"""SELECT "{fresh}".create_queue('s', '{{"policy": "standard"}}'::jsonb)""")
        )
    with engine.connect() as conn:
        names = conn.execute(text(f'SELECT name FROM "{fresh}".queue ORDER BY name')).scalars()
        assert list(names) == ["p", "s"]


# --------------------------------------------------------------------- adoption


@pytest.mark.interop
def test_upgrade_adopts_a_node_schema_without_touching_it(
    engine: Engine, database_url: str, fresh: str
) -> None:
    install_with_node_plan(database_url, fresh)
    for statements in client_statements(
        [fresh], [["create-queue", "q", {"partition": True}]]
    ).values():
        for statement in statements:
            run_script(database_url, statement)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO \"{fresh}\".job (name, data) VALUES ('q', '{{\"k\": 1}}')"))
    before = catalog.snapshot(engine, fresh)
    migrate.upgrade(engine, fresh, schema_version=26)
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("node", "after adoption"))
    assert migrate.current(engine, fresh) == "alkstore_0001"
    with engine.connect() as conn:
        assert conn.execute(text(f'SELECT data FROM "{fresh}".job')).scalar_one() == {"k": 1}


@pytest.mark.parametrize(
    ("found", "advice"),
    [
        (24, "no upgrade path"),
        (25, "start Node pg-boss 11.1.x once"),
        # A schema-26 catalog under a row of 27 or 46: the row is refused for its catalog
        # (a schema Node really made at 27 to 46 is adopted: test_interop46_adoption.py).
        (27, "says pg-boss schema version 27 but its catalog is not version 27's"),
        (46, "says pg-boss schema version 46 but its catalog is not version 46's"),
        (47, "newer than this alkstore_sa knows (up to 46); upgrade alkstore_sa"),
        (None, "no version row"),
    ],
)
def test_upgrade_refuses_another_pgboss_version_and_says_what_to_do(
    engine: Engine, database_url: str, fresh: str, found: int | None, advice: str
) -> None:
    install_with_node_plan(database_url, fresh)
    with engine.begin() as conn:
        if found is None:
            conn.execute(text(f'DELETE FROM "{fresh}".version'))
        else:
            conn.execute(text(f'UPDATE "{fresh}".version SET version = :v'), {"v": found})
    before = catalog.snapshot(engine, fresh)
    with pytest.raises(SchemaVersionError) as caught:
        migrate.upgrade(engine, fresh)
    message = str(caught.value)
    assert repr(fresh) in message and advice in message
    if found is not None:
        assert f"version {found}" in message
    assert caught.value.found == found
    # Nothing was written: no revision table, no object changed.
    catalog.assert_same(before, catalog.snapshot(engine, fresh), ("before", "after refusal"))
    assert migrate.current(engine, fresh) is None


def test_check_names_a_missing_schema(engine: Engine, fresh: str) -> None:
    with pytest.raises(SchemaNotInstalledError, match=fresh):
        migrate.check(engine, fresh)


def test_check_refuses_a_version_between_the_spoken_ones_with_advice(
    engine: Engine, fresh: str
) -> None:
    migrate.upgrade(engine, fresh)
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{fresh}".version SET version = 27'))
    with pytest.raises(SchemaVersionError, match="--schema-version 46") as refused:
        migrate.check(engine, fresh)
    assert refused.value.found == 27


def test_check_refuses_a_version_newer_than_46(engine: Engine, fresh: str) -> None:
    migrate.upgrade(engine, fresh)
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{fresh}".version SET version = 47'))
    with pytest.raises(SchemaVersionError, match="upgrade alkstore_sa"):
        migrate.check(engine, fresh)


# --------------------------------------------------------------------- downgrade


def test_downgrade_removes_everything_including_partitions_and_the_schema(
    engine: Engine, fresh: str
) -> None:
    migrate.upgrade(engine, fresh)
    with engine.begin() as conn:
        conn.execute(
            text(f"SELECT \"{fresh}\".create_queue('p', CAST(:o AS jsonb))"),
            {"o": '{"policy": "short", "partition": true}'},
        )
        conn.execute(text(f"INSERT INTO \"{fresh}\".job (name) VALUES ('p')"))
    migrate.downgrade(engine, fresh)
    assert not schema_exists(engine, fresh)
    assert migrate.current(engine, fresh) is None


def test_downgrade_keeps_a_schema_that_holds_other_objects(engine: Engine, fresh: str) -> None:
    migrate.upgrade(engine, fresh)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE TABLE "{fresh}".mine (id int)'))
    migrate.downgrade(engine, fresh)
    snap = catalog.snapshot(engine, fresh, ignore=())
    assert snap["relations"] == [
        "mine kind=r persistence=p partition=False bound=- partkey=- options=- parent=-"
    ]
    assert snap["types"] == snap["functions"] == []


def test_current_is_none_before_and_the_revision_after_upgrade(engine: Engine, fresh: str) -> None:
    assert migrate.current(engine, fresh) is None
    migrate.upgrade(engine, fresh)
    assert migrate.current(engine, fresh) == "alkstore_0046"


# --------------------------------------------------------------------- autogenerate


def _user_metadata(app: str) -> MetaData:
    md = MetaData(schema=app)
    Table("customer", md, Column("id", Integer, primary_key=True), Column("name", Text))
    return md


def _compare(engine: Engine, target: MetaData | list[MetaData], opts: dict[str, Any]) -> list[Any]:
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn, opts={"include_schemas": True, "compare_type": True, **opts}
        )
        # Like target_metadata in env.py, a list of MetaData is accepted at run time.
        return list(compare_metadata(ctx, cast(Any, target)))


def _only(*schemas: str) -> Callable[[str | None, Any, Any], bool]:
    """The user's own name filter: this test's schemas only (the database is shared)."""

    def include(name: str | None, type_: Any, parents: Any) -> bool:
        return name in schemas if type_ == "schema" else True

    return include


def _added_tables(diffs: list[Any]) -> list[str]:
    return sorted(f"{d[0]} {d[1].schema}.{d[1].name}" for d in diffs if d[0].endswith("_table"))


def test_autogenerate_with_the_filters_sees_only_the_user_table(
    engine: Engine, schema: str
) -> None:
    app = random_schema("app_")
    with engine.begin() as conn:
        conn.execute(
            text(f'SELECT "{schema}".create_queue(:n, CAST(:o AS jsonb))'),
            {"n": "p", "o": '{"policy": "standard", "partition": true}'},
        )
    user = _user_metadata(app)
    opts = alembic_filters.combine(include_name=_only(app, schema), schemas=[schema])
    diffs = _compare(engine, [user, alkstore_metadata], dict(opts))
    assert _added_tables(diffs) == [f"add_table {app}.customer"]


def test_autogenerate_without_the_filters_would_drop_the_queue_tables(
    engine: Engine, schema: str
) -> None:
    # The control case: proves the filter above is what hides our schema.
    app = random_schema("app_")
    diffs = _compare(engine, _user_metadata(app), {"include_name": _only(app, schema)})
    removed = [t for t in _added_tables(diffs) if t.startswith("remove_table")]
    assert f"remove_table {schema}.job_common" in removed
    assert f"add_table {app}.customer" in _added_tables(diffs)


def test_filters_still_apply_the_users_own_object_filter(engine: Engine, schema: str) -> None:
    app = random_schema("app_")
    user = _user_metadata(app)
    Table("legacy", user, Column("id", Integer, primary_key=True))
    opts = alembic_filters.combine(
        include_name=_only(app, schema),
        include_object=lambda obj, name, type_, reflected, other: name != "legacy",
        schemas=[schema],
    )
    assert _added_tables(_compare(engine, user, dict(opts))) == [f"add_table {app}.customer"]


def test_filters_take_the_schema_from_the_alembic_context_by_default() -> None:
    # Outside a running Alembic command there is no -x: the default schema applies.
    assert alembic_filters.include_name("pgboss", "schema", {}) is False
    assert alembic_filters.include_name("public", "schema", {}) is True
    assert alembic_filters.include_name("alkstore_alembic_version", "table", {}) is False


def test_models_agree_with_the_migration(engine: Engine, schema: str) -> None:
    translated = MetaData()
    for table in alkstore_metadata.sorted_tables:
        table.to_metadata(translated, schema=schema, referred_schema_fn=lambda *_: schema)
    for table in translated.tables.values():
        for column in table.columns:
            if getattr(column.type, "name", None) == "job_state":
                column.type.schema = schema  # type: ignore[attr-defined]
    diffs = _compare(
        engine,
        translated,
        {
            "include_name": lambda name, type_, parents: (
                name == schema if type_ == "schema" else name != "alkstore_alembic_version"
            ),
            "compare_server_default": False,
        },
    )
    assert diffs == []


# --------------------------------------------------------------------- developer env


def test_developer_environment_runs_from_the_url_in_the_environment(
    engine: Engine, database_url: str, fresh: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ALKSTORE_DATABASE_URL", database_url)
    cfg = Config(str(REPO / "migrations" / "alembic.ini"))
    cfg.attributes["configure_logger"] = False
    cfg.cmd_opts = argparse.Namespace(x=[f"alkstore_schema={fresh}"])
    command.upgrade(cfg, "alkstore_0001")
    assert migrate.check(engine, fresh) == 26
    command.upgrade(cfg, "alkstore@head")
    assert migrate.current_version(engine, fresh) == 46
    command.downgrade(cfg, "alkstore@base")
    assert _tables(engine, fresh) == {"alkstore_alembic_version"}


def test_developer_environment_writes_new_revisions_on_the_alkstore_branch(
    tmp_path: Path,
) -> None:
    cfg = Config(str(REPO / "migrations" / "alembic.ini"))
    cfg.set_main_option(
        "version_locations",
        os.pathsep.join([str(tmp_path), str(REPO / "alkstore_sa" / "migrations" / "versions")]),
    )
    script = command.revision(
        cfg,
        "add alkstore_extra",
        head="alkstore@head",
        version_path=str(tmp_path),
        rev_id="alkstore_0047",
    )
    assert script is not None and not isinstance(script, list)
    written = Path(script.path).read_text()
    assert "down_revision: str | None = 'alkstore_0046'" in written
    assert foreign_revisions(tmp_path) == []  # migrations/README.md's --rev-id is accepted
    assert "schema = schema_name()" in written
    assert Path(script.path).parent == tmp_path
    compile(written, script.path, "exec")  # the template renders valid Python


# --------------------------------------------------------------------- foreign revisions

# What `alembic revision --autogenerate` wrote into the package for the user of
# docs/how-to/alembic.md before the page showed how to start an app's own branch.
STRAY_REVISION = """
from alembic import op
import sqlalchemy as sa

from alkstore_sa.migrations import schema_name

revision = "4f1c0a2b9d3e"
down_revision = "alkstore_0001"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table("orders", sa.Column("id", sa.Integer, primary_key=True), schema=schema_name())


def downgrade():
    op.drop_table("orders", schema=schema_name())
"""


@pytest.fixture
def versions_copy(tmp_path: Path) -> Path:
    """A copy of the package's versions folder (never write into the package itself)."""
    copy = tmp_path / "versions"
    copy.mkdir()
    for path in VERSIONS_DIR.glob("*.py"):
        shutil.copy(path, copy / path.name)
    return copy


@pytest.fixture
def stray(versions_copy: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The copy, with an application's revision in it, used by alkstore_sa.migrate."""
    path = versions_copy / "4f1c0a2b9d3e_create_orders.py"
    path.write_text(STRAY_REVISION)
    monkeypatch.setattr(migrate, "VERSION_LOCATION", str(versions_copy))
    return path


def test_the_package_versions_folder_holds_only_alkstore_revisions() -> None:
    assert sorted(p.name for p in VERSIONS_DIR.glob("*.py")) != []
    assert foreign_revisions() == []


def test_foreign_revisions_are_told_by_the_revision_id_they_declare(versions_copy: Path) -> None:
    (versions_copy / "4f1c_app.py").write_text(STRAY_REVISION)
    (versions_copy / "no_revision.py").write_text("x = 1\n")
    (versions_copy / "broken.py").write_text("revision = (\n")
    (versions_copy / "alkstore_0002_next.py").write_text('revision: str = "alkstore_0002"\n')
    (versions_copy / "alkstore_0003_more.py").write_text(
        '"""revision = "x"\n"""\n'
        'if True:\n    revision = "nested"\n'
        "revision = 'alkstore_0003'; x = 1\n"
    )
    (versions_copy / "nested_only.py").write_text('if True:\n    revision = "alkstore_0004"\n')
    (versions_copy / "computed.py").write_text('revision = "alkstore_" + "0005"\n')
    # Files Alembic does not load as revisions are not looked at.
    (versions_copy / "__init__.py").write_text("")
    (versions_copy / ".#alkstore_0001_schema26.py").write_text("")
    (versions_copy / "README").write_text("")
    found = [p.name for p in foreign_revisions(versions_copy)]
    assert found == ["4f1c_app.py", "broken.py", "computed.py", "nested_only.py", "no_revision.py"]


def test_revision_ids_are_read_while_a_finalizer_formats_a_traceback() -> None:
    # A connection finalized by the garbage collector in the middle of the read logs a
    # traceback, and on CPython 3.11 formatting one parses source into an AST (to place
    # its carets): an AST being built at that moment failed with "AST constructor
    # recursion depth mismatch". The hook below parses as that formatting does, at every
    # collection; on 3.11 the earlier ast-based reader fails here.
    def parse_as_a_traceback_does(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            ast.parse("a[b](c)")

    threshold = gc.get_threshold()
    gc.callbacks.append(parse_as_a_traceback_does)
    gc.set_threshold(1)
    try:
        for _ in range(3):
            assert foreign_revisions() == []
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(parse_as_a_traceback_does)


@pytest.mark.parametrize("call", ["upgrade", "downgrade", "offline_sql"])
def test_migrate_refuses_a_foreign_revision_before_running_anything(
    engine: Engine, fresh: str, stray: Path, call: str
) -> None:
    with pytest.raises(ForeignRevisionError) as caught:
        if call == "offline_sql":
            migrate.offline_sql(fresh)
        else:
            getattr(migrate, call)(engine, fresh)
    message = str(caught.value)
    assert str(stray) in message and "'4f1c0a2b9d3e'" in message
    assert "Move it to your application's own versions folder" in message
    assert "--head base --branch-label myapp --version-path migrations/versions" in message
    assert caught.value.paths == (str(stray),)
    assert not schema_exists(engine, fresh)


def test_migrate_refuses_a_foreign_revision_before_connecting(stray: Path) -> None:
    # Nothing listens on port 1: reaching the database would raise OperationalError.
    with pytest.raises(ForeignRevisionError):
        migrate.upgrade("postgresql://nobody@127.0.0.1:1/nothing", "pgboss")


def test_migrate_runs_from_the_copy_once_the_foreign_revision_is_gone(
    engine: Engine, fresh: str, stray: Path
) -> None:
    # The control case: the copy is what migrate uses, and only the stray file is refused.
    stray.unlink()
    migrate.upgrade(engine, fresh)
    assert migrate.current(engine, fresh) == "alkstore_0046"


def test_the_package_environment_refuses_a_foreign_revision(
    engine: Engine, database_url: str, fresh: str, stray: Path
) -> None:
    # Called through Alembic's own command, the package's env.py checks its locations.
    cfg = migrate.alembic_config(fresh, url=database_url)
    cfg.set_main_option("version_locations", str(stray.parent))
    with pytest.raises(ForeignRevisionError, match="4f1c0a2b9d3e"):
        command.upgrade(cfg, "heads")
    assert not schema_exists(engine, fresh)


def test_the_revision_hook_chains_the_users_hook_first() -> None:
    seen: list[Any] = []
    opts = alembic_filters.combine(
        process_revision_directives=lambda context, revision, directives: seen.append(revision)
    )
    # No directives: ours has nothing to check beyond the package folder, which is clean.
    context = MigrationContext.configure(dialect_name="postgresql")
    opts["process_revision_directives"](context, "heads", [])
    assert seen == ["heads"]


def test_downgrade_waits_for_pgboss_migration_lock(engine: Engine, fresh: str) -> None:
    # A Node start() or another upgrade holding the lock is waited for, as by upgrade().
    import threading

    from alkstore_sa.schema_health import lock_key_sql

    migrate.upgrade(engine, fresh)
    done = threading.Event()
    failures: list[BaseException] = []

    def go_back() -> None:
        try:
            migrate.downgrade(engine, fresh, schema_version=26)
        except BaseException as exc:  # reported below
            failures.append(exc)
        done.set()

    with engine.connect() as holder:
        holder.execute(text(f"SELECT pg_advisory_lock({lock_key_sql(fresh)})"))
        holder.commit()
        worker = threading.Thread(target=go_back)
        worker.start()
        assert not done.wait(2), "downgrade ran while pg-boss's migration lock was held"
        assert migrate.check(engine, fresh) == 46
        holder.execute(text(f"SELECT pg_advisory_unlock({lock_key_sql(fresh)})"))
        holder.commit()
    worker.join(60)
    assert done.is_set() and not failures
    assert migrate.check(engine, fresh) == 26
