"""The runtime reads the installed pg-boss schema version and speaks it (26, or 46 once
spoken): detection, refusals with one line of advice, the per-engine cache, and live
upgrades (a schema migrated from 26 to 46 under running workers, supervisors and
services). docs/concepts/compatibility.md."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Env
from sqlalchemy import Engine, create_engine, inspect, text
from sqlalchemy.orm import Session
from support.schemas import drop_schema, random_schema
from support.worker import Harness, wait_for

from alkstore_sa import QueueService, SchemaVersionError, migrate, names
from alkstore_sa._engine_cache import engine_state
from alkstore_sa.errors import SchemaVersionChangedError
from alkstore_sa.sql.v46 import tables as tables46


@pytest.fixture
def schema_at(engine: Engine) -> Iterator[object]:
    """Make schemas at a chosen version (26 or 46 by our migrations, else a 26 relabelled)."""
    made: list[str] = []

    def make(version: int) -> str:
        name = random_schema()
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


def test_46_is_spoken_by_default() -> None:
    assert {26, 46} == names.SPOKEN_SCHEMA_VERSIONS


def test_46_is_refused_while_it_is_not_spoken(
    engine: Engine, schema_at: object, unspoken46: None
) -> None:
    assert 46 not in names.SPOKEN_SCHEMA_VERSIONS
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


# --------------------------------------------------------------------- live upgrades


def send_jobs(database_url: str, schema: str, queue: str, n: int, **options: Any) -> list[Any]:
    """Send ``n`` jobs through an engine of their own, so that only the worker's engine
    has seen the schema's versions (the change is logged once per engine)."""
    sender = create_engine(database_url)
    try:
        with Session(sender) as session, session.begin():
            service = QueueService(session, schema=schema)
            return [service.send(queue, {"i": i}, **options) for i in range(n)]
    finally:
        sender.dispose()


def version_changes(caplog: pytest.LogCaptureFixture) -> list[tuple[int, int]]:
    return [
        (r.__dict__["from"], r.__dict__["to"])
        for r in caplog.records
        if r.__dict__.get("action") == "schema_version_changed"
    ]


