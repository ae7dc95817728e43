"""The schema-46 turns on ``version`` we take as Node does: rrule cron, flows, BAM, reindex."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import Engine, text

from alkstore_sa import limits, rrule
from alkstore_sa.backends import Backend
from alkstore_sa.clock import FakeClock
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.ops.occurrences import occurrence_key
from alkstore_sa.supervision import Supervisor

ONLY_CRON: dict[str, Any] = {"supervise": False, "bam": False}


ONLY_BAM: dict[str, Any] = {"supervise": False, "schedule": False}


def sql(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def autocommit(engine: Engine, schema: str, statement: str) -> None:
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text(statement.replace("{s}", f'"{schema}"')))


def make_queue(engine: Engine, schema: str, name: str, partition: bool = False) -> None:
    options = '{"policy": "standard", "partition": %s}' % ("true" if partition else "false")
    sql(engine, schema, "SELECT {s}.create_queue(:n, CAST(:o AS jsonb))", n=name, o=options)


def schedule(engine: Engine, schema: str, key: str, kind: str, expr: str, **extra: Any) -> None:
    options = extra.get("options", "{}")
    sql(
        engine,
        schema,
        """INSERT INTO {s}.schedule (name, key, kind, cron, timezone, data, options, created_on)
        VALUES ('q_r', :key, :kind, :expr, 'UTC', '{"k": 1}', CAST(:options AS jsonb),
                COALESCE(CAST(:created AS timestamptz), now()))""",
        key=key,
        kind=kind,
        expr=expr,
        options=options,
        created=extra.get("created"),
    )


def filed(engine: Engine, schema: str, key: str) -> list[dt.datetime]:
    rows = sql(
        engine,
        schema,
        "SELECT singleton_on FROM {s}.job WHERE name = :n AND singleton_key = :k ORDER BY 1",
        n=SEND_IT_QUEUE,
        k=occurrence_key("q_r", key),
    )
    return [r.singleton_on for r in rows]


def at(text_: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text_).replace(tzinfo=dt.UTC)


# --------------------------------------------------------------- rrule


def test_rrule_reading_matches_rfc_5545(monkeypatch: pytest.MonkeyPatch) -> None:
    # Rules are bounded by steps here, the same on every machine: the CPU-time backstop
    # (2 s) refused the dense rule below (95,000 steps) under coverage on a slow CPU.
    monkeypatch.setattr(limits, "MAX_RRULE_SECONDS", 600.0)
    rule = rrule.parse("DTSTART;TZID=Europe/Paris:20260101T090000\nRRULE:FREQ=DAILY", "UTC")
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 in summer.
    assert rule.between(at("2026-01-05 00:00"), at("2026-01-06 00:00")) == [at("2026-01-05 08:00")]
    assert rule.between(at("2026-07-05 00:00"), at("2026-07-06 00:00")) == [at("2026-07-05 07:00")]
    # No DTSTART: midnight 1970 in the schedule's zone anchors INTERVAL's phase.
    every_other = rrule.parse("FREQ=DAILY;INTERVAL=2;BYHOUR=9", "UTC")
    days = [o.day for o in every_other.between(at("2026-12-01 00:00"), at("2026-12-08 00:00"))]
    assert days in ([1, 3, 5, 7], [2, 4, 6])
    assert len({d % 2 for d in days}) == 1
    # The latest occurrence in a long gap of a dense rule, found without walking the gap.
    rule = rrule.parse("FREQ=SECONDLY;UNTIL=20261001T000000Z", "UTC")
    assert rule.latest(at("2026-07-01 00:00"), at("2026-12-01 00:00")) == at("2026-10-01 00:00")
    exdated = rrule.parse(
        "DTSTART:20261201T090000Z\nRRULE:FREQ=DAILY\nEXDATE:20261202T090000Z", "UTC"
    )
    assert [o.day for o in exdated.between(at("2026-12-01 00:00"), at("2026-12-04 00:00"))] == [
        1,
        3,
    ]


@pytest.mark.parametrize(
    "rule",
    [
        # Some 50,000 occurrences walked per zone: the other rules cover the same paths.
        pytest.param("FREQ=MINUTELY;INTERVAL=7", marks=pytest.mark.slow),
        "FREQ=HOURLY;INTERVAL=5;BYMINUTE=15,45",
        "FREQ=DAILY;INTERVAL=3;BYHOUR=9,21",
        "FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,TH;BYHOUR=8",
        "FREQ=MINUTELY;INTERVAL=13;BYHOUR=10;BYDAY=TU",
    ],
)
@pytest.mark.parametrize("tz", ["UTC", "Europe/Paris", "America/New_York"])
def test_rrule_reads_a_window_as_a_walk_from_dtstart_would(
    rule: str, tz: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A window is read from a later start of the same phase, not from DTSTART: the same
    # occurrences as one walk from DTSTART itself, across both DST changes. The walk
    # takes up to 50,000 steps: bounded by the step budget here, not by the CPU-time
    # backstop, which a slow CPU under coverage passed.
    monkeypatch.setattr(limits, "MAX_RRULE_SECONDS", 600.0)
    parsed = rrule.parse("DTSTART:20250301T013000\nRRULE:" + rule, tz)
    windows = [
        (at("2025-03-01 00:00") + dt.timedelta(days=day, minutes=day * 37), width)
        for day in range(0, 240, 9)
        for width in (dt.timedelta(seconds=60), dt.timedelta(days=3))
    ]
    shifted = [parsed.between(lower, lower + width) for lower, width in windows]
    latest = [parsed.latest(lower, lower + width) for lower, width in windows]
    with monkeypatch.context() as m:
        m.setattr(rrule, "_PERIODS", {})  # no later start: one walk from DTSTART
        walked = parsed.between(windows[0][0], windows[-1][0] + dt.timedelta(days=3))
    assert any(shifted)
    for (lower, width), found, last in zip(windows, shifted, latest, strict=True):
        expected = [o for o in walked if lower < o <= lower + width]
        assert found == expected
        assert last == (expected[-1] if expected else None)


@pytest.mark.parametrize(
    "bad",
    [
        "FREQ=DAILY;BYHOURS=9",
        "BEGIN:VEVENT\nRRULE:FREQ=DAILY",
        "FREQ=DAILY;COUNT=3",
        "FREQ=SOMETIMES",
    ],
)
def test_rrule_refuses_what_it_cannot_read(bad: str) -> None:
    with pytest.raises(InvalidOptionsError, match="rrule"):
        rrule.parse(bad, "UTC")
    assert rrule.is_rrule(bad) or bad.startswith("BEGIN")
    assert not rrule.is_rrule("*/5 * * * *")


def test_rrule_schedules_fire_into_send_it_under_the_slot_and_key(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "q_r")
    schedule(engine, schema46, "minutely", "rrule", "FREQ=MINUTELY;INTERVAL=1")
    schedule(engine, schema46, "nine", "rrule", "DTSTART:20260101T090000Z\nRRULE:FREQ=DAILY")
    schedule(engine, schema46, "halves", "rrule", "RRULE:FREQ=SECONDLY;INTERVAL=30")
    clock = FakeClock(at("2026-12-01 09:00:15"))
    report = Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert report.cron_checked and report.errors == ()
    assert filed(engine, schema46, "minutely") == [dt.datetime(2026, 12, 1, 9, 0)]
    assert filed(engine, schema46, "nine") == [dt.datetime(2026, 12, 1, 9, 0)]
    # Two occurrences in the window (08:59:30 and 09:00:00), each in a slot of its own.
    halves = [dt.datetime(2026, 12, 1, 8, 59), dt.datetime(2026, 12, 1, 9, 0)]
    assert filed(engine, schema46, "halves") == halves
    # A pass later in the same minute files nothing twice; the daily rule is not due again.
    clock.advance(30)
    Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert filed(engine, schema46, "nine") == [dt.datetime(2026, 12, 1, 9, 0)]
    assert filed(engine, schema46, "halves") == halves


def test_missed_once_catches_up_the_latest_rrule_occurrence(engine: Engine, schema46: str) -> None:
    make_queue(engine, schema46, "q_r")
    options = '{"missed": "once"}'
    hourly = "FREQ=HOURLY;BYMINUTE=30"
    schedule(engine, schema46, "once", "rrule", hourly, options=options, created="2026-11-30")
    schedule(engine, schema46, "skip", "rrule", hourly, created="2026-11-30")
    sql(engine, schema46, "UPDATE {s}.version SET cron_on = '2026-12-01 05:00:00+00'")
    clock = FakeClock(at("2026-12-01 09:00:15"))
    Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert filed(engine, schema46, "once") == [dt.datetime(2026, 12, 1, 8, 30)]
    assert filed(engine, schema46, "skip") == []


def test_a_rule_stored_as_cron_still_fires_and_is_relabelled(engine: Engine, schema46: str) -> None:
    make_queue(engine, schema46, "q_r")
    schedule(engine, schema46, "mislabelled", "cron", "FREQ=MINUTELY")
    schedule(engine, schema46, "broken", "rrule", "FREQ=MINUTELY;BYHOURS=9")
    clock = FakeClock(at("2026-12-01 09:00:15"))
    report = Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert filed(engine, schema46, "mislabelled") == [dt.datetime(2026, 12, 1, 9, 0)]
    kinds = dict(sql(engine, schema46, "SELECT key, kind FROM {s}.schedule"))
    assert kinds == {"mislabelled": "rrule", "broken": "rrule"}
    assert filed(engine, schema46, "broken") == []
    assert any("broken" in e and "BYHOURS" in e for e in report.errors)


def test_schedules_are_evaluated_without_holding_the_version_row(
    engine: Engine, schema46: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every turn (cron, flows, BAM; Node's too) is claimed on the one ``version``
    row: a rule that takes its whole evaluation budget must not hold it."""
    make_queue(engine, schema46, "q_r")
    schedule(engine, schema46, "minutely", "rrule", "FREQ=MINUTELY;INTERVAL=1")
    seen: list[str] = []
    parse = rrule.parse

    def watched(expr: str, tz: str) -> Any:
        # Mid-evaluation: can another session take the version row right now?
        with engine.connect() as other:
            other.execute(text("SET LOCAL lock_timeout = '200ms'"))
            try:
                other.execute(text(f'SELECT 1 FROM "{schema46}".version FOR UPDATE'))
                seen.append("free")
            except Exception as exc:
                seen.append(type(getattr(exc, "orig", exc)).__name__)
            other.rollback()
        return parse(expr, tz)

    monkeypatch.setattr(rrule, "parse", watched)
    clock = FakeClock(at("2026-12-01 09:00:15"))
    report = Supervisor(engine, schema=schema46, clock=clock, **ONLY_CRON).run_once(force=True)
    assert seen == ["free"]  # before, "LockNotAvailable": the claim came first
    assert report.cron_checked and filed(engine, schema46, "minutely") == [
        dt.datetime(2026, 12, 1, 9, 0)
    ]


