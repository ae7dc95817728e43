"""The runtime reads the installed pg-boss schema version and speaks it (26, or 46 once
spoken): detection, refusals with one line of advice, the per-engine cache, and live
upgrades (a schema migrated from 26 to 46 under running workers, supervisors and
services). docs/concepts/compatibility.md."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from conftest import Env, drop_schema, new_schema_name
from sqlalchemy import Engine, inspect, text
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, SchemaVersionError, migrate, names
from alkstore_sa._engine_cache import engine_state
from alkstore_sa.sql import tables46


@pytest.fixture
def schema_at(engine: Engine) -> Iterator[object]:
    """Make schemas at a chosen version (26 or 46 by our migrations, else a 26 relabelled)."""
    made: list[str] = []

    def make(version: int) -> str:
        name = new_schema_name()
        made.append(name)
        migrate.upgrade(engine, name, schema_version=46 if version >= 46 else 26)
        if version not in (26, 46):
            with engine.begin() as conn:
                conn.execute(text(f'UPDATE "{name}".version SET version = :v'), {"v": version})
        return name

    yield make
    for name in made:
        drop_schema(engine, name)


def queues_of(engine: Engine, schema: str) -> list[str]:
    with Session(engine) as session, session.begin():
        return [q.name for q in QueueService(session, schema=schema).get_queues()]


# --------------------------------------------------------------------- tables46


def test_tables46_match_the_catalog_our_migrations_build_at_46(
    engine: Engine, schema46: str
) -> None:
    inspector = inspect(engine)
    for table in tables46.ALL_TABLES:
        found = inspector.get_columns(table.name, schema=schema46)
        assert [c["name"] for c in found] == [c.name for c in table.columns], table.name
        assert [c["nullable"] for c in found] == [c.nullable for c in table.columns], table.name
        pk = inspector.get_pk_constraint(table.name, schema=schema46)["constrained_columns"]
        assert sorted(pk) == sorted(c.name for c in table.primary_key), table.name
    assert tables46.metadata.schema == names.DEFAULT_SCHEMA


# --------------------------------------------------------------------- detection


def test_a_service_on_26_speaks_26(engine: Engine, schema_at: object) -> None:
    schema = schema_at(26)  # type: ignore[operator]
    with Session(engine) as session, session.begin():
        service = QueueService(session, schema=schema)
        service.create_queue("q")
        assert service._ctx.version == 26


def test_a_service_on_46_speaks_46_when_46_is_spoken(env46: Env) -> None:
    service = env46.service()
    assert service.get_queues() == []
    assert service._ctx.version == 46
    env46.commit()


def test_46_is_refused_while_it_is_not_spoken(engine: Engine, schema_at: object) -> None:
    assert 46 not in names.SPOKEN_SCHEMA_VERSIONS  # the shipped default until decided
    schema = schema_at(46)  # type: ignore[operator]
    with pytest.raises(SchemaVersionError) as refused:
        queues_of(engine, schema)
    assert refused.value.found == 46
    assert "does not speak yet" in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("version", [27, 30, 37, 38, 45])
def test_versions_between_26_and_46_are_refused_with_one_line_of_advice(
    engine: Engine, schema_at: object, spoken46: None, version: int
) -> None:
    schema = schema_at(version)  # type: ignore[operator]
    with Session(engine) as session, session.begin():
        with pytest.raises(SchemaVersionError) as refused:
            QueueService(session, schema=schema).get_queues()
        # The refusal only read: the transaction is usable.
        assert session.execute(text("SELECT 1")).scalar_one() == 1
    message = str(refused.value)
    assert "\n" not in message
    assert f"version {version}" in message
    assert "alkstore db upgrade --schema-version 46" in message
    assert "let Node pg-boss 12.38 migrate it" in message
    assert refused.value.found == version


@pytest.mark.parametrize("version", [47, 60])
def test_a_version_newer_than_46_is_refused_with_advice_to_upgrade(
    engine: Engine, schema_at: object, spoken46: None, version: int
) -> None:
    schema = schema_at(version)  # type: ignore[operator]
    with pytest.raises(SchemaVersionError) as refused:
        queues_of(engine, schema)
    message = str(refused.value)
    assert "newer than this alkstore_sa knows" in message
    assert "upgrade alkstore_sa" in message
    assert "\n" not in message


def test_older_versions_keep_their_advice(engine: Engine, schema_at: object) -> None:
    schema = schema_at(25)  # type: ignore[operator]
    with pytest.raises(SchemaVersionError) as refused:
        queues_of(engine, schema)
    assert (refused.value.found, refused.value.expected) == (25, 26)
    assert "pg-boss 11.0.x" in str(refused.value)


# --------------------------------------------------------------------- the cache


def test_the_engine_remembers_the_version_per_schema(
    engine: Engine, schema_at: object, spoken46: None
) -> None:
    at26, at46 = schema_at(26), schema_at(46)  # type: ignore[operator]
    queues_of(engine, at26)
    queues_of(engine, at46)
    state = engine_state(engine)
    assert (state.version(at26), state.version(at46)) == (26, 46)


def test_a_fresh_reading_is_trusted_and_a_stale_one_read_again(
    engine: Engine, schema_at: object, spoken46: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    schema = schema_at(26)  # type: ignore[operator]
    queues_of(engine, schema)
    with engine.begin() as conn:  # a lie the cache must keep telling while fresh
        conn.execute(text(f'UPDATE "{schema}".version SET version = 27'))
    queues_of(engine, schema)
    assert engine_state(engine).version(schema) == 26
    monkeypatch.setattr(names, "SCHEMA_RECHECK_SECONDS", 0.0)
    with pytest.raises(SchemaVersionError, match="version 27"):
        queues_of(engine, schema)


def test_a_version_change_is_logged_once_with_from_and_to(
    engine: Engine, schema_at: object, spoken46: None, caplog: pytest.LogCaptureFixture
) -> None:
    schema = schema_at(26)  # type: ignore[operator]
    queues_of(engine, schema)
    migrate.upgrade(engine, schema, schema_version=46)
    state = engine_state(engine)
    state.expire(schema)
    with caplog.at_level("INFO", logger="alkstore_sa"):
        queues_of(engine, schema)
        state.expire(schema)
        queues_of(engine, schema)
    changes = [r for r in caplog.records if getattr(r, "action", "") == "schema_version_changed"]
    assert len(changes) == 1
    assert (changes[0].__dict__["from"], changes[0].__dict__["to"]) == (26, 46)
    assert changes[0].__dict__["schema"] == schema
