"""Queue-stats history at schema 46 (pg-boss 12.38's ``persistQueueStats``): the
throughput window, the histograms, the ``queue_stats`` rows, their day partitions and
retention, the true-up, and the rule that writes history in a turn we win while
another instance persists it. Expected values are worked out here from the jobs."""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text

from alkstore_sa.cli import main
from alkstore_sa.clock import FakeClock
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.supervision import Supervisor


def sql(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def make_queue(engine: Engine, schema: str, name: str) -> None:
    opts = '{"policy": "standard"}'
    sql(engine, schema, "SELECT {s}.create_queue(:n, CAST(:o AS jsonb))", n=name, o=opts)


def db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as conn:
        value: dt.datetime = conn.execute(text("SELECT now()")).scalar_one()
    return value


def history(engine: Engine, schema: str, name: str) -> list[Any]:
    return sql(
        engine, schema, "SELECT * FROM {s}.queue_stats WHERE name = :n ORDER BY captured_on", n=name
    )


def slot(seconds: float) -> int:
    """The histogram slot of a duration: 0 under 10 ms, then one slot per factor √2."""
    if seconds < 0.01:
        return 0
    return min(47, math.floor(math.log(seconds / 0.01) / math.log(math.sqrt(2))) + 1)


def bins(durations: list[float]) -> list[int | None]:
    out: list[int | None] = [None] * 48
    for d in durations:
        k = slot(d)
        out[k] = (out[k] or 0) + 1
    return out


def job(
    engine: Engine,
    schema: str,
    state: str,
    created: dt.datetime,
    started: dt.datetime | None = None,
    completed: dt.datetime | None = None,
    start_after: dt.datetime | None = None,
) -> None:
    sql(
        engine,
        schema,
        """INSERT INTO {s}.job (name, state, created_on, start_after, started_on, completed_on)
        VALUES ('q', CAST(:state AS {s}.job_state), :c, :a, :st, :co)""",
        state=state,
        c=created,
        a=start_after or created,
        st=started,
        co=completed,
    )


def supervisor(engine: Engine, schema: str, clock: FakeClock, **settings: Any) -> Supervisor:
    return Supervisor(engine, schema=schema, clock=clock, schedule=False, **settings)


def test_a_pass_records_the_window_its_deltas_and_histograms(engine: Engine, schema46: str) -> None:
    make_queue(engine, schema46, "q")
    now = db_now(engine)
    clock = FakeClock(now)
    start = now - dt.timedelta(minutes=30)  # the window the last counted pass left
    sql(engine, schema46, "UPDATE {s}.queue SET delta_on = :d WHERE name = 'q'", d=start)
    end = now - dt.timedelta(seconds=10)  # the window ends DELTA_LAG behind the pass
    inside = start + dt.timedelta(minutes=5)
    ms = dt.timedelta(milliseconds=1)
    # (state, created, started, completed): what counts where, by hand.
    waits, runs = [], []
    job(engine, schema46, "created", inside)  # created in the window
    job(engine, schema46, "created", now - dt.timedelta(seconds=5))  # after its end
    job(engine, schema46, "created", start - dt.timedelta(minutes=1))  # before its start
    for wait_ms, run_ms in ((3, 2_000), (700, 45), (90_000, 15)):
        st = inside + wait_ms * ms
        job(engine, schema46, "completed", inside, st, st + run_ms * ms)
        waits.append(wait_ms / 1000)
        runs.append(run_ms / 1000)
    st = inside + 250 * ms
    job(engine, schema46, "failed", start - dt.timedelta(hours=1), st, st + 7_000 * ms)
    # started an hour before the window: it counts where it finished
    waits.append((st - (start - dt.timedelta(hours=1))).total_seconds())
    runs.append(7.0)
    job(engine, schema46, "completed", inside, None, inside + ms)  # never started: no bins
    job(engine, schema46, "cancelled", inside, inside, inside + ms)  # neither
    job(engine, schema46, "completed", inside, inside, end + ms)  # finished after the end

    report = supervisor(engine, schema46, clock, persist_queue_stats=True).run_once(force=True)
    assert "q" in report.monitored and not report.errors
    assert report.recorded == ("q",)

    (row,) = history(engine, schema46, "q")
    assert row.created_delta == 1 + 3 + 1 + 1 + 1  # the jobs created in [start, end)
    assert row.completed_delta == 4  # three timed, one never started
    assert row.failed_delta == 1
    assert row.delta_on == end
    assert row.delta_seconds == round((end - start).total_seconds())
    assert row.wait_bins == bins(waits)
    assert row.run_bins == bins(runs)
    oldest = now - (start - dt.timedelta(minutes=1))
    assert row.ready_oldest_seconds == round(oldest.total_seconds())
    assert row.captured_on == now
    assert (row.queued_count, row.ready_count) == (3, 3)  # gauges copied with the counters
    assert uuid.UUID(str(row.id)).version == 4  # written by our own setting
    queue = sql(engine, schema46, "SELECT * FROM {s}.queue WHERE name = 'q'")[0]
    assert (queue.delta_on, queue.created_delta, queue.wait_bins) == (end, 7, bins(waits))


def test_windows_tile_the_first_one_starts_afresh_and_an_idle_pass_records_zero(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    clock = FakeClock(db_now(engine))
    boss = supervisor(engine, schema46, clock, persist_queue_stats=True)
    boss.run_once(force=True)
    clock.advance(60)
    boss.run_once(force=True)
    first, second = history(engine, schema46, "q")
    # never counted: the window starts afresh (NULL seconds, nothing counted)
    assert (first.delta_seconds, first.created_delta) == (None, 0)
    assert first.wait_bins == [None] * 48
    assert second.delta_seconds == 60 and second.created_delta == 0
    assert second.delta_on - first.delta_on == dt.timedelta(seconds=60)
    assert second.ready_oldest_seconds == 0


def test_a_late_commit_is_trued_up_into_the_window_it_belongs_to(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    t = db_now(engine)
    clock = FakeClock(t)
    boss = supervisor(engine, schema46, clock, persist_queue_stats=True)
    boss.run_once(force=True)  # anchors: window [.., t-10)
    clock.advance(60)
    boss.run_once(force=True)  # window [t-10, t+50)
    # A job stamped inside the second window, committed after it was counted.
    job(engine, schema46, "created", t + dt.timedelta(seconds=20))
    clock.advance(60)
    boss.run_once(force=True)  # window [t+50, t+110): not in it, so the check fires
    rows = history(engine, schema46, "q")
    assert [r.created_delta for r in rows] == [0, 1, 0]


def test_todays_and_tomorrows_partitions_are_made_and_old_days_dropped(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    ahead = db_now(engine) + dt.timedelta(days=3)
    clock = FakeClock(ahead)
    boss = supervisor(engine, schema46, clock, persist_queue_stats=True)
    boss.run_once(force=True)

    def partitions() -> list[str]:
        rows = sql(
            engine,
            schema46,
            """SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
            WHERE i.inhparent = CAST(:t AS regclass) ORDER BY 1""",
            t=f'"{schema46}".queue_stats',
        )
        return [r.relname for r in rows]

    day = ahead.astimezone(dt.UTC).date()
    made = {f"queue_stats_{d:%Y%m%d}" for d in (day, day + dt.timedelta(days=1))}
    assert made <= set(partitions())
    (row,) = history(engine, schema46, "q")
    assert row.captured_on == ahead  # a row three days ahead has a partition to go to

    clock.advance(dt.timedelta(days=9))  # day + 9: keep day + 2 and later
    report = boss.run_once(force=True)
    assert not report.errors
    left = partitions()
    cutoff = f"queue_stats_{day + dt.timedelta(days=2):%Y%m%d}"
    assert left and all(name >= cutoff for name in left)
    assert f"queue_stats_{day + dt.timedelta(days=9):%Y%m%d}" in left
    assert [r.captured_on for r in history(engine, schema46, "q")] == [clock.now()]


def test_retention_deletes_in_batches_when_queue_stats_is_one_plain_table(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    # As pg-boss installs it with noTablePartitioning: one plain table.
    sql(engine, schema46, "DROP TABLE {s}.queue_stats")
    sql(
        engine,
        schema46,
        """CREATE TABLE {s}.queue_stats (id uuid NOT NULL DEFAULT gen_random_uuid() PRIMARY KEY,
        name text NOT NULL, deferred_count int NOT NULL DEFAULT 0,
        queued_count int NOT NULL DEFAULT 0, ready_count int NOT NULL DEFAULT 0,
        active_count int NOT NULL DEFAULT 0, failed_count int NOT NULL DEFAULT 0,
        total_count int NOT NULL DEFAULT 0, created_delta int, completed_delta int,
        failed_delta int, delta_seconds int, delta_on timestamptz, wait_bins int[],
        run_bins int[], ready_oldest_seconds int,
        captured_on timestamptz NOT NULL DEFAULT now())""",
    )
    now = db_now(engine)
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.queue_stats (name, captured_on)
        SELECT 'q', :t - interval '8 days' - g * interval '1 minute' FROM generate_series(1, 5) g
        UNION ALL SELECT 'q', :t - interval '6 days'""",
        t=now,
    )
    boss = supervisor(
        engine, schema46, FakeClock(now), persist_queue_stats=True, delete_batch_size=2
    )
    report = boss.run_once(force=True)
    assert not report.errors
    kept = [r.captured_on for r in history(engine, schema46, "q")]
    assert kept == [now - dt.timedelta(days=6), now]


def test_without_the_setting_and_nobody_persisting_no_history_is_written(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    job(engine, schema46, "created", db_now(engine))
    report = supervisor(engine, schema46, FakeClock(db_now(engine))).run_once(force=True)
    assert history(engine, schema46, "q") == [] and report.recorded == ()
    queue = sql(engine, schema46, "SELECT * FROM {s}.queue WHERE name = 'q'")[0]
    assert queue.queued_count == 1 and queue.delta_on is None  # the window is left alone


def register(engine: Engine, schema: str, *, persist: bool, stopped: bool = False) -> None:
    sql(
        engine,
        schema,
        """INSERT INTO {s}.instance (id, host, pid, version, node_version, heartbeat_seconds,
            supervise, schedule, migrate, persist_queue_stats, persist_warnings, stopped_on)
        VALUES (gen_random_uuid(), 'node-host', 1, '12.38.0', 'v22', 60, true, true, false,
            :p, false, CASE WHEN :stopped THEN now() END)""",
        p=persist,
        stopped=stopped,
    )


def test_a_live_node_instance_that_persists_makes_our_turns_write_history(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    clock = FakeClock(db_now(engine))
    boss = supervisor(engine, schema46, clock)  # persist_queue_stats off
    register(engine, schema46, persist=False)
    register(engine, schema46, persist=True, stopped=True)
    boss.run_once(force=True)
    assert history(engine, schema46, "q") == []  # neither persists history now

    register(engine, schema46, persist=True)
    clock.advance(1)
    assert boss.run_once(force=True).recorded == ("q",)
    (row,) = history(engine, schema46, "q")
    assert uuid.UUID(str(row.id)).version == 8  # written for another instance: marked
    assert row.delta_on is not None

    # Our own marked rows are no evidence: with the instance gone, nothing more.
    sql(engine, schema46, "UPDATE {s}.instance SET stopped_on = now()")
    clock.advance(60)
    boss.run_once(force=True)
    assert len(history(engine, schema46, "q")) == 1


def test_a_recent_row_written_by_a_persisting_instance_is_evidence_too(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    now = db_now(engine)
    clock = FakeClock(now)
    # As Node writes it with registerInstance off: an ordinary (version 4) id.
    sql(
        engine,
        schema46,
        "INSERT INTO {s}.queue_stats (name, captured_on) VALUES ('q', :t)",
        t=now - dt.timedelta(seconds=90),
    )
    boss = supervisor(engine, schema46, clock, queue_stats_retention_days=1)
    boss.run_once(force=True)
    assert len(history(engine, schema46, "q")) == 2
    # Too old to say anyone persists now (three pass intervals): nothing more.
    clock.advance(181)
    boss.run_once(force=True)
    assert len(history(engine, schema46, "q")) == 2


def test_persist_queue_stats_needs_schema_46(engine: Engine, schema: str) -> None:
    boss = Supervisor(engine, schema=schema, persist_queue_stats=True)
    with pytest.raises(InvalidOptionsError, match="needs pg-boss schema 46"):
        boss.run_once()
    with pytest.raises(InvalidOptionsError, match="queue_stats_retention_days"):
        Supervisor(engine, schema=schema, queue_stats_retention_days=0)
    with pytest.raises(InvalidOptionsError, match="needs pg-boss schema 46"):
        boss.start()
    assert Supervisor(engine, schema=schema).run_once().errors == ()


def test_the_command_line_persists_history_and_refuses_it_at_26(
    engine: Engine,
    schema46: str,
    schema: str,
    database_url: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    make_queue(engine, schema46, "q")
    base = ["maintain", "--force", "--no-cron", "--database-url", database_url]
    flags = ["--persist-queue-stats", "--queue-stats-retention-days", "3"]
    assert main([*base, "--schema", schema46, *flags]) == 0
    assert len(history(engine, schema46, "q")) == 1
    capsys.readouterr()
    assert main([*base, "--schema", schema, "--persist-queue-stats"]) != 0
    err = capsys.readouterr().err
    assert "persist_queue_stats" in err and "needs pg-boss schema 46" in err


# ------------------------------------------- the rest of the pass's tail at 46


def test_warning_retention_runs_with_persisted_warnings_only(engine: Engine, schema46: str) -> None:
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.warning (type, message, created_on) VALUES
        ('queue_backlog', 'old', now() - interval '366 days'),
        ('queue_backlog', 'recent', now() - interval '364 days')""",
    )
    clock = FakeClock(db_now(engine))
    supervisor(engine, schema46, clock).run_once(force=True)
    assert len(sql(engine, schema46, "SELECT * FROM {s}.warning")) == 2
    supervisor(engine, schema46, clock, persist_warnings=True).run_once(force=True)
    left = sql(engine, schema46, "SELECT message FROM {s}.warning")
    assert [r.message for r in left] == ["recent"]


def test_the_backlog_warning_names_the_queue_and_its_threshold(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q")
    sql(engine, schema46, "INSERT INTO {s}.job (name) SELECT 'q' FROM generate_series(1, 3)")
    boss = supervisor(
        engine, schema46, FakeClock(db_now(engine)), persist_warnings=True, warning_queue_size=2
    )
    report = boss.run_once(force=True)
    assert [(w.queue, w.queued, w.threshold) for w in report.warnings] == [("q", 3, 2)]
    (row,) = sql(engine, schema46, "SELECT message, data FROM {s}.warning")
    assert 'queue "q" has 3 jobs' in row.message
    assert "over its warning threshold of 2" in row.message
    assert row.data["name"] == "q" and row.data["queuedCount"] == 3


def test_instance_upkeep_keeps_the_newest_thousand_dead_rows_and_every_live_one(
    engine: Engine, schema46: str
) -> None:
    sql(
        engine,
        schema46,
        """INSERT INTO {s}.instance (id, host, pid, version, node_version, heartbeat_seconds,
            supervise, schedule, migrate, persist_queue_stats, persist_warnings, started_on,
            heartbeat_on, stopped_on)
        SELECT gen_random_uuid(), 'h', g, '12.38.0', 'v22', 10, true, true, false, false, false,
            now() - g * interval '1 minute',
            CASE WHEN g % 2 = 0 THEN now() ELSE now() - interval '1 hour' END,
            CASE WHEN g % 2 = 0 THEN now() END
        FROM generate_series(1, 1003) g
        UNION ALL
        SELECT gen_random_uuid(), 'live', 0, '12.38.0', 'v22', 60, true, true, false, false,
            false, now() - interval '1 year', now(), NULL""",
    )
    # 1,003 dead (stopped, or quiet for more than three 10 s beats), 1 live (started first)
    supervisor(engine, schema46, FakeClock(db_now(engine))).run_once(force=True)
    pids = {r.pid for r in sql(engine, schema46, "SELECT pid FROM {s}.instance")}
    assert pids == set(range(0, 1001))  # the three oldest dead rows are gone


def test_the_monitor_backoff_engages_past_a_tenth_of_the_naptime(
    engine: Engine, schema46: str
) -> None:
    from alkstore_sa._engine_cache import execution_options
    from alkstore_sa.sql.v46.supervision import set_monitor_backoff

    with engine.begin() as conn:
        naptime = conn.execute(
            text("SELECT EXTRACT(EPOCH FROM current_setting('autovacuum_naptime')::interval)")
        ).scalar_one()
        options = execution_options(schema46)
        now = db_now(engine)
        quiet = conn.execute(
            set_monitor_backoff(),
            {"elapsed": 0.1 * float(naptime), "now": now},
            execution_options=options,
        ).first()
        row = conn.execute(
            set_monitor_backoff(),
            {"elapsed": 0.2 * float(naptime), "now": now},
            execution_options=options,
        ).one()
    assert quiet is None  # not more than a tenth: nothing deferred
    # deferred for twice the naptime (the pin was shorter), from the pass's time
    assert row.backoff_until == now + dt.timedelta(seconds=min(2 * float(naptime), 3600))
    (stored,) = sql(engine, schema46, "SELECT monitor_backoff_on FROM {s}.version")
    assert stored.monitor_backoff_on == row.backoff_until