def test_a_turn_not_due_evaluates_nothing(
    engine: Engine, schema46: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_queue(engine, schema46, "q_r")
    schedule(engine, schema46, "minutely", "rrule", "FREQ=MINUTELY;INTERVAL=1")
    sql(engine, schema46, "UPDATE {s}.version SET cron_on = now()")
    calls: list[str] = []
    parse = rrule.parse

    def counted(expr: str, tz: str) -> Any:
        calls.append(expr)
        return parse(expr, tz)

    monkeypatch.setattr(rrule, "parse", counted)
    report = Supervisor(engine, schema=schema46, **ONLY_CRON).run_once()
    assert not report.cron_checked and calls == []


# --------------------------------------------------------------- flows


def add_job(engine: Engine, schema: str, queue: str, **columns: Any) -> uuid.UUID:
    names = ", ".join(["name", *columns])
    values = ", ".join([":name", *(f":{c}" for c in columns)])
    rows = sql(
        engine, schema, f"INSERT INTO {{s}}.job ({names}) VALUES ({values}) RETURNING id",
        name=queue, **columns,
    )  # fmt: skip
    return rows[0].id  # type: ignore[no-any-return]


def depends(engine: Engine, schema: str, child: uuid.UUID, *parents: uuid.UUID) -> None:
    for parent in parents:
        sql(
            engine, schema,
            "INSERT INTO {s}.job_dependency (child_name, child_id, parent_name, parent_id) "
            "VALUES ('kids', :c, 'parents', :p)",
            c=child, p=parent,
        )  # fmt: skip


def test_flow_turn_releases_children_of_completed_parents(engine: Engine, schema46: str) -> None:
    make_queue(engine, schema46, "parents")
    make_queue(engine, schema46, "kids")
    now = sql(engine, schema46, "SELECT now()")[0][0]
    done = dict(state="completed", blocking=True, completed_on=now)
    p1 = add_job(engine, schema46, "parents", **done)
    p2 = add_job(engine, schema46, "parents", **done)
    p3 = add_job(engine, schema46, "parents", state="active", blocking=True)
    past, future = now - dt.timedelta(hours=1), now + dt.timedelta(hours=1)
    free = add_job(engine, schema46, "kids", blocked=True, pending_dependencies=2, start_after=past)
    later = add_job(
        engine, schema46, "kids", blocked=True, pending_dependencies=1, start_after=future
    )
    waiting = add_job(
        engine, schema46, "kids", blocked=True, pending_dependencies=2, start_after=past
    )
    depends(engine, schema46, free, p1, p2)
    depends(engine, schema46, later, p1)
    depends(engine, schema46, waiting, p2, p3)
    report = Supervisor(engine, schema=schema46, schedule=False, bam=False).run_once(force=True)
    assert (report.flows_resolved, report.released) == (2, 2)
    columns = "id, blocked, blocking, pending_dependencies, start_after"
    rows = {r.id: r for r in sql(engine, schema46, f"SELECT {columns} FROM {{s}}.job")}
    assert not rows[free].blocked and rows[free].pending_dependencies == 0
    assert rows[free].start_after >= now  # moved up to the release
    assert not rows[later].blocked and rows[later].start_after == future  # never back
    assert rows[waiting].blocked and rows[waiting].pending_dependencies == 1
    assert rows[waiting].start_after == past
    assert not rows[p1].blocking and not rows[p2].blocking and rows[p3].blocking
    assert sql(engine, schema46, "SELECT flow_on FROM {s}.version")[0][0] is not None
    # The turn is the cluster's: a second pass within the interval does nothing.
    report = Supervisor(engine, schema=schema46, schedule=False, bam=False).run_once()
    assert report.flows_resolved == 0


def test_flows_can_be_switched_off(engine: Engine, schema46: str) -> None:
    Supervisor(engine, schema=schema46, schedule=False, flows=False).run_once(force=True)
    assert sql(engine, schema46, "SELECT flow_on FROM {s}.version")[0][0] is None
    with pytest.raises(InvalidOptionsError, match="bam_interval"):
        Supervisor(engine, schema=schema46, bam_interval=5)


# --------------------------------------------------------------- BAM


def add_bam(engine: Engine, schema: str, name: str, command: str, **columns: Any) -> uuid.UUID:
    status = columns.get("status", "pending")
    rows = sql(
        engine, schema,
        "INSERT INTO {s}.bam (name, version, status, table_name, command, started_on) "
        "VALUES (:name, :version, :status, 'job_common', :command, CAST(:started AS timestamptz)) "
        "RETURNING id",
        name=name, status=status, version=columns.get("version", 46),
        command=command.replace("{s}", f'"{schema}"'), started=columns.get("started_on"),
    )  # fmt: skip
    return rows[0].id  # type: ignore[no-any-return]


def bam_rows(engine: Engine, schema: str) -> dict[str, Any]:
    rows = sql(engine, schema, "SELECT name, status, error FROM {s}.bam WHERE version >= 45")
    return {r.name: r for r in rows}


def index_valid(engine: Engine, schema: str, index: str) -> bool | None:
    rows = sql(
        engine, schema,
        "SELECT x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "JOIN pg_namespace n ON n.oid = i.relnamespace WHERE n.nspname = :s AND i.relname = :i",
        s=schema, i=index,
    )  # fmt: skip
    return rows[0][0] if rows else None


# Index builds pg-boss's migrations queue (the only commands BAM runs), on
# job_common; each test drops the index first, as a database Node is migrating
# would not have it yet.
BUILDS = {
    "i15": "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i15 ON {s}.job_common "
    "(name, created_on)",
    "i16": "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i16 ON {s}.job_common "
    "(name, completed_on) WHERE completed_on IS NOT NULL",
    "i12": "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i12 ON {s}.job_common "
    "(source_root_id) WHERE source_root_id IS NOT NULL",
    "i17": "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i17 ON {s}.job_common "
    "(name, singleton_key, created_on) WHERE state < 'active' AND singleton_key IS NOT NULL",
}  # fmt: skip
BUILDS_I15 = BUILDS["i15"]
UNIQUE = (
    "CREATE UNIQUE INDEX CONCURRENTLY IF NOT EXISTS job_common_i13 ON {s}.job_common "
    "(name, singleton_key) WHERE state = 'created' AND upsert_by_key"
)


def unbuilt(engine: Engine, schema: str, *suffixes: str) -> None:
    for suffix in suffixes:
        autocommit(engine, schema, f"DROP INDEX {{s}}.job_common_{suffix}")


def two_upserted_jobs_with_one_key(engine: Engine, schema: str) -> None:
    """What i13 exists to prevent: its unique build fails while both are queued."""
    make_queue(engine, schema, "dup")
    for _ in range(2):
        sql(
            engine, schema,
            "INSERT INTO {s}.job (name, singleton_key, upsert_by_key) VALUES ('dup', 'k', true)",
        )  # fmt: skip


def test_bam_runs_pending_rows_in_order_and_claims_bam_on(engine: Engine, schema46: str) -> None:
    unbuilt(engine, schema46, "i15", "i16")
    add_bam(engine, schema46, "first", BUILDS["i15"])
    add_bam(engine, schema46, "second", BUILDS["i16"])
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    rows = bam_rows(engine, schema46)
    assert rows["first"].status == rows["second"].status == "completed"
    assert report.bam == ("first (job_common): completed", "second (job_common): completed")
    assert index_valid(engine, schema46, "job_common_i15") is True
    assert index_valid(engine, schema46, "job_common_i16") is True
    assert sql(engine, schema46, "SELECT bam_on FROM {s}.version")[0][0] is not None


def test_bam_drops_an_invalid_leftover_and_builds_again(engine: Engine, schema46: str) -> None:
    unbuilt(engine, schema46, "i13")
    two_upserted_jobs_with_one_key(engine, schema46)
    with pytest.raises(Exception, match="could not create unique index"):
        autocommit(engine, schema46, UNIQUE)
    assert index_valid(engine, schema46, "job_common_i13") is False
    add_bam(engine, schema46, "unique", UNIQUE, status="failed")
    sql(
        engine, schema46, "DELETE FROM {s}.job WHERE id = (SELECT min(id::text)::uuid FROM {s}.job)"
    )
    Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    assert bam_rows(engine, schema46)["unique"].status == "completed"
    assert index_valid(engine, schema46, "job_common_i13") is True


def test_bam_fails_a_build_that_leaves_an_invalid_index(engine: Engine, schema46: str) -> None:
    unbuilt(engine, schema46, "i13")
    two_upserted_jobs_with_one_key(engine, schema46)
    add_bam(engine, schema46, "unique", UNIQUE)
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    row = bam_rows(engine, schema46)["unique"]
    assert row.status == "failed" and "could not create unique index" in row.error
    assert report.bam == ("unique (job_common): failed",)


@pytest.mark.parametrize(
    "command",
    [
        "DROP TABLE {s}.job_common",
        "SELECT nextval('{s}.bam_probe')",
        BUILDS_I15 + "; DROP TABLE {s}.queue",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i15 ON {s}.job_common "
        "((nextval('{s}.bam_probe')::text))",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS evil ON {s}.job_common (name, created_on)",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i15 ON public.job_common "
        "(name, created_on)",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i15 ON {s}.queue (name, created_on)",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i15 ON {s}.job_common (name)"
        " WHERE name = 'x'",
        "CREATE INDEX CONCURRENTLY IF NOT EXISTS job_common_i15 /* x */ ON {s}.job_common "
        "(name, created_on)",
        "DROP INDEX CONCURRENTLY IF EXISTS {s}.job_common_pkey",
    ],
    ids=[
        "drop-table", "select", "second-statement", "expression", "foreign-name",
        "other-schema", "other-table", "other-definition", "comment", "drop-other-index",
    ],
)  # fmt: skip
def test_bam_runs_only_the_index_builds_pg_boss_queues(
    engine: Engine, schema46: str, command: str
) -> None:
    """Whoever can insert into ``bam`` must not get SQL run as the supervisor:
    anything but a known pg-boss index build is failed, reported, never run."""
    unbuilt(engine, schema46, "i15")
    # A probe the refused commands would call if they ran: its use is seen, not timed.
    sql(engine, schema46, "CREATE SEQUENCE {s}.bam_probe")
    make_queue(engine, schema46, "probe")  # a row, so an index expression would be evaluated
    sql(engine, schema46, "INSERT INTO {s}.job (name) VALUES ('probe')")
    add_bam(engine, schema46, "evil", command)
    add_bam(engine, schema46, "real", BUILDS["i15"], version=47)  # after it, still runs
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    rows = bam_rows(engine, schema46)
    assert rows["evil"].status == "failed" and rows["evil"].error.startswith("not run: ")
    assert "evil (job_common): refused" in report.bam
    assert any("evil" in e and "not run" in e for e in report.errors)
    assert sql(engine, schema46, "SELECT is_called FROM {s}.bam_probe")[0][0] is False
    assert sql(engine, schema46, "SELECT count(*) FROM {s}.queue")[0][0] >= 0  # still there
    assert index_valid(engine, schema46, "job_common_i15") is True
    assert rows["real"].status == "completed"
    assert index_valid(engine, schema46, "evil") is None


def test_bam_drops_the_index_pg_boss_retired(engine: Engine, schema46: str) -> None:
    autocommit(
        engine, schema46,
        "CREATE INDEX job_common_i5 ON {s}.job_common (name, start_after)"
        " WHERE state < 'active' AND NOT blocked",
    )  # fmt: skip
    add_bam(engine, schema46, "retire", "DROP INDEX CONCURRENTLY IF EXISTS {s}.job_common_i5")
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    assert report.bam == ("retire (job_common): completed",)
    assert index_valid(engine, schema46, "job_common_i5") is None


def test_bam_runs_one_command_at_a_time_cluster_wide(engine: Engine, schema46: str) -> None:
    # A row another instance is building (claimed a minute ago, another version) holds
    # the whole queue.
    minute_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(minutes=1)).isoformat()
    running = {"status": "in_progress", "started_on": minute_ago, "version": 45}
    unbuilt(engine, schema46, "i12", "i17")
    add_bam(engine, schema46, "running", BUILDS["i12"], **running)
    add_bam(engine, schema46, "waiting", BUILDS["i17"])
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    assert report.bam == ()
    assert bam_rows(engine, schema46)["waiting"].status == "pending"
    # Past five minutes with no build holding its table, the row is stale: pending rows
    # go first, and a burst after its first claim takes pending rows only.
    an_hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    sql(
        engine, schema46, "UPDATE {s}.bam SET started_on = :t WHERE name = 'running'", t=an_hour_ago
    )
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    assert report.bam == ("waiting (job_common): completed",)
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    assert report.bam == ("running (job_common): completed",)


