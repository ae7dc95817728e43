"""The maintenance turn at schema 46 over many queues: batched statements, the same rows
as the walk of one queue at a time, and a bad queue that fails alone."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from support.schemas import install

from alkstore_sa.names import schema_key
from alkstore_sa.ops.duties46 import _groups
from alkstore_sa.sql.v26 import supervision as sql26
from alkstore_sa.supervision import Supervisor


def sql(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def make_queues(engine: Engine, schema: str, *names: str) -> None:
    for name in names:
        sql(
            engine,
            schema,
            "SELECT {s}.create_queue(:n, jsonb_build_object('policy', 'standard'))",
            n=name,
        )


def seed_all(engine: Engine, schema: str) -> None:
    """The queues :data:`NAMES`, each seeded as :func:`seed` seeds one."""
    make_queues(engine, schema, *NAMES)
    for name in NAMES:
        seed(engine, schema, name)


def seed(engine: Engine, schema: str, name: str) -> None:
    """Jobs of every kind retention tells apart, and dependency rows whose job is gone."""
    sql(
        engine,
        schema,
        """INSERT INTO {s}.job (name, state, completed_on, deletion_seconds, keep_until) VALUES
        (:n, 'completed', now() - interval '2 days', 3600, now() + interval '1 day'),
        (:n, 'completed', now() - interval '3 days', 3600, now() + interval '1 day'),
        (:n, 'completed', now() - interval '2 days', 0, now() + interval '1 day'),
        (:n, 'cancelled', now() - interval '1 minute', 3600, now() + interval '1 day'),
        (:n, 'completed', now(), 3600, now() + interval '1 day'),
        (:n, 'created', NULL, 3600, now() - interval '1 second'),
        (:n, 'created', NULL, 3600, now() + interval '1 day')""",
        n=name,
    )
    sql(
        engine,
        schema,
        """INSERT INTO {s}.job_dependency (child_name, child_id, parent_name, parent_id)
        SELECT :n, id, :n, gen_random_uuid() FROM {s}.job WHERE name = :n AND state = 'created'
        UNION ALL
        SELECT :n, gen_random_uuid(), :n, id FROM {s}.job WHERE name = :n AND state = 'created'
        """,
        n=name,
    )


def outcome(engine: Engine, schema: str) -> Any:
    """What maintenance leaves, without the instants it stamps."""
    return SimpleNamespace(
        queues=sql(
            engine,
            schema,
            "SELECT name, retained_count, total_count, maintain_on IS NOT NULL AS stamped "
            "FROM {s}.queue ORDER BY name",
        ),
        jobs=sql(
            engine,
            schema,
            "SELECT name, state, deletion_seconds, count(*) FROM {s}.job "
            "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3",
        ),
        dependencies=sql(
            engine,
            schema,
            "SELECT child_name, count(*) FROM {s}.job_dependency GROUP BY 1 ORDER BY 1",
        ),
    )


def run(engine: Engine, schema: str, **settings: Any) -> Any:
    return Supervisor(engine, schema=schema, schedule=False, **settings).run_once(force=True)


@pytest.fixture
def other46(engine: Engine, database_url: str, spoken46: None) -> Iterator[str]:
    name = "t_" + uuid.uuid4().hex[:12]
    install(database_url, name, 46)
    yield name
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


NAMES = ("a", "b", "c", "d", "e")


def test_queues_maintained_together_end_as_queues_walked_one_at_a_time(
    engine: Engine, schema46: str, other46: str
) -> None:
    for schema in (schema46, other46):
        make_queues(engine, schema, *NAMES)
        for name in NAMES:
            seed(engine, schema, name)
    # Batches of 2 keys: every queue holds more, so each is walked alone in batches, as
    # pg-boss walks them; the default batch takes all five queues in one statement.
    together = run(engine, schema46)
    alone = run(engine, other46, delete_batch_size=2)
    assert together.errors == alone.errors == ()
    assert together.maintained == alone.maintained == NAMES
    assert together.deleted == alone.deleted == dict.fromkeys(NAMES, 3)
    left, walked = outcome(engine, schema46), outcome(engine, other46)
    assert left == walked
    # Kept: the deletion_seconds=0 job and the cancelled one (retained), the fresh
    # completion (after the watermark: in the total, not retained), the live created
    # job; the total also holds the created job past keep_until, which this pass's
    # monitor counted before the walk deleted it (as pg-boss adds them). None of the
    # dependency rows is left: each names a job that is gone, or was never there.
    assert [(q.name, q.retained_count, q.total_count, q.stamped) for q in left.queues] == [
        (n, 2, 5, True) for n in NAMES
    ]
    assert left.dependencies == []


def _count_statements(engine: Engine) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)

    return seen


def test_the_statements_of_a_chunk_do_not_grow_with_its_queues(
    database_url: str, engine: Engine, schema46: str, other46: str
) -> None:
    counts = []
    for schema, n in ((schema46, 10), (other46, 90)):
        names = [f"q{i:02}" for i in range(n)]
        make_queues(engine, schema, *names)
        for name in names:
            seed(engine, schema, name)
        counting = create_engine(database_url)
        try:
            seen = _count_statements(counting)
            report = run(counting, schema)
        finally:
            counting.dispose()
        assert report.maintained == tuple(names) and report.errors == ()
        counts.append(len(seen))
    # One chunk of 10 queues or of 90: the same statements (a walk per queue ran about
    # ten more per queue).
    assert counts[0] == counts[1]


def test_a_queue_whose_job_cannot_be_deleted_fails_alone(engine: Engine, schema46: str) -> None:
    seed_all(engine, schema46)
    # An application's table references one old job of "b": deleting it fails, and with
    # it the statement that deletes for every queue of the chunk.
    sql(
        engine,
        schema46,
        """CREATE TABLE {s}.receipt (name text, id uuid,
            FOREIGN KEY (name, id) REFERENCES {s}.job_common (name, id));
        INSERT INTO {s}.receipt SELECT name, id FROM {s}.job
            WHERE name = 'b' AND completed_on < now() - interval '1 day' AND deletion_seconds > 0
            LIMIT 1""",
    )
    report = run(engine, schema46)
    assert len(report.errors) == 1 and report.errors[0].startswith("delete: ")
    assert "receipt" in report.errors[0]
    assert report.maintained == ("a", "c", "d", "e")
    assert report.deleted == dict.fromkeys(("a", "c", "d", "e"), 3)
    queues = {q.name: q for q in outcome(engine, schema46).queues}
    assert not queues["b"].stamped and queues["b"].retained_count is None  # handed back
    assert all(queues[n].stamped and queues[n].retained_count == 2 for n in "acde")
    jobs = sql(engine, schema46, "SELECT name, count(*) FROM {s}.job GROUP BY 1 ORDER BY 1")
    assert [(j.name, j.count) for j in jobs] == [("a", 4), ("b", 7), ("c", 4), ("d", 4), ("e", 4)]
    # Its dependency rows were still cleaned, as the walk of one queue cleans them.
    assert sql(engine, schema46, "SELECT count(*) FROM {s}.job_dependency")[0][0] == 0


def test_a_queue_whose_dependency_rows_cannot_be_deleted_fails_alone(
    engine: Engine, schema46: str
) -> None:
    seed_all(engine, schema46)
    sql(
        engine,
        schema46,
        """CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS
            $$ BEGIN RAISE EXCEPTION 'kept by the application'; END $$;
        CREATE TRIGGER keep_c BEFORE DELETE ON {s}.job_dependency
            FOR EACH ROW WHEN (OLD.child_name = 'c') EXECUTE FUNCTION {s}.refuse()""",
    )
    report = run(engine, schema46)
    # c's walk by child and its walk by parent each fail; nothing else does.
    assert len(report.errors) == 2
    assert all(
        e.startswith("dependencies: ") and "kept by the application" in e for e in report.errors
    )
    assert report.maintained == ("a", "b", "d", "e")
    left = sql(engine, schema46, "SELECT DISTINCT child_name FROM {s}.job_dependency")
    assert [r.child_name for r in left] == ["c"]
    assert [q.name for q in outcome(engine, schema46).queues if not q.stamped] == ["c"]


@pytest.fixture
def short_lock_timeout(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sql26, "LOCK_TIMEOUT_MS", 300)
    sql26.local_timeouts.cache_clear()
    yield
    monkeypatch.undo()
    sql26.local_timeouts.cache_clear()


def test_a_lock_timeout_hands_back_the_rest_of_the_group(
    engine: Engine, schema46: str, short_lock_timeout: None
) -> None:
    make_queues(engine, schema46, "a", "b", "c")
    for name in "abc":
        seed(engine, schema46, name)
    with engine.connect() as holder:
        holder.execute(
            text(
                f"SELECT 1 FROM \"{schema46}\".job WHERE name = 'b' AND deletion_seconds > 0 "
                "AND completed_on < now() - interval '1 day' FOR UPDATE"
            )
        )
        report = run(engine, schema46)
        holder.rollback()
    # The statement over a, b and c waited, then each alone: a done, b waited again;
    # a lock held that long is not one queue's doing, so c waits for the next pass.
    assert report.maintained == ("a",)
    assert len(report.errors) == 1 and "lock timeout" in report.errors[0]
    stamped = {q.name: q.stamped for q in outcome(engine, schema46).queues}
    assert stamped == {"a": True, "b": False, "c": False}
    assert run(engine, schema46).maintained == ("a", "b", "c")


def test_a_big_queue_is_walked_alone_beside_the_small_ones(engine: Engine, schema46: str) -> None:
    make_queues(engine, schema46, "a", "big", "c")
    for name in ("a", "big", "c"):
        seed(engine, schema46, name)
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.job (name, state, completed_on, deletion_seconds)
        SELECT 'big', 'completed', now() - interval '2 days', 60 FROM generate_series(1, 20)""",
    )
    report = run(engine, schema46, delete_batch_size=8)
    assert report.errors == ()
    assert report.maintained == ("a", "big", "c")
    assert report.deleted == {"a": 3, "big": 23, "c": 3}
    queues = {q.name: (q.retained_count, q.total_count) for q in outcome(engine, schema46).queues}
    assert queues == {"a": (2, 5), "big": (2, 5), "c": (2, 5)}


