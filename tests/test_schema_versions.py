"""Choosing the pg-boss schema version: ``migrate.upgrade/downgrade(schema_version=N)``,
``alkstore db upgrade|downgrade|sql --schema-version N`` and ``alkstore db current``.

Version 26 is our revision ``alkstore_0001``, version N after it ``alkstore_00NN``; without
a version the default (46, the newest version the runtime speaks) is installed; 26 only
when asked for.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, text
from support.schemas import drop_schema, random_schema, schema_exists

from alkstore_sa import migrate, names
from alkstore_sa.cli import main
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.migrations import VERSIONS_DIR


@pytest.fixture
def fresh(engine: Engine) -> Iterator[str]:
    """A schema name with nothing in it; dropped after the test."""
    name = random_schema("sv_")
    yield name
    drop_schema(engine, name)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ the table


def test_every_version_from_26_to_46_has_one_revision_and_its_node_releases() -> None:
    assert sorted(migrate.SCHEMA_VERSIONS) == list(range(26, 47))
    assert migrate.revision_for(26) == "alkstore_0001"
    assert [migrate.revision_for(n) for n in (27, 38, 46)] == [
        "alkstore_0027",
        "alkstore_0038",
        "alkstore_0046",
    ]
    assert all(migrate.version_of(i.revision) == n for n, i in migrate.SCHEMA_VERSIONS.items())
    assert migrate.SCHEMA_VERSIONS[26].describe() == (
        "schema 26 (Node pg-boss 11.1.1 to 11.1.2 and 12.0.0 to 12.5.4)"
    )
    assert migrate.SCHEMA_VERSIONS[46].node_releases == "Node pg-boss 12.38.0"
    assert migrate.SCHEMA_VERSIONS[44].introduced_in == "12.36.0"


def test_every_version_in_the_table_is_a_revision_of_the_package_chained_in_order() -> None:
    script = ScriptDirectory.from_config(migrate.alembic_config())
    for version, info in migrate.SCHEMA_VERSIONS.items():
        revision = script.get_revision(info.revision)
        assert revision is not None, info.revision
        expected_down = None if version == 26 else migrate.revision_for(version - 1)
        assert revision.down_revision == expected_down, info.revision


def test_the_default_target_is_46_the_newest_version_the_runtime_speaks() -> None:
    assert migrate.DEFAULT_SCHEMA_VERSION == 46
    assert max(names.SPOKEN_SCHEMA_VERSIONS) == migrate.DEFAULT_SCHEMA_VERSION
    assert migrate.DEFAULT_SCHEMA_VERSION == migrate.NEWEST_SCHEMA_VERSION


def test_one_package_folder_holds_every_revision_and_the_standalone_environment_lists_it() -> None:
    assert migrate.VERSION_LOCATION == "alkstore_sa:migrations/versions"
    assert sorted(p.name for p in VERSIONS_DIR.glob("alkstore_*.py")) == [
        "alkstore_0001_schema26.py",
        *(f"alkstore_{n:04d}_schema{n}.py" for n in range(27, 47)),
    ]
    assert not VERSIONS_DIR.with_name("versions_next").exists()


# ------------------------------------------------------------------ migrate.*


def test_upgrade_without_a_version_installs_the_default(engine: Engine, fresh: str) -> None:
    migrate.upgrade(engine, fresh)
    assert migrate.current(engine, fresh) == "alkstore_0046"
    assert migrate.current_version(engine, fresh) == migrate.DEFAULT_SCHEMA_VERSION == 46


def test_upgrade_to_26_explicitly(engine: Engine, fresh: str) -> None:
    migrate.upgrade(engine, fresh, schema_version=26)
    assert migrate.current(engine, fresh) == "alkstore_0001"
    assert migrate.current_version(engine, fresh) == 26


@pytest.mark.parametrize("version", [27, 37, 46])
def test_upgrade_to_a_version_leaves_the_schema_at_it(
    engine: Engine, fresh: str, version: int
) -> None:
    migrate.upgrade(engine, fresh, schema_version=version)
    assert migrate.current(engine, fresh) == migrate.revision_for(version)
    assert migrate.current_version(engine, fresh) == version


def test_downgrade_to_a_version_leaves_the_schema_at_it(engine: Engine, fresh: str) -> None:
    migrate.upgrade(engine, fresh, schema_version=33)
    migrate.downgrade(engine, fresh, schema_version=29)
    assert migrate.current(engine, fresh) == "alkstore_0029"
    assert migrate.current_version(engine, fresh) == 29
    migrate.downgrade(engine, fresh, schema_version=26)
    assert migrate.current(engine, fresh) == "alkstore_0001"
    assert migrate.current_version(engine, fresh) == 26


@pytest.mark.parametrize("bad", [25, 47, 0, -1, True, "46"])
def test_an_unknown_version_is_refused_before_any_sql(
    engine: Engine, fresh: str, bad: object
) -> None:
    with pytest.raises(InvalidOptionsError, match="schema_version") as raised:
        migrate.upgrade(engine, fresh, schema_version=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(raised.value) or str(bad) in str(raised.value)
    with pytest.raises(InvalidOptionsError, match="schema_version"):
        migrate.downgrade(engine, fresh, schema_version=bad)  # type: ignore[arg-type]
    assert not schema_exists(engine, fresh)


def test_a_revision_and_a_version_together_are_refused(engine: Engine, fresh: str) -> None:
    with pytest.raises(InvalidOptionsError, match="not both"):
        migrate.upgrade(engine, fresh, "alkstore_0001", schema_version=26)
    assert not schema_exists(engine, fresh)


def test_upgrade_does_not_go_back_and_downgrade_does_not_go_forward(
    engine: Engine, fresh: str
) -> None:
    migrate.upgrade(engine, fresh, schema_version=30)
    with pytest.raises(InvalidOptionsError, match="at pg-boss schema version 30; upgrade"):
        migrate.upgrade(engine, fresh, schema_version=28)
    with pytest.raises(InvalidOptionsError, match="at pg-boss schema version 30; downgrade"):
        migrate.downgrade(engine, fresh, schema_version=31)
    assert migrate.current_version(engine, fresh) == 30


def test_current_version_is_what_the_version_table_says(engine: Engine, fresh: str) -> None:
    assert migrate.current_version(engine, fresh) is None
    migrate.upgrade(engine, fresh, schema_version=26)
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{fresh}".version SET version = 46'))
    # Node pg-boss moved it on; our recorded revision did not change.
    assert migrate.current_version(engine, fresh) == 46
    assert migrate.version_of(migrate.current(engine, fresh)) == 26


# ------------------------------------------------------------------ the command line


def test_cli_upgrade_to_a_version_and_current_names_it_and_its_releases(
    capsys: pytest.CaptureFixture[str], database_url: str, fresh: str
) -> None:
    where = ["--database-url", database_url, "--schema", fresh]
    code, out, _ = _run(capsys, "db", "upgrade", "--schema-version", "30", *where)
    assert code == 0
    assert "upgraded to schema 30" in out
    code, out, _ = _run(capsys, "db", "current", *where)
    assert code == 0
    assert "schema 30 (Node pg-boss 12.12.0 to 12.18.3)" in out
    code, out, _ = _run(capsys, "db", "current", "--json", *where)
    assert json.loads(out) == {
        "schema": fresh,
        "revision": "alkstore_0030",
        "version": 30,
        "node_releases": "Node pg-boss 12.12.0 to 12.18.3",
        "message": "schema 30 (Node pg-boss 12.12.0 to 12.18.3)",
    }


def test_cli_downgrade_to_a_version(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, fresh: str
) -> None:
    where = ["--database-url", database_url, "--schema", fresh]
    assert _run(capsys, "db", "upgrade", "--schema-version", "28", *where)[0] == 0
    code, out, _ = _run(capsys, "db", "downgrade", "--schema-version", "26", *where)
    assert code == 0
    assert "downgraded to schema 26" in out
    assert migrate.current_version(engine, fresh) == 26


def test_cli_default_upgrade_goes_to_46_and_downgrade_brings_it_back_to_26(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, fresh: str
) -> None:
    where = ["--database-url", database_url, "--schema", fresh]
    code, out, _ = _run(capsys, "db", "upgrade", *where)
    assert code == 0
    assert "upgraded to schema 46" in out
    code, out, _ = _run(capsys, "db", "upgrade", *where)
    assert code == 0
    assert "already at schema 46; nothing to do" in out
    code, out, _ = _run(capsys, "db", "downgrade", "--schema-version", "26", *where)
    assert code == 0
    assert "downgraded to schema 26" in out
    assert migrate.current(engine, fresh) == "alkstore_0001"
    assert migrate.check(engine, fresh) == 26
    code, out, _ = _run(capsys, "db", "upgrade", "--schema-version", "26", *where)
    assert code == 0
    assert "already at schema 26; nothing to do" in out
    code, out, _ = _run(capsys, "db", "current", *where)
    assert "schema 26 (Node pg-boss 11.1.1 to 11.1.2 and 12.0.0 to 12.5.4)" in out


def test_cli_current_on_nothing_installed_says_so(
    capsys: pytest.CaptureFixture[str], database_url: str, fresh: str
) -> None:
    code, out, _ = _run(capsys, "db", "current", "--json", "--database-url", database_url,
                        "--schema", fresh)  # fmt: skip
    assert code == 0
    assert json.loads(out) == {
        "schema": fresh,
        "revision": None,
        "version": None,
        "node_releases": None,
        "message": "not installed",
    }


def test_cli_current_says_when_node_moved_the_schema_past_our_revision(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, fresh: str
) -> None:
    migrate.upgrade(engine, fresh, schema_version=26)
    with engine.begin() as conn:
        conn.execute(text(f'UPDATE "{fresh}".version SET version = 46'))
    code, out, _ = _run(capsys, "db", "current", "--json", "--database-url", database_url,
                        "--schema", fresh)  # fmt: skip
    assert code == 0
    assert json.loads(out)["message"] == (
        "schema 46 (Node pg-boss 12.38.0); our revision alkstore_0001 left it at 26"
    )


@pytest.mark.parametrize("action", ["upgrade", "downgrade", "sql"])
def test_cli_refuses_an_unknown_version_with_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], database_url: str, engine: Engine, fresh: str, action: str
) -> None:
    code, out, err = _run(capsys, "db", action, "--schema-version", "47", "--database-url",
                          database_url, "--schema", fresh)  # fmt: skip
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert "47 is not a pg-boss schema version" in err
    assert not schema_exists(engine, fresh)


def test_cli_refuses_a_version_that_is_not_a_number(
    capsys: pytest.CaptureFixture[str], database_url: str
) -> None:
    code, _, err = _run(capsys, "db", "upgrade", "--schema-version", "latest",
                        "--database-url", database_url)  # fmt: skip
    assert code == 2
    assert "--schema-version" in err and err.count("\n") == 1


def test_cli_sql_prints_the_script_up_to_a_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "db", "sql", "--schema-version", "27", "--schema", "boss")
    assert code == 0
    assert "alkstore_0027" in out
    assert "alkstore_0028" not in out
    code, at26, _ = _run(capsys, "db", "sql", "--schema-version", "26", "--schema", "boss")
    assert code == 0
    assert "alkstore_0001" in at26 and "alkstore_0027" not in at26
    code, default, _ = _run(capsys, "db", "sql", "--schema", "boss")
    assert code == 0
    assert "alkstore_0001" in default and "alkstore_0046" in default