NO_PROGRESS_VIEW = Backend("postgres", frozenset({"noIndexProgressView"}))
"""pg-boss's ``__test__noIndexProgressView``: no build's liveness to read."""


def test_bam_without_a_progress_view_reclaims_a_row_only_after_a_day(
    engine: Engine, schema46: str
) -> None:
    # An hour old with no build on its table is stale where liveness can be read
    # (the test above); without it, only age counts, and a day is pg-boss's bound.
    an_hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    unbuilt(engine, schema46, "i12", "i17")
    add_bam(engine, schema46, "running", BUILDS["i12"], status="in_progress",
            started_on=an_hour_ago, version=45)  # fmt: skip
    add_bam(engine, schema46, "waiting", BUILDS["i17"])
    supervisor = Supervisor(engine, schema=schema46, backend=NO_PROGRESS_VIEW, **ONLY_BAM)
    assert supervisor.run_once(force=True).bam == ()
    assert bam_rows(engine, schema46)["waiting"].status == "pending"
    a_day_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=24, minutes=1)).isoformat()
    sql(engine, schema46, "UPDATE {s}.bam SET started_on = :t WHERE name = 'running'", t=a_day_ago)
    report = supervisor.run_once(force=True)
    assert report.bam == ("waiting (job_common): completed",)
    assert supervisor.run_once(force=True).bam == ("running (job_common): completed",)


