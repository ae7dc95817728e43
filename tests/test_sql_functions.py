"""``create_queue(text, jsonb)`` and ``delete_queue(text)`` behave as pg-boss's own.

Our two plpgsql functions are written from the documented behaviour of pg-boss's
functions, not copied. Each test installs our migration in one schema and Node
pg-boss 11.1.2's construction plan in another, sends both the very statements the
Node client sends (``SELECT <schema>.create_queue('<name>', '<json>'::jsonb)`` inside
its advisory-locked transaction), and compares the resulting queue rows and catalogs.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support import catalog
from support.pgboss_plans import client_statements
from support.schemas import install_with_node_plan, random_schema, run_script, throwaway

from alkstore_sa import migrate
from alkstore_sa.names import partition_table_name

POLICIES = ["standard", "short", "singleton", "stately", "exclusive"]

ALL_OPTIONS: dict[str, Any] = {
    "retryLimit": 7,
    "retryDelay": 3,
    "retryBackoff": True,
    "retryDelayMax": 40,
    "expireInSeconds": 120,
    "retentionSeconds": 3600,
    "deleteAfterSeconds": 600,
    "warningQueueSize": 50,
}

# Set by the database at insert time; equal in content but not in value.
_VOLATILE = {"created_on", "updated_on"}


@dataclass
class Pair:
    """Our schema and pg-boss's, built side by side in one database."""

    engine: Engine
    database_url: str
    ours: str
    theirs: str

    @property
    def schemas(self) -> tuple[str, str]:
        return (self.ours, self.theirs)

    def client(self, *calls: list[Any]) -> None:
        """Run the Node client's statements for ``calls`` against both schemas."""
        for statements in client_statements(list(self.schemas), list(calls)).values():
            for statement in statements:
                run_script(self.database_url, statement)

    def sql(self, schema: str, statement: str, **params: Any) -> list[Any]:
        with self.engine.begin() as conn:
            result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
            return list(result.all()) if result.returns_rows else []

    def each(self, statement: str, **params: Any) -> tuple[list[Any], list[Any]]:
        return self.sql(self.ours, statement, **params), self.sql(self.theirs, statement, **params)

    def queues(self, schema: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(text(f'SELECT * FROM "{schema}".queue ORDER BY name')).mappings()
            return [{k: v for k, v in r.items() if k not in _VOLATILE} for r in rows]

    def assert_same(self) -> None:
        assert self.queues(self.ours) == self.queues(self.theirs)
        catalog.assert_same(
            catalog.snapshot(self.engine, self.theirs),
            catalog.snapshot(self.engine, self.ours),
            ("pg-boss 11.1.2 functions", "alkstore functions"),
        )


@pytest.fixture
def pair(engine: Engine, database_url: str) -> Iterator[Pair]:
    ours, theirs = random_schema(), random_schema()
    with throwaway(engine, ours, theirs):
        migrate.upgrade(engine, ours, schema_version=26)
        install_with_node_plan(database_url, theirs)
        yield Pair(engine, database_url, ours, theirs)


def _insert_jobs(pair: Pair, name: str, count: int) -> None:
    for schema in pair.schemas:
        pair.sql(
            schema,
            "INSERT INTO {s}.job (name, data)"
            " SELECT :name, to_jsonb(g) FROM generate_series(1, :n) g",
            name=name,
            n=count,
        )


@pytest.mark.interop
@pytest.mark.parametrize(("policy", "partition"), list(itertools.product(POLICIES, [False, True])))
def test_create_queue_with_every_option_matches_pgboss(
    pair: Pair, policy: str, partition: bool
) -> None:
    options = {**ALL_OPTIONS, "policy": policy, "partition": partition, "deadLetter": "dlq"}
    pair.client(["create-queue", "dlq", {}], ["create-queue", "orders", options])
    pair.assert_same()
    [row] = [q for q in pair.queues(pair.ours) if q["name"] == "orders"]
    assert row["policy"] == policy and row["partition"] is partition
    assert row["table_name"] == (partition_table_name("orders") if partition else "job_common")


@pytest.mark.interop
@pytest.mark.parametrize("partition", [False, True])
def test_create_queue_without_options_applies_pgboss_defaults(pair: Pair, partition: bool) -> None:
    pair.client(["create-queue", "plain", {"partition": partition} if partition else {}])
    pair.assert_same()
    [row] = pair.queues(pair.ours)
    assert (
        row["retry_limit"],
        row["retry_delay"],
        row["retry_backoff"],
        row["retry_delay_max"],
        row["expire_seconds"],
        row["retention_seconds"],
        row["deletion_seconds"],
        row["warning_queued"],
        row["dead_letter"],
    ) == (2, 0, False, None, 900, 1_209_600, 604_800, 0, None)


@pytest.mark.interop
@pytest.mark.parametrize("partition", [False, True])
def test_create_queue_for_an_existing_queue_is_a_silent_no_op(pair: Pair, partition: bool) -> None:
    pair.client(
        ["create-queue", "same", {"policy": "short", "partition": partition}],
        [
            "create-queue",
            "same",
            {"policy": "stately", "partition": not partition, "retryLimit": 9},
        ],
    )
    pair.assert_same()
    [row] = pair.queues(pair.ours)
    assert (row["policy"], row["partition"], row["retry_limit"]) == ("short", partition, 2)


@pytest.mark.interop
def test_partition_accepts_and_routes_only_its_own_queue(pair: Pair) -> None:
    pair.client(["create-queue", "mine", {"partition": True}], ["create-queue", "shared", {}])
    _insert_jobs(pair, "mine", 2)
    _insert_jobs(pair, "shared", 3)
    table = partition_table_name("mine")
    counts = pair.each(
        "SELECT tableoid::regclass::text AS t, count(*) FROM {s}.job GROUP BY 1 ORDER BY 1"
    )
    assert [(t.split(".")[-1], n) for t, n in counts[0]] == [
        (t.split(".")[-1], n) for t, n in counts[1]
    ]
    assert sorted(n for _, n in counts[0]) == [2, 3]
    assert any(t.endswith(table) for t, _ in counts[0])


@pytest.mark.interop
def test_delete_of_a_partitioned_queue_drops_its_table_and_row(pair: Pair) -> None:
    pair.client(
        ["create-queue", "gone", {"policy": "singleton", "partition": True}],
        ["create-queue", "kept", {}],
    )
    _insert_jobs(pair, "gone", 3)
    _insert_jobs(pair, "kept", 2)
    pair.client(["delete-queue", "gone"])
    pair.assert_same()
    assert [q["name"] for q in pair.queues(pair.ours)] == ["kept"]
    [[(found,)], _] = pair.each("SELECT to_regclass(:t) IS NULL", t=partition_table_name("gone"))
    assert found
    assert pair.sql(pair.ours, "SELECT name, count(*) FROM {s}.job GROUP BY name") == [("kept", 2)]


@pytest.mark.interop
def test_delete_of_a_shared_queue_removes_only_its_jobs_and_cascades(pair: Pair) -> None:
    pair.client(["create-queue", "gone", {}], ["create-queue", "kept", {}])
    _insert_jobs(pair, "gone", 3)
    _insert_jobs(pair, "kept", 2)
    for schema in pair.schemas:
        pair.sql(schema, "INSERT INTO {s}.schedule (name, cron) VALUES ('gone', '* * * * *')")
        pair.sql(schema, "INSERT INTO {s}.subscription (event, name) VALUES ('ev', 'gone')")
    pair.client(["delete-queue", "gone"])
    pair.assert_same()
    ours, theirs = pair.each(
        "SELECT (SELECT count(*) FROM {s}.job WHERE name = 'gone'),"
        " (SELECT count(*) FROM {s}.job WHERE name = 'kept'),"
        " (SELECT count(*) FROM {s}.schedule), (SELECT count(*) FROM {s}.subscription)"
    )
    assert ours == theirs == [(0, 2, 0, 0)]


@pytest.mark.interop
def test_functions_quote_names_the_client_cannot_send(pair: Pair) -> None:
    # Node pastes names into SQL text; through bind parameters both functions must
    # cope with quotes, upper case and hyphens in a queue name.
    name = "Mixed-Case 'quoted' queue"
    for schema in pair.schemas:
        pair.sql(
            schema,
            "SELECT {s}.create_queue(:n, CAST(:o AS jsonb))",
            n=name,
            o='{"policy": "exclusive", "partition": true}',
        )
    _insert_jobs(pair, name, 1)
    pair.assert_same()
    for schema in pair.schemas:
        pair.sql(schema, "SELECT {s}.delete_queue(:n)", n=name)
    pair.assert_same()
    assert pair.queues(pair.ours) == []


def test_create_queue_partitions_inside_a_mixed_case_schema(engine: Engine) -> None:
    # pg-boss's own functions cannot do this (it folds the schema name); ours must.
    schema = random_schema("Boss_Q_")
    with throwaway(engine, schema):
        migrate.upgrade(engine, schema, schema_version=26)
        with engine.begin() as conn:
            conn.execute(
                text(f'SELECT "{schema}".create_queue(:n, CAST(:o AS jsonb))'),
                {"n": "q", "o": '{"policy": "short", "partition": true}'},
            )
            conn.execute(text(f"INSERT INTO \"{schema}\".job (name) VALUES ('q')"))
        snap = catalog.snapshot(engine, schema)
        table = partition_table_name("q")
        assert any(r.startswith(f"{table} kind=r") and "parent=job" in r for r in snap["relations"])
        assert f"{table}_i1" in {r.split()[0] for r in snap["relations"]}
        with engine.begin() as conn:
            conn.execute(text(f"SELECT \"{schema}\".delete_queue('q')"))
        assert table not in {r.split()[0] for r in catalog.snapshot(engine, schema)["relations"]}


@pytest.mark.interop
def test_delete_of_a_missing_queue_is_silent_in_ours(pair: Pair) -> None:
    # pg-boss's function raises here (a NULL table name reaches format('%I')); its
    # client checks first and swallows errors, so a no-op is the same observable result.
    pair.sql(pair.ours, "SELECT {s}.delete_queue('nope')")
    assert pair.queues(pair.ours) == []


@pytest.mark.interop
def test_partition_flag_must_be_json_true_for_a_dedicated_table(pair: Pair) -> None:
    # Only the JSON value true selects a partition; the string "true" does too
    # (->> yields text), anything else leaves the queue on job_common.
    for schema in pair.schemas:
        pair.sql(
            schema,
            "SELECT {s}.create_queue('as-text', CAST(:o AS jsonb))",
            o='{"policy": "standard", "partition": "true"}',
        )
        pair.sql(
            schema,
            "SELECT {s}.create_queue('as-false', CAST(:o AS jsonb))",
            o='{"policy": "standard", "partition": false}',
        )
    pair.assert_same()
    rows = {q["name"]: (q["partition"], q["table_name"]) for q in pair.queues(pair.ours)}
    assert rows == {
        "as-text": (True, partition_table_name("as-text")),
        "as-false": (False, "job_common"),
    }


@pytest.mark.interop
def test_delete_queue_never_drops_the_shared_partition(pair: Pair) -> None:
    # {"partition": 1} gives a row with partition = true but table job_common (in
    # both implementations). pg-boss's delete_queue then drops job_common with every
    # other queue's jobs; ours deletes only the queue's own rows.
    for schema in pair.schemas:
        pair.sql(
            schema,
            "SELECT {s}.create_queue('odd', CAST(:o AS jsonb))",
            o='{"policy": "standard", "partition": 1}',
        )
        pair.sql(
            schema,
            "SELECT {s}.create_queue('other', CAST(:o AS jsonb))",
            o='{"policy": "standard"}',
        )
    assert pair.queues(pair.ours) == pair.queues(pair.theirs)
    [odd, _] = pair.queues(pair.ours)
    assert (odd["partition"], odd["table_name"]) == (True, "job_common")
    _insert_jobs(pair, "odd", 1)
    _insert_jobs(pair, "other", 2)
    pair.sql(pair.ours, "SELECT {s}.delete_queue('odd')")
    assert pair.sql(pair.ours, "SELECT name, count(*) FROM {s}.job_common GROUP BY name") == [
        ("other", 2)
    ]
