"""Supervision at schema 46: each duty of pg-boss 12.38's supervisor, by its effect on rows."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text

from alkstore_sa.names import schema_key
from alkstore_sa.ops.duties46 import occurrence_key, slot_of
from alkstore_sa.sql.v46 import supervision as supervision46_sql
from alkstore_sa.supervision import Supervisor


def sql(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def make_queue(engine: Engine, schema: str, name: str, options: str = "{}") -> None:
    opts = options[:-1] + (", " if options != "{}" else "") + '"policy": "standard"}'
    sql(engine, schema, "SELECT {s}.create_queue(:n, CAST(:o AS jsonb))", n=name, o=opts)


def queue_row(engine: Engine, schema: str, name: str) -> Any:
    return sql(engine, schema, "SELECT * FROM {s}.queue WHERE name = :n", n=name)[0]


def run(engine: Engine, schema: str, **settings: Any) -> Any:
    return Supervisor(engine, schema=schema, **settings).run_once(force=True)


def test_monitor_counts_blocked_apart_and_stamps_monitor_on_with_the_counts(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.job (name, state, start_after, blocked) VALUES
        ('q', 'created', now() - interval '1 minute', false),
        ('q', 'retry', now() - interval '1 minute', false),
        ('q', 'created', now() + interval '1 hour', false),
        ('q', 'created', now() + interval '1 hour', true),
        ('q', 'created', now(), true)""",
    )
    sql(
        engine,
        schema46,
        "INSERT INTO {s}.job (name, state, started_on) VALUES ('q', 'active', now())",
    )
    report = run(engine, schema46)
    row = queue_row(engine, schema46, "q")
    assert "q" in report.monitored
    split = (row.queued_count, row.ready_count, row.deferred_count, row.blocked_count)
    assert split == (5, 2, 1, 2)  # queued = ready + deferred + blocked
    assert row.active_count == 1
    assert row.ready_history == [2]
    assert row.monitor_on is not None and row.monitor_claim_on is not None
    run(engine, schema46)
    assert queue_row(engine, schema46, "q").ready_history == [2, 2]