def test_a_worker_on_26_switches_to_46_when_the_schema_is_migrated_under_it(
    harness: Harness,
    database_url: str,
    spoken46: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(names, "SCHEMA_RECHECK_SECONDS", 0.5)
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    before = send_jobs(database_url, h.schema, "q", 20)
    done: list[Any] = []
    worker = h.worker(handlers={"q": h.handler(lambda job: done.append(job.id))})
    worker = h.start(worker)
    with caplog.at_level("INFO", logger="alkstore_sa"):
        migrate.upgrade(h.engine, h.schema, schema_version=46)
        after = send_jobs(database_url, h.schema, "q", 20)
        wait_for(lambda: len(done) >= 40, timeout=30)
        wait_for(lambda: worker._ctx.version == 46, timeout=5)
        time.sleep(0.3)  # a double completion would show now
        h.stop(worker)
    assert sorted(map(str, done)) == sorted(map(str, before + after))  # each exactly once
    states = h.sql("SELECT state::text, count(*) FROM {s}.job GROUP BY 1")
    assert states == [("completed", 40)]
    assert version_changes(caplog) == [(26, 46)]
    assert worker.stats()["q"].completed == 40


def test_a_worker_stops_fetching_when_the_schema_moves_to_a_version_not_spoken(
    harness: Harness,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    unspoken46: None,
) -> None:
    monkeypatch.setattr(names, "SCHEMA_RECHECK_SECONDS", 0.5)
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    done: list[Any] = []
    name = f"w-{h.schema}"  # other tests' leftovers may log too: this worker's records only
    worker = h.start(
        h.worker(name=name, handlers={"q": h.handler(lambda job: done.append(job.id))})
    )
    first = send_jobs(database_url, h.schema, "q", 1)
    wait_for(lambda: len(done) == 1)
    # Queued before the move, due shortly after it: they must stay queued.
    waiting = send_jobs(database_url, h.schema, "q", 5, start_after=2)

    def refused() -> list[logging.LogRecord]:
        return [
            r
            for r in caplog.records
            if r.__dict__.get("action") == "schema_version_refused"
            and r.__dict__.get("worker") == name
        ]

    with caplog.at_level("INFO", logger="alkstore_sa"):
        migrate.upgrade(h.engine, h.schema, schema_version=46)
        wait_for(refused, timeout=10)
        time.sleep(3.5)  # past start_after, several rechecks
        took = h.stop(worker, 10)
    assert done == first
    assert len(refused()) == 1
    assert refused()[0].levelname == "ERROR"
    assert "version 46" in refused()[0].getMessage()
    assert not [
        r
        for r in caplog.records
        if r.__dict__.get("action") == "fetch_error" and r.__dict__.get("worker") == name
    ]
    assert took < 10
    ids = ", ".join(f"'{i}'" for i in waiting)
    assert h.sql(f"SELECT state::text, count(*) FROM {{s}}.job WHERE id IN ({ids}) GROUP BY 1") == [
        ("created", 5)
    ]
    assert worker.stats()["q"].fetched == 1


def test_a_worker_switches_at_once_when_a_statement_fails_on_a_changed_schema(
    harness: Harness,
    database_url: str,
    spoken46: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # No timer here: only the failing statement can tell the worker. The schema
    # goes back from 46 to 26, so the statements of 46 name columns that are gone.
    monkeypatch.setattr(names, "SCHEMA_RECHECK_SECONDS", 3600.0)
    h = harness
    migrate.upgrade(h.engine, h.schema, schema_version=46)
    h.service_tx(lambda q: q.create_queue("q"))
    done: list[Any] = []
    worker = h.start(h.worker(handlers={"q": h.handler(lambda job: done.append(job.id))}))
    first = send_jobs(database_url, h.schema, "q", 3)
    wait_for(lambda: len(done) == 3)
    assert worker._ctx.version == 46
    with caplog.at_level("INFO", logger="alkstore_sa"):
        migrate.downgrade(h.engine, h.schema, schema_version=26)
        later = send_jobs(database_url, h.schema, "q", 3)
        wait_for(lambda: len(done) == 6, timeout=20)
        h.stop(worker)
    assert sorted(map(str, done)) == sorted(map(str, first + later))
    assert worker._ctx.version == 26
    assert version_changes(caplog) == [(46, 26)]


def test_a_service_raises_once_when_the_schema_changed_under_its_transaction(
    env46: Env, spoken46: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(names, "SCHEMA_RECHECK_SECONDS", 3600.0)
    env46.tx(lambda q: q.create_queue("q"))
    job_id = env46.tx(lambda q: q.send("q", {"n": 1}))
    assert env46.tx(lambda q: q.get_job("q", job_id)) is not None  # 46 read and cached
    migrate.downgrade(env46.engine, env46.schema, schema_version=26)
    service = env46.service()
    with pytest.raises(SchemaVersionChangedError) as moved:
        service.fetch("q", 1)
    env46.rollback()
    assert (moved.value.before, moved.value.after) == (46, 26)
    assert "retry" in str(moved.value) and "\n" not in str(moved.value)
    jobs = env46.tx(lambda q: q.fetch("q", 1))  # the next transaction speaks 26
    assert [j.id for j in jobs] == [job_id]


def test_the_statements_of_26_still_succeed_on_a_schema_migrated_to_46(
    engine: Engine, spoken46: None, schema_at: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a process that last read 26 does until its next reading: pg-boss 12.38's
    # migration only adds, so nothing of 26 fails (docs/concepts/compatibility.md).
    monkeypatch.setattr(names, "SCHEMA_RECHECK_SECONDS", 3600.0)
    schema = schema_at(26)  # type: ignore[operator]
    queues_of(engine, schema)
    migrate.upgrade(engine, schema, schema_version=46)
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("dlq")
        q.create_queue("q", dead_letter="dlq", retry_limit=0)
        q.create_queue("p", partition=True, policy="singleton")
        q.update_queue("q", retry_delay=1)
        ids = [q.send("q", {"n": n}) for n in range(3)]
        assert q.send("p", {"n": 1}, singleton_key="k") is not None
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        first, second, third = q.fetch("q", 3)
        assert q.complete_many("q", [first]).affected == [first.id]
        assert q.fail("q", second, "boom").states == {second.id: "failed"}
        q.cancel("q", [third.id])
        q.schedule("q", "* * * * *")
        q.subscribe("event", "q")
        assert len(q.publish("event", {"e": 1})) == 1
        assert q.get_queue_stats("q").total_count == 4  # three sends, one publish
        assert {j.id for j in q.list_jobs("q")} >= set(ids)
        q.supervise()
        assert q.delete_queue("p")
        assert q._ctx.version == 26  # all of it spoken as 26
