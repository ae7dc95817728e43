"""Schemas under a backend profile with schema flags (docs/how-to/backends.md): what
``alkstore db upgrade --backend`` builds is what Node pg-boss 12.38 builds under the same
profile; our runtime works on it beside Node, and refuses a schema built for another profile.

``cockroachdb`` and ``yugabytedb`` set ``noTablePartitioning``, so ``job`` and ``queue_stats``
are plain tables. No CockroachDB or YugabyteDB runs here: the schemas are built on stock
PostgreSQL, as pg-boss's own live install builds them there.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, literal, select
from sqlalchemy.orm import Session
from support import catalog
from support.direct import rows
from support.node import node46, node46_modules, node_url
from support.schemas import random_schema, schema_exists, throwaway
from support.worker import wait_for

from alkstore_sa import (
    InvalidOptionsError,
    Job,
    QueueService,
    SchemaProfileError,
    Worker,
    migrate,
    schema_health,
)
from alkstore_sa.cli import main
from alkstore_sa.supervision import Supervisor

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.filterwarnings("ignore:backend 'yugabytedb' is deprecated")

PROFILES = ["cockroachdb", "yugabytedb"]


@pytest.fixture
def crdb(engine: Engine) -> Iterator[str]:
    """A fresh schema built by ``migrate.upgrade`` under the ``cockroachdb`` profile."""
    name = random_schema("crdb_")
    migrate.upgrade(engine, name, backend="cockroachdb")
    yield name
    with throwaway(engine, name):
        pass


def crdb_tx(engine: Engine, schema: str, fn: Callable[[QueueService], Any]) -> Any:
    """``fn`` on a ``cockroachdb``-profile service over a session of its own, committed."""
    with Session(engine) as session, session.begin():
        return fn(QueueService(session, schema=schema, backend="cockroachdb"))


def _relkind(engine: Engine, schema: str, table: str) -> str:
    found = rows(
        engine, schema, f"SELECT relkind::text FROM pg_class WHERE oid = '{{s}}.{table}'::regclass"
    )
    return str(found[0][0])


# ------------------------------------------------------------------ the build


@pytest.mark.interop
@pytest.mark.parametrize(
    "profile", [pytest.param("cockroachdb", marks=pytest.mark.smoke), "yugabytedb"]
)
def test_a_fresh_install_under_a_profile_is_node_pg_boss_s_but_for_column_order(
    engine: Engine, node46: Any, profile: str
) -> None:
    theirs, ours = random_schema("gp_"), random_schema("gp_")
    with throwaway(engine, theirs, ours):
        node46(theirs, backend=profile).call("getQueues")
        migrate.upgrade(engine, ours, backend=profile)
        found = catalog.structural(catalog.snapshot(engine, ours), column_order=False)
        catalog.assert_same(
            catalog.structural(catalog.snapshot(engine, theirs), column_order=False),
            found,
            (f"pg-boss 12.38.0 under {profile}", f"alkstore under {profile}"),
        )
        # Guards the comparison: both are the plain schema, with the profile's flags.
        assert _relkind(engine, ours, "job") == "r" and _relkind(engine, ours, "queue_stats") == "r"
        assert not any(line.startswith("job_common ") for line in found["relations"])
        fkeys = [line for line in found["constraints"] if " q_fkey " in line]
        assert len(fkeys) == 1 and ("DEFERRABLE" in fkeys[0]) == (profile == "yugabytedb")
        i10 = [line for line in found["indexes"] if line.startswith("job_i10:")]
        assert len(i10) == 1 and ("INCLUDE" in i10[0]) == (profile == "yugabytedb")
        assert migrate.current(engine, ours) == "alkstore_0046"


@pytest.mark.parametrize("profile", PROFILES)
def test_db_check_finds_nothing_amiss_in_a_profile_s_schema(engine: Engine, profile: str) -> None:
    name = random_schema()
    with throwaway(engine, name):
        migrate.upgrade(engine, name, backend=profile)
        with engine.connect() as conn:
            found = schema_health.diagnose(conn, name)
        assert found.findings == () and found.profile == profile
        # An index dropped by hand is found, as on a partitioned schema.
        rows(engine, name, "DROP INDEX {s}.job_i13")
        with engine.connect() as conn:
            found = schema_health.diagnose(conn, name)
        assert [f.name for f in found.findings] == ["job_i13"]


def test_the_cli_builds_a_profile_s_schema_and_refuses_another_profile_on_it(
    database_url: str, engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    name = random_schema()
    args = ["db", "upgrade", "--database-url", database_url, "--schema", name, "--json"]
    with throwaway(engine, name):
        assert main([*args, "--backend", "cockroachdb"]) == 0
        assert '"status": "upgraded"' in capsys.readouterr().out
        assert _relkind(engine, name, "job") == "r"
        assert main([*args, "--backend", "cockroachdb"]) == 0
        assert '"status": "unchanged"' in capsys.readouterr().out
        check = ["db", "check", "--database-url", database_url, "--schema", name]
        assert main(check) == 0
        assert "profile  cockroachdb" in capsys.readouterr().out.splitlines()
        # Without the profile, the upgrade would take it for PostgreSQL's schema.
        assert main(args) != 0
        err = capsys.readouterr().err
        assert "plain table" in err and "'postgres'" in err


def test_a_profile_builds_46_only_and_a_partitioned_schema_is_refused_under_it(
    engine: Engine, schema46: str
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        with pytest.raises(InvalidOptionsError, match="46 only"):
            migrate.upgrade(engine, name, schema_version=26, backend="cockroachdb")
        assert not schema_exists(engine, name)
    with pytest.raises(SchemaProfileError, match="partitioned") as refused:
        migrate.upgrade(engine, schema46, backend="cockroachdb")
    assert refused.value.backend == "cockroachdb"
    assert _relkind(engine, schema46, "job") == "p"  # untouched


def test_rebuilding_as_plain_tables_refuses_a_schema_that_holds_queues(
    engine: Engine, schema46: str
) -> None:
    from alkstore_sa.backends import resolve
    from alkstore_sa.migrations import profiles

    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
    with engine.connect() as conn, pytest.raises(SchemaProfileError, match="holds queues"):
        profiles.apply(conn, schema46, resolve("cockroachdb").flags)
    assert _relkind(engine, schema46, "job") == "p"  # untouched


def test_a_profile_s_schema_is_removed_whole_but_not_taken_back_a_version(
    engine: Engine, crdb: str
) -> None:
    with pytest.raises(InvalidOptionsError, match="only be removed"):
        migrate.downgrade(engine, crdb, schema_version=45)
    assert migrate.current(engine, crdb) == "alkstore_0046"
    migrate.downgrade(engine, crdb)
    assert not schema_exists(engine, crdb)


# ------------------------------------------------------------------ the runtime


def test_our_runtime_refuses_a_profile_s_schema_under_another_profile(
    engine: Engine, crdb: str, schema46: str
) -> None:
    with Session(engine) as session, session.begin():
        with pytest.raises(SchemaProfileError, match="plain table"):
            QueueService(session, schema=crdb).send("q", {})
        with pytest.raises(SchemaProfileError, match="partitioned"):
            QueueService(session, schema=schema46, backend="cockroachdb").send("q", {})
        assert session.execute(select(literal(1))).scalar_one() == 1  # still usable


def test_a_partitioned_queue_is_refused_under_the_profile_before_any_sql(
    engine: Engine, crdb: str
) -> None:
    with Session(engine) as session, session.begin():
        service = QueueService(session, schema=crdb, backend="cockroachdb")
        with pytest.raises(InvalidOptionsError, match="noTablePartitioning"):
            service.create_queue("own", partition=True)
        assert service.get_queues() == []


def test_queues_jobs_and_supervision_work_on_a_profile_s_schema(engine: Engine, crdb: str) -> None:
    def service(session: Session) -> QueueService:
        return QueueService(session, schema=crdb, backend="cockroachdb")

    with Session(engine) as session, session.begin():
        q = service(session)
        q.create_queue("dlq")
        q.create_queue("work", retry_limit=1, dead_letter="dlq", notify=False)
        info = q.get_queue("work")
        assert info is not None and info.table_name == "job"
        ok, bad = q.send("work", {"n": 1}), q.send("work", {"n": 2})
        assert ok is not None and bad is not None
    with Session(engine) as session, session.begin():
        jobs = {str(j.data["n"]): j.id for j in service(session).fetch("work", batch_size=2)}
        service(session).complete("work", jobs["1"])
        service(session).fail("work", jobs["2"], {"why": "once"})
    with Session(engine) as session, session.begin():
        again = service(session).fetch("work")
        assert [j.id for j in again] == [bad]
        service(session).fail("work", bad, {"why": "twice"})
    states = dict(
        rows(engine, crdb, "SELECT name || ':' || state::text, count(*) FROM {s}.job GROUP BY 1")
    )
    assert states == {"work:completed": 1, "work:failed": 1, "dlq:created": 1}

    # A supervisor pass with history: queue_stats is a plain table, kept by delete.
    rows(
        engine,
        crdb,
        "INSERT INTO {s}.queue_stats (name, captured_on) "
        "VALUES ('work', now() - interval '30 days')",
    )
    sup = Supervisor(
        engine,
        schema=crdb,
        backend="cockroachdb",
        persist_queue_stats=True,
        queue_stats_retention_days=7,
    )
    sup.run_once()
    history = rows(
        engine,
        crdb,
        "SELECT count(*) FILTER (WHERE captured_on < now() - interval '7 days'), count(*) "
        "FROM {s}.queue_stats",
    )
    assert history[0][0] == 0 and history[0][1] >= 2  # the old row went, each queue wrote one
    with Session(engine) as session, session.begin():
        assert service(session).delete_queue("work") is True
    assert rows(engine, crdb, "SELECT count(*) FROM {s}.job WHERE name = 'work'")[0][0] == 0


# ------------------------------------------------------------------ beside Node


@pytest.mark.interop
@pytest.mark.parametrize("built_by", ["python", "node"])
def test_node_and_python_under_cockroachdb_share_one_queue_both_supervising(
    engine: Engine, node46: Any, built_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Both sides under the ``cockroachdb`` profile on one schema built for it (by either):
    each job runs once whichever side sent it, and each side's supervisor runs beside the
    other's with no advisory lock between them."""
    name = random_schema("crdb_")
    with throwaway(engine, name):
        if built_by == "python":
            migrate.upgrade(engine, name, backend="cockroachdb")
            boss = node46(name, backend="cockroachdb", supervise=True)
        else:
            boss = node46(name, backend="cockroachdb", supervise=True)
            boss.call("getQueues")  # its start() built the schema
        assert _relkind(engine, name, "job") == "r"
        crdb_tx(engine, name, lambda q: q.create_queue("mail"))
        runs: list[str] = []
        lock = threading.Lock()

        def handle(job: Job) -> None:
            with lock:
                runs.append(str(job.id))
            time.sleep(0.02)

        worker = Worker(
            engine,
            schema=name,
            backend="cockroachdb",
            poll_interval=0.2,
            supervise=True,
            supervisor_options={"supervise_interval": 1, "monitor_interval": 1},
            concurrency=2,
        )
        worker.register("mail", handle, batch_size=2)
        worker.start()
        boss.call("work", "mail", {"pollingIntervalSeconds": 0.5, "batchSize": 3}, {"sleepMs": 20})
        try:
            sent = crdb_tx(
                engine, name, lambda q: q.send_many("mail", [{"data": {"n": n}} for n in range(20)])
            )
            ids = [str(i) for i in sent] + [
                boss.call("send", "mail", {"n": n}) for n in range(20, 40)
            ]
            done = "SELECT count(*) FROM {s}.job WHERE state = 'completed'"
            assert wait_for(lambda: rows(engine, name, done)[0][0] == 40, timeout=30)
        finally:
            worker.stop(5)
        counts = Counter(runs + [e["id"] for e in boss.events_of("job")])
        assert sorted(counts) == sorted(ids) and set(counts.values()) == {1}
        assert runs and boss.events_of("job")
        boss.close()
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == []  # our supervisor's passes included


@pytest.mark.interop
def test_a_schema_node_built_under_cockroachdb_is_adopted_by_db_upgrade(
    engine: Engine, node46: Any
) -> None:
    name = random_schema("crdb_")
    with throwaway(engine, name):
        node46(name, backend="cockroachdb").call("getQueues")
        assert migrate.current(engine, name) is None  # nothing of ours recorded yet
        result = migrate.upgrade(engine, name, backend="cockroachdb")
        assert result.found == 46 and result.revision == "alkstore_0046"
        assert any("adopted schema 46" in line for line in result.healed)
        with engine.connect() as conn:
            assert schema_health.diagnose(conn, name).findings == ()