def test_bam_without_a_progress_view_neither_heals_nor_fails_an_invalid_index(
    engine: Engine, schema46: str
) -> None:
    # Engines without the view roll an interrupted build back: pg-boss neither drops
    # an INVALID index there nor holds one against the build (it would fail forever).
    unbuilt(engine, schema46, "i13")
    two_upserted_jobs_with_one_key(engine, schema46)
    with pytest.raises(Exception, match="could not create unique index"):
        autocommit(engine, schema46, UNIQUE)
    add_bam(engine, schema46, "unique", UNIQUE, status="failed")
    supervisor = Supervisor(engine, schema=schema46, backend=NO_PROGRESS_VIEW, **ONLY_BAM)
    assert supervisor.run_once(force=True).bam == ("unique (job_common): completed",)
    assert index_valid(engine, schema46, "job_common_i13") is False  # not dropped, not rebuilt


def test_bam_waits_for_an_earlier_row_of_its_version_and_table(
    engine: Engine, schema46: str
) -> None:
    unbuilt(engine, schema46, "i13", "i15")
    two_upserted_jobs_with_one_key(engine, schema46)
    add_bam(engine, schema46, "broken", UNIQUE)
    add_bam(engine, schema46, "after", BUILDS["i15"])
    Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    rows = bam_rows(engine, schema46)
    assert rows["broken"].status == "failed" and "could not create" in rows["broken"].error
    assert rows["after"].status == "pending"