def test_losing_the_stats_lock_writes_no_counts_and_hands_the_claims_back(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    sql(engine, schema46, "INSERT INTO {s}.job (name) VALUES ('q')")
    key = node_key(current_db(engine), schema_key(schema46), "queue-stats")
    with engine.connect() as other:
        other.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        try:
            report = run(engine, schema46)
        finally:
            other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            other.commit()
    row = queue_row(engine, schema46, "q")
    assert "q" in report.monitored
    assert row.queued_count == 0 and row.monitor_on is None
    assert row.monitor_claim_on is None  # due again at once
    run(engine, schema46)
    assert queue_row(engine, schema46, "q").queued_count == 1


def test_monitor_backoff_skips_the_aggregate_but_still_expires(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.job (name, state, started_on, expire_seconds, retry_limit)
        VALUES ('q', 'active', now() - interval '1 hour', 60, 0)""",
    )
    sql(engine, schema46, "UPDATE {s}.version SET monitor_backoff_on = now() + interval '1 hour'")
    report = run(engine, schema46)
    row = queue_row(engine, schema46, "q")
    assert row.monitor_on is None and row.active_count == 0
    assert report.expired == {"q": 1}
    states = sql(engine, schema46, "SELECT state, output FROM {s}.job WHERE name = 'q'")
    assert [s.state for s in states] == ["failed"]


def test_expiry_by_lease_and_by_heartbeat_in_the_same_monitor_turn(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.job (name, state, started_on, heartbeat_on, heartbeat_seconds,
                                expire_seconds, retry_limit) VALUES
        ('q', 'active', now() - interval '1 hour', now() - interval '1 hour', NULL, 60, 0),
        ('q', 'active', now() - interval '1 minute', now() - interval '1 minute', 10, 900, 0),
        ('q', 'active', now(), now(), 10, 900, 0)""",
    )
    report = run(engine, schema46)
    assert report.expired == {"q": 2}
    rows = sql(engine, schema46, "SELECT state, output FROM {s}.job ORDER BY state")
    assert sorted(r.state for r in rows) == ["active", "failed", "failed"]
    messages = {r.output["value"]["message"] for r in rows if r.state == "failed"}
    assert messages == {"job timed out", "job heartbeat timeout"}


def test_maintenance_deletes_what_is_due_keeps_deletion_zero_and_counts_what_it_kept(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.job (name, state, completed_on, deletion_seconds) VALUES
        ('q', 'completed', now() - interval '2 days', 3600),
        ('q', 'completed', now() - interval '2 days', 0),
        ('q', 'cancelled', now() - interval '1 minute', 3600)""",
    )
    sql(
        engine,
        schema46,
        "INSERT INTO {s}.job (name, keep_until) VALUES ('q', now() - interval '1 second')",
    )
    report = run(engine, schema46)
    assert report.maintained == ("q",) and report.deleted == {"q": 2}
    left = sql(engine, schema46, "SELECT state, deletion_seconds FROM {s}.job ORDER BY state")
    assert [(r.state, r.deletion_seconds) for r in left] == [("completed", 0), ("cancelled", 3600)]
    row = queue_row(engine, schema46, "q")
    assert row.retained_count == 2 and row.retained_on is not None
    # The live jobs as this pass's monitor counted them (before the walk deleted
    # the queued job past keep_until) + the retained ones, as pg-boss adds them.
    assert row.total_count == 1 + 2
    assert row.maintain_on is not None


def test_dependency_rows_whose_job_is_gone_are_cleaned(engine: Engine, schema46: str) -> None:
    make_queue(engine, schema46, "q")
    (live,) = sql(engine, schema46, "INSERT INTO {s}.job (name) VALUES ('q') RETURNING id")
    gone = uuid.uuid4()
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.job_dependency (child_name, child_id, parent_name, parent_id) VALUES
        ('q', :live, 'q', :gone), ('q', :gone, 'q', :live)""",
        live=live.id,
        gone=gone,
    )
    run(engine, schema46)
    assert sql(engine, schema46, "SELECT count(*) FROM {s}.job_dependency")[0][0] == 0
    # Both rows named a job that is gone on one side: child first, then parent.


@pytest.mark.parametrize("side", ["child", "parent"])
@pytest.mark.parametrize("cursor", [False, True])
def test_dependency_cleanup_probes_each_job_by_primary_key_without_statistics(
    engine: Engine, schema46: str, side: str, cursor: bool
) -> None:
    # On tables never analyzed, a job lookup bounded by the batch's key range was
    # planned as a range scan repeated for every dependency row (seconds to
    # minutes per batch of 10,000). The lookup must be an index probe on the job's
    # (name, id), whatever the statistics say.
    make_queue(engine, schema46, "q")
    sql(engine, schema46, "INSERT INTO {s}.job (name) SELECT 'q' FROM generate_series(1, 3000)")
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.job_dependency (child_name, child_id, parent_name, parent_id)
        SELECT 'q', id, 'q', gen_random_uuid() FROM {s}.job""",
    )
    stmt = supervision46_sql.cleanup_dependencies(side, cursor=cursor)
    compiled = stmt.compile(
        dialect=engine.dialect,
        schema_translate_map={"pgboss": schema46},
        render_schema_translate=True,
    )
    after = uuid.UUID(int=1 << 127) if cursor else None
    params = compiled.construct_params({"qname": "q", "after": after, "batch": 10_000})
    with engine.begin() as conn:
        plan = "\n".join(
            r[0] for r in conn.exec_driver_sql("EXPLAIN " + compiled.string, params).all()
        )
    removed = plan.split("CTE removed")[1]
    assert "Anti Join" not in removed and "Join Filter" not in removed, plan
    assert re.search(rf"Index Cond: .*\(id = job_dependency\w*\.{side}_id\)", removed), plan


def test_instance_upkeep_deletes_rows_quiet_for_a_week(engine: Engine, schema46: str) -> None:
    for age in ("8 days", "1 minute"):
        sql(
            engine,
            schema46,
            f"""INSERT INTO {{s}}.instance (id, host, pid, version, node_version,
                heartbeat_seconds, supervise, schedule, migrate, persist_queue_stats,
                persist_warnings, heartbeat_on)
            VALUES (gen_random_uuid(), 'h', 1, '12.38.0', 'v22', 30, true, true, false,
                false, false, now() - interval '{age}')""",
        )
    run(engine, schema46)
    assert sql(engine, schema46, "SELECT count(*) FROM {s}.instance")[0][0] == 1


def test_backlog_warning_is_written_only_with_persist_warnings(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q", '{"warningQueueSize": 1}')
    sql(engine, schema46, "INSERT INTO {s}.job (name) SELECT 'q' FROM generate_series(1, 3)")
    report = run(engine, schema46)
    assert [w.queue for w in report.warnings] == ["q"]
    assert sql(engine, schema46, "SELECT count(*) FROM {s}.warning")[0][0] == 0
    run(engine, schema46, persist_warnings=True)
    (row,) = sql(engine, schema46, "SELECT type, message, data FROM {s}.warning")
    assert row.type == "queue_backlog" and 'queue "q" has 3 jobs' in row.message
    assert row.data["queuedCount"] == 3


def test_cron_files_an_occurrence_under_the_escaped_key_and_its_slot(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "my_q")
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.schedule (name, key, kind, cron, timezone, data, options)
        VALUES ('my_q', 'k', 'cron', '* * * * *', 'UTC', '{"a": 1}', '{}')""",
    )
    report = run(engine, schema46, supervise=False)
    assert report.cron_checked
    (job,) = sql(
        engine,
        schema46,
        "SELECT singleton_key, singleton_on, data FROM {s}.job WHERE name = '__pgboss__send-it'",
    )
    assert job.singleton_key == "my\\_q__k" == occurrence_key("my_q", "k")
    assert job.singleton_on.second == 0 and job.data["key"] == "k"
    # A second timekeeper in the same minute files nothing more.
    sql(engine, schema46, "UPDATE {s}.version SET cron_on = NULL")
    run(engine, schema46, supervise=False)
    count = sql(engine, schema46, "SELECT count(*) FROM {s}.job WHERE name = '__pgboss__send-it'")
    assert count[0][0] in (1, 2)  # 2 only if the minute turned between the two passes


