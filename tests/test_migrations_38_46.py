"""The revisions for pg-boss schema versions 38 to 46, on a real PostgreSQL.

Each starts from a schema at 37 built by our own revisions, with queues created at 37
(partitioned ones of several policies among them), so that the index builds after
commit must reach partitions that existed before the upgrade. The catalog comparison
with Node pg-boss 12.38.0's own migration lives in ``tests/test_golden_schema46.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Connection, Engine, text
from support import catalog
from support.schemas import random_schema, throwaway

from alkstore_sa import migrate

QUEUES_AT_37: dict[str, dict[str, Any]] = {
    "shared": {"policy": "standard"},
    "parted": {"policy": "standard", "partition": True},
    "parted-short": {"policy": "short", "partition": True},
    "parted-fifo": {"policy": "key_strict_fifo", "partition": True},
}

# Every job table has these at 46; job_i5 is gone (replaced by i11 at 40).
INDEXES_46 = {"i4", "i7", "i9", "i11", "i12", "i13", "i14", "i15", "i16", "i17"}


@pytest.fixture
def at37(engine: Engine) -> Iterator[str]:
    """A schema at pg-boss version 37 with the ``QUEUES_AT_37`` and two schedules."""
    schema = random_schema("m46_")
    with throwaway(engine, schema):
        migrate.upgrade(engine, schema=schema, schema_version=37)
        with engine.begin() as conn:
            for name, options in QUEUES_AT_37.items():
                conn.execute(
                    text(f"SELECT {schema}.create_queue(:n, CAST(:o AS jsonb))"),
                    {"n": name, "o": json.dumps(options)},
                )
            conn.execute(
                text(
                    f"INSERT INTO {schema}.schedule (name, key, cron, timezone, options) VALUES "
                    "('shared', 'cron', '*/5 * * * *', NULL, '{}'), "
                    "('shared', 'rule', 'DTSTART:20260101T000000Z\nRRULE:FREQ=DAILY', "
                    "'Europe/Paris', '{}'), "
                    "('shared', 'inline', 'FREQ=HOURLY;INTERVAL=2', NULL, '{}')"
                )
            )
            conn.execute(
                text(
                    f"UPDATE {schema}.queue SET monitor_on = "
                    "'2026-01-02 03:04:05+00' WHERE name = 'parted'"
                )
            )
        yield schema


def _table(conn: Connection, schema: str, queue: str) -> str:
    return str(
        conn.execute(
            text(f"SELECT table_name FROM {schema}.queue WHERE name = :q"), {"q": queue}
        ).scalar_one()
    )


def _indexes(conn: Connection, schema: str, table: str) -> dict[str, bool]:
    """``iN`` suffix -> valid, for the job indexes of ``table``."""
    rows = conn.execute(
        text(
            "SELECT i.relname, x.indisvalid FROM pg_index x "
            "JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class t ON t.oid = x.indrelid "
            "JOIN pg_namespace n ON n.oid = t.relnamespace "
            "WHERE n.nspname = :s AND t.relname = :t AND NOT x.indisprimary"
        ),
        {"s": schema, "t": table},
    )
    return {str(name).rsplit("_", 1)[1]: bool(valid) for name, valid in rows}


def _version(conn: Connection, schema: str) -> int:
    return int(conn.execute(text(f"SELECT version FROM {schema}.version")).scalar_one())


def test_upgrade_builds_valid_indexes_on_job_common_and_partitions_made_before(
    engine: Engine, at37: str
) -> None:
    migrate.upgrade(engine, schema=at37, schema_version=46)
    with engine.connect() as conn:
        assert _version(conn, at37) == 46
        common = _indexes(conn, at37, "job_common")
        parted = _indexes(conn, at37, _table(conn, at37, "parted"))
        short = _indexes(conn, at37, _table(conn, at37, "parted-short"))
        fifo = _indexes(conn, at37, _table(conn, at37, "parted-fifo"))
    assert all(common.values()) and all(parted.values()) and all(fifo.values())
    assert set(common) == INDEXES_46 | {"i1", "i2", "i3", "i6", "i8", "i10"}
    # job_i10 only where key_strict_fifo jobs can live, as pg-boss builds it.
    assert set(parted) == INDEXES_46
    assert set(short) == INDEXES_46 | {"i1"}
    assert set(fifo) == INDEXES_46 | {"i8", "i10"}


def test_upgrade_leaves_no_bam_row_for_a_node_instance_to_run(engine: Engine, at37: str) -> None:
    migrate.upgrade(engine, schema=at37, schema_version=46)
    with engine.connect() as conn:
        left = conn.execute(
            text(f"SELECT count(*) FROM {at37}.bam WHERE status <> 'completed'")
        ).scalar_one()
    assert left == 0


def test_downgrade_to_37_restores_the_37_catalog(engine: Engine, at37: str) -> None:
    before = catalog.snapshot(engine, at37)
    migrate.upgrade(engine, schema=at37, schema_version=46)
    migrate.downgrade(engine, schema=at37, schema_version=37)
    after = catalog.snapshot(engine, at37)
    catalog.assert_same(before, after, ("37", "after 46 and back"))


def test_each_downgrade_forgets_its_unfinished_bam_rows(engine: Engine, at37: str) -> None:
    migrate.upgrade(engine, schema=at37, schema_version=46)
    with engine.begin() as conn:
        # What a Node migration to 46 would have enqueued, one finished and one not.
        conn.execute(
            text(
                f"INSERT INTO {at37}.bam (name, version, status, table_name, command) VALUES "
                "('live_index_build', 46, 'pending', 'job_common', 'SELECT 1'), "
                "('created_index_build', 46, 'completed', 'job_common', 'SELECT 1'), "
                "('upsert_index_build', 45, 'pending', 'job_common', 'SELECT 1')"
            )
        )
    migrate.downgrade(engine, schema=at37, schema_version=45)
    with engine.connect() as conn:
        rows = sorted(conn.execute(text(f"SELECT version, status FROM {at37}.bam")).all())
    assert rows == [(45, "pending"), (46, "completed")]


def test_job_now_reads_the_transaction_time_and_stamps_new_queues(
    engine: Engine, at37: str
) -> None:
    migrate.upgrade(engine, schema=at37, schema_version=46)
    with engine.begin() as conn:
        same, volatility = conn.execute(
            text(
                f"SELECT {at37}.job_now() = now(), p.provolatile FROM pg_proc p "
                "JOIN pg_namespace n ON n.oid = p.pronamespace "
                "WHERE n.nspname = :s AND p.proname = 'job_now'"
            ),
            {"s": at37},
        ).one()
        conn.execute(text(f"SELECT {at37}.create_queue('later', '{{\"policy\": \"standard\"}}')"))
        created, updated = conn.execute(
            text(
                "SELECT created_on = now(), updated_on = now() "
                f"FROM {at37}.queue WHERE name = 'later'"
            )
        ).one()
    assert same and volatility == "s"
    assert created and updated
    migrate.downgrade(engine, schema=at37, schema_version=41)
    with engine.connect() as conn:
        gone = conn.execute(
            text("SELECT to_regprocedure(quote_ident(:s) || '.job_now()') IS NULL"), {"s": at37}
        ).scalar_one()
    assert gone


def test_upgrade_moves_data_as_pg_boss_does(engine: Engine, at37: str) -> None:
    migrate.upgrade(engine, schema=at37, schema_version=46)
    with engine.connect() as conn:
        schedules = {
            key: (kind, zone)
            for key, kind, zone in conn.execute(
                text(f"SELECT key, kind, timezone FROM {at37}.schedule")
            )
        }
        claims: dict[str, bool | None] = {
            name: seeded
            for name, seeded in conn.execute(
                text(f"SELECT name, monitor_claim_on = monitor_on FROM {at37}.queue")
            )
        }
    assert schedules == {
        "cron": ("cron", "UTC"),
        "rule": ("rrule", "Europe/Paris"),
        "inline": ("rrule", "UTC"),
    }
    # Seeded from monitor_on where there was one; NULL stays NULL.
    assert claims["parted"] is True
    assert claims["shared"] is None


def test_a_queue_created_at_46_gets_the_46_partition_shape(engine: Engine, at37: str) -> None:
    migrate.upgrade(engine, schema=at37, schema_version=46)
    with engine.begin() as conn:
        conn.execute(
            text(
                f"SELECT {at37}.create_queue('new-fifo', "
                """'{"policy": "key_strict_fifo", "partition": true}')"""
            )
        )
        table = _table(conn, at37, "new-fifo")
        indexes = _indexes(conn, at37, table)
        checks = conn.execute(
            text(
                "SELECT conname FROM pg_constraint WHERE contype = 'c' "
                "AND conrelid = to_regclass(quote_ident(:s) || '.' || quote_ident(:t))"
            ),
            {"s": at37, "t": table},
        ).scalars()
        check_names = set(checks)
    assert set(indexes) == INDEXES_46 | {"i8", "i10"}
    assert check_names == {"cjc", "job_key_strict_fifo_singleton_key_check"}


def test_an_interrupted_build_is_finished_and_its_invalid_index_rebuilt(
    engine: Engine, database_url: str, at37: str
) -> None:
    migrate.upgrade(engine, schema=at37, schema_version=45)
    with engine.connect() as conn:
        table = _table(conn, at37, "parted")
    # The state a cancelled CREATE INDEX CONCURRENTLY leaves: the version row already
    # reads 46 (its transaction committed) and one of its indexes is INVALID.
    with engine.begin() as conn:
        conn.execute(
            text(
                f"ALTER TABLE {at37}.queue ADD COLUMN retained_count int, "
                "ADD COLUMN retained_on timestamp with time zone"
            )
        )
        conn.execute(text(f"UPDATE {at37}.version SET version = 46"))
        conn.execute(text(f'CREATE INDEX "{table}_i15" ON {at37}."{table}" (name, created_on)'))
        conn.execute(
            text(
                "UPDATE pg_index SET indisvalid = false WHERE indexrelid = "
                "to_regclass(quote_ident(:s) || '.' || quote_ident(:i))"
            ),
            {"s": at37, "i": f"{table}_i15"},
        )
    # Through Alembic's own command, which opens its own connection: the builds run
    # CONCURRENTLY, after commit, as from a user's `alembic upgrade`.
    command.upgrade(migrate.alembic_config(at37, database_url), "alkstore_0046")
    with engine.connect() as conn:
        indexes = _indexes(conn, at37, table)
    assert set(indexes) == INDEXES_46
    assert all(indexes.values())