def test_inside_the_callers_transaction_a_held_deletion_lock_hands_the_chunk_back(
    env46_sync: Any,
) -> None:
    env = env46_sync
    for name in "abc":
        env.tx(lambda q, name=name: q.create_queue(name))
    key = f"{schema_key(env.schema)}job_commondeletion"
    with env.engine.connect() as holder:
        lock = "SELECT pg_advisory_lock(" + _advisory_key_sql() + ")"
        holder.execute(text(lock), {"k": key})
        report = env.tx(lambda q: q.supervise(force=True))
        holder.execute(text("SELECT pg_advisory_unlock_all()"))
        holder.commit()
    assert report.maintained == ()
    assert "delete: job_commondeletion" in report.busy
    rows = env.sql("SELECT name FROM {s}.queue WHERE maintain_on IS NOT NULL")
    assert rows == []  # every claim handed back
    again = env.tx(lambda q: q.supervise(force=True))
    assert {"a", "b", "c"} <= set(again.maintained) and again.busy == ()


def _advisory_key_sql() -> str:
    # pg-boss's key for :k (schema + key), as the notes give it.
    return (
        "('x' || encode(sha224((current_database() || '.pgboss.' || :k)::bytea), 'hex'))"
        "::bit(64)::bigint"
    )


def test_a_long_queue_name_is_counted_and_maintained(engine: Engine, schema46: str) -> None:
    # Over 63 bytes: unnest(:names) AS n read n.name as a cast to the type "name",
    # which cut the name short, so the monitor wrote zeros for such a queue.
    name = "l" * 120
    make_queues(engine, schema46, name)
    seed(engine, schema46, name)
    report = run(engine, schema46)
    assert report.maintained == (name,) and report.deleted == {name: 3}
    (row,) = sql(
        engine,
        schema46,
        "SELECT queued_count, retained_count, total_count FROM {s}.queue WHERE name = :n",
        n=name,
    )
    assert (row.queued_count, row.retained_count, row.total_count) == (2, 2, 5)


def test_groups_hold_fewer_keys_than_a_batch_and_big_queues_go_alone() -> None:
    rows = [
        SimpleNamespace(name=name, jobs=jobs)
        for name, jobs in (("a", 3), ("b", 0), ("c", 6), ("d", 10), ("e", 9), ("f", 1))
    ]
    groups, alone = _groups(rows, "jobs", 10)
    assert groups == [["a", "b", "c"], ["e"], ["f"]]
    assert alone == ["d"]
    assert _groups([], "jobs", 10) == ([], [])