def test_send_it_sends_and_records_the_last_job(engine: Engine, schema46: str) -> None:
    make_queue(engine, schema46, "q")
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.schedule (name, key, kind, cron, timezone, data, options)
        VALUES ('q', '', 'cron', '* * * * *', 'UTC', '{"a": 1}', '{"missed": "once"}')""",
    )
    report = run(engine, schema46, supervise=False)
    assert report.sent == 1
    (job,) = sql(engine, schema46, "SELECT id, data FROM {s}.job WHERE name = 'q'")
    assert job.data == {"a": 1}
    assert sql(engine, schema46, "SELECT last_job_id FROM {s}.schedule")[0][0] == job.id


def test_slot_is_the_utc_minute_as_naive_wall_time() -> None:
    instant = dt.datetime(2026, 3, 1, 12, 34, 56, 789, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert slot_of(instant) == dt.datetime(2026, 3, 1, 10, 34)


def current_db(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SELECT current_database()")).scalar_one())


def node_key(db: str, schema: str, key: str) -> int:
    """pg-boss's advisory key, computed as its notes give it."""
    digest = hashlib.sha224(f"{db}.pgboss.{schema}{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


@pytest.mark.parametrize("key", ["queue-stats", "job_commonfailJobsByHeartbeat"])
def test_advisory_keys_are_computed_as_node_computes_them(
    engine: Engine, schema46: str, key: str
) -> None:
    from sqlalchemy import Text, bindparam, select

    from alkstore_sa.sql.common.base import advisory_key

    stmt = select(advisory_key(bindparam("k", type_=Text)))
    with engine.connect() as conn:
        ours = conn.execute(stmt, {"k": schema46 + key}).scalar_one()
    assert ours == node_key(current_db(engine), schema46, key)


def test_the_migration_lock_key_is_node_s_key(engine: Engine) -> None:
    """The key revisions lock (rendered as text) is pg-boss's, for an awkward name too."""
    from sqlalchemy import text

    from alkstore_sa.migrations.helpers import lock_key_sql

    # A name that needs quotes is configured in Node in quotes, which its key keeps.
    with engine.connect() as conn:
        for schema, configured in (("pgboss", "pgboss"), ("Odd Name", '"Odd Name"')):
            ours = conn.execute(text(f"SELECT {lock_key_sql(schema)}")).scalar_one()
            assert ours == node_key(current_db(engine), configured, "")


def test_a_schedule_at_46_names_its_kind_zone_key_and_missed_policy(env46: Any) -> None:
    env46.tx(lambda s: s.create_queue("q"))
    env46.tx(lambda s: s.schedule("q", "*/5 * * * *", {"a": 1}, missed="once"))
    (row,) = env46.sql("SELECT kind, timezone, key, options FROM {s}.schedule")
    assert (row.kind, row.timezone, row.key) == ("cron", "UTC", "")
    assert row.options["missed"] == "once"