def test_bam_is_never_run_inside_the_callers_transaction(engine: Engine, schema46: str) -> None:
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService

    unbuilt(engine, schema46, "i15")
    add_bam(engine, schema46, "first", BUILDS["i15"])
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).supervise(force=True)
    assert sql(engine, schema46, "SELECT bam_on FROM {s}.version")[0][0] is None
    assert bam_rows(engine, schema46)["first"].status == "pending"


# --------------------------------------------------------------- reindex


def test_reindex_rebuilds_a_bloated_index_and_leaves_a_healthy_one(
    engine: Engine, schema46: str
) -> None:
    make_queue(engine, schema46, "bloat")
    make_queue(engine, schema46, "healthy", partition=True)
    fill = "INSERT INTO {s}.job (name) SELECT :n FROM generate_series(1, :count)"
    sql(engine, schema46, fill, n="bloat", count=60_000)
    sql(engine, schema46, fill, n="healthy", count=60_000)
    sql(engine, schema46, "DELETE FROM {s}.job WHERE name = 'bloat'")
    autocommit(engine, schema46, "VACUUM ANALYZE {s}.job_common")
    [(table,)] = sql(engine, schema46, "SELECT table_name FROM {s}.queue WHERE name = 'healthy'")
    autocommit(engine, schema46, f'VACUUM ANALYZE {{s}}."{table}"')
    pages = "SELECT relpages FROM pg_class WHERE oid = to_regclass(:i)"
    pkey = f'"{schema46}".job_common_pkey'
    assert sql(engine, schema46, pages, i=pkey)[0][0] > 128
    settings: dict[str, Any] = {"schedule": False, "bam": False, "flows": False}
    report = Supervisor(engine, schema=schema46, **settings).run_once(force=True)
    assert "job_common_pkey" in report.reindexed
    assert not any(name.startswith(table) for name in report.reindexed)
    size = "SELECT pg_relation_size(to_regclass(:i))"
    assert sql(engine, schema46, size, i=pkey)[0][0] < 128 * 8192
    assert sql(engine, schema46, "SELECT reindex_on FROM {s}.version")[0][0] is not None
    # reindex_on is claimed: within the interval no one rebuilds again.
    report = Supervisor(engine, schema=schema46, **settings).run_once()
    assert report.reindexed == ()


