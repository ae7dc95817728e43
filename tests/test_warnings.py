"""Persisted warnings at schema 46 (pg-boss 12.38's ``warning`` table): what supervision
writes with ``persist_warnings`` (and only then), its 365-day retention, ``get_warnings``
and ``alkstore warnings``; refused at 26. Also ``alkstore instances`` and ``alkstore
history``, the other read commands of docs/how-to/observability.md."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from test_cli_admin import Cli

from alkstore_sa import PersistedWarning, QueueService
from alkstore_sa.clock import FakeClock
from alkstore_sa.errors import InvalidOptionsError, SchemaFeatureError
from alkstore_sa.supervision import Supervisor


def sql(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def svc(engine: Engine, schema: str, fn: Any) -> Any:
    with Session(engine) as session, session.begin():
        return fn(QueueService(session, schema=schema))


def backlog(engine: Engine, schema: str, name: str, jobs: int) -> None:
    svc(engine, schema, lambda q: q.create_queue(name, warning_queued=1))
    svc(engine, schema, lambda q: q.send_many(name, [{"data": {"n": n}} for n in range(jobs)]))


def warn(engine: Engine, schema: str, kind: str, ago: str, message: str = "m") -> None:
    sql(
        engine,
        schema,
        "INSERT INTO {s}.warning (type, message, data, created_on) "
        "VALUES (:t, :m, '{}'::jsonb, now() - CAST(:ago AS interval))",
        t=kind,
        m=message,
        ago=ago,
    )


def test_a_backlog_warning_is_persisted_only_with_persist_warnings(
    engine: Engine, schema46: str
) -> None:
    backlog(engine, schema46, "big", 3)
    report = svc(engine, schema46, lambda q: q.supervise("big", force=True))
    assert [w.queue for w in report.warnings] == ["big"]  # reported and logged
    assert svc(engine, schema46, lambda q: q.get_warnings()) == []  # not written
    svc(engine, schema46, lambda q: q.supervise("big", force=True, persist_warnings=True))
    [row] = svc(engine, schema46, lambda q: q.get_warnings())
    assert isinstance(row, PersistedWarning) and row.type == "queue_backlog"
    assert '"big"' in row.message and "threshold of 1" in row.message
    assert row.data["name"] == "big" and row.data["queuedCount"] == 3
    assert row.data["warningQueueSize"] == 1


def test_get_warnings_filters_pages_and_checks_its_options(engine: Engine, schema46: str) -> None:
    for kind, ago in [("index_bloat", "3 hours"), ("queue_backlog", "2 hours")]:
        warn(engine, schema46, kind, ago, message=kind)
    warn(engine, schema46, "queue_backlog", "1 minute", message="newest")
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        assert [w.message for w in q.get_warnings()] == ["newest", "queue_backlog", "index_bloat"]
        assert [w.message for w in q.get_warnings("index_bloat")] == ["index_bloat"]
        assert [w.message for w in q.get_warnings(limit=1, offset=1)] == ["queue_backlog"]
        hour_ago = session.execute(text("SELECT now() - interval '1 hour'")).scalar_one()
        assert [w.message for w in q.get_warnings(since=hour_ago)] == ["newest"]
        for bad in (
            {"limit": 0},
            {"limit": 100_001},
            {"offset": -1},
            {"type": ""},
            {"type": 3},
            {"since": dt.datetime(2026, 1, 1)},
        ):
            with pytest.raises(InvalidOptionsError):
                q.get_warnings(**bad)
        assert len(q.get_warnings()) == 3  # the transaction is usable


def test_warnings_older_than_365_days_are_deleted_with_persist_warnings(
    engine: Engine, schema46: str
) -> None:
    warn(engine, schema46, "queue_backlog", "366 days", message="old")
    warn(engine, schema46, "queue_backlog", "364 days", message="kept")
    svc(engine, schema46, lambda q: q.supervise(force=True))
    assert len(svc(engine, schema46, lambda q: q.get_warnings())) == 2  # Node's rule: only with
    svc(engine, schema46, lambda q: q.supervise(force=True, persist_warnings=True))
    assert [w.message for w in svc(engine, schema46, lambda q: q.get_warnings())] == ["kept"]
    # warningRetentionDays: a shorter retention of one's own.
    warn(engine, schema46, "queue_backlog", "2 days", message="recent")
    svc(
        engine,
        schema46,
        lambda q: q.supervise(force=True, persist_warnings=True, warning_retention_days=3),
    )
    assert [w.message for w in svc(engine, schema46, lambda q: q.get_warnings())] == ["recent"]
    with pytest.raises(InvalidOptionsError, match="warning_retention_days"):
        svc(engine, schema46, lambda q: q.supervise(warning_retention_days=366))


def test_clock_skew_is_persisted_as_node_timekeeper_does(engine: Engine, schema46: str) -> None:
    with engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
    behind = FakeClock(now - dt.timedelta(minutes=5), drives_database=False)
    Supervisor(engine, schema=schema46, clock=behind, supervise=False).run_once()
    assert svc(engine, schema46, lambda q: q.get_warnings("clock_skew")) == []
    Supervisor(
        engine, schema=schema46, clock=behind, supervise=False, persist_warnings=True
    ).run_once()
    [row] = svc(engine, schema46, lambda q: q.get_warnings("clock_skew"))
    # The database is ahead: this process is the slower one.
    assert row.data["direction"] == "slower" and row.data["seconds"] == pytest.approx(300, abs=30)


def test_refused_at_26(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        with pytest.raises(SchemaFeatureError, match=r"warning table needs .* 46"):
            q.get_warnings()
        q.create_queue("still-usable")


# --------------------------------------------------------------------- the commands


@pytest.fixture
def cli46(
    capsys: pytest.CaptureFixture[str], database_url: str, schema46: str, engine: Engine
) -> Cli:
    return Cli(capsys, database_url, schema46, engine)


def test_alkstore_warnings_prints_a_table_or_json(cli46: Cli) -> None:
    warn(cli46.engine, cli46.schema, "index_bloat", "2 days", message="bloated")
    warn(cli46.engine, cli46.schema, "queue_backlog", "1 hour", message="long queue")
    ran = cli46("warnings")
    assert ran.code == 0, ran.err
    lines = ran.out.splitlines()
    assert lines[0].split() == ["CREATED_ON", "TYPE", "MESSAGE"]
    assert "queue_backlog" in lines[1] and "long queue" in lines[1] and "bloated" in lines[2]
    data = cli46.json("warnings", "--type", "index_bloat")
    assert [w["message"] for w in data] == ["bloated"] and set(data[0]) >= {"id", "data"}
    assert [w["message"] for w in cli46.json("warnings", "--since", "1d")] == ["long queue"]
    assert cli46.json("warnings", "--limit", "1", "--offset", "1")[0]["message"] == "bloated"
    bad = cli46("warnings", "--since", "yesterday")
    assert bad.code == 2 and "--since" in bad.err
    assert cli46("warnings", "--limit", "0").code == 2


def test_alkstore_warnings_at_26_says_it_needs_46(
    capsys: pytest.CaptureFixture[str], database_url: str, schema: str, engine: Engine
) -> None:
    ran = Cli(capsys, database_url, schema, engine)("warnings")
    assert ran.code == 1 and "needs a pg-boss schema at version 46" in ran.err


def test_alkstore_instances_and_history(cli46: Cli) -> None:
    cli46.service(lambda q: q.create_queue("q"))
    sql(
        cli46.engine,
        cli46.schema,
        "INSERT INTO {s}.instance (id, name, host, pid, version, node_version, "
        "heartbeat_seconds, supervise, schedule, migrate, persist_queue_stats, "
        "persist_warnings, workers) VALUES (gen_random_uuid(), 'api', 'h1', 7, '12.38.0', "
        "'v22.1.0', 30, true, true, true, false, false, "
        """'[{"queue": "q"}, {"queue": "r"}]'::jsonb)""",
    )
    ran = cli46("instances")
    assert ran.code == 0, ran.err
    header, row = ran.out.splitlines()
    assert header.split()[:3] == ["ID", "NAME", "HOST"]
    assert " api " in row and "q,r" in row and "True" in row
    [data] = cli46.json("instances", "--live")
    assert data["name"] == "api" and data["workers"] == [{"queue": "q"}, {"queue": "r"}]

    cli46.service(lambda q: q.send("q"))
    cli46.service(lambda q: q.supervise("q", force=True, persist_queue_stats=True))
    [point] = cli46.json("history", "q")
    assert point["queued_count"] == 1 and point["total_count"] == 1
    [bucket] = cli46.json("history", "q", "--bucket-seconds", "3600", "--since", "1h")
    assert bucket["queued_count"] == 1
    assert cli46("history", "nope").code == 1  # no such queue