async def test_the_async_supervisor_runs_bam_builds_outside_a_transaction(
    engine: Engine, schema46: str, database_url: str
) -> None:
    from sqlalchemy.ext.asyncio import create_async_engine

    from alkstore_sa.supervision import AsyncSupervisor

    unbuilt(engine, schema46, "i16")
    add_bam(engine, schema46, "first", BUILDS["i16"])
    async_engine = create_async_engine(database_url)
    try:
        report = await AsyncSupervisor(async_engine, schema=schema46, **ONLY_BAM).run_once(
            force=True
        )
    finally:
        await async_engine.dispose()
    assert report.bam == ("first (job_common): completed",)
    assert index_valid(engine, schema46, "job_common_i16") is True


def test_a_stale_bam_row_is_not_retried_while_a_build_holds_its_table(
    engine: Engine, schema46: str
) -> None:
    an_hour_ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).isoformat()
    running = {"status": "in_progress", "started_on": an_hour_ago}
    unbuilt(engine, schema46, "i12")
    add_bam(engine, schema46, "building", BUILDS["i12"], **running)
    with engine.connect() as other:
        # What a CREATE INDEX CONCURRENTLY holds on its table from start to end.
        other.execute(text(f'LOCK TABLE "{schema46}".job_common IN SHARE UPDATE EXCLUSIVE MODE'))
        report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
        other.rollback()
    assert report.bam == ()
    assert bam_rows(engine, schema46)["building"].status == "in_progress"
    report = Supervisor(engine, schema=schema46, **ONLY_BAM).run_once(force=True)
    assert report.bam == ("building (job_common): completed",)
