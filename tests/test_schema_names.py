"""Schema names pg-boss 12.38 accepts (docs/concepts/compatibility.md, "Schema names"):
quoted names taken verbatim, validated by pg-boss's rules, quoted wherever they reach SQL,
and the lock keys and notification channel Node derives from them.

The whole suite can also be run over such names (``ALKSTORE_TEST_SCHEMA_NAMES=hostile``,
docs/development.md); the tests here keep the main paths over one in every run.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.direct import rows
from support.node import node46, node46_modules, node_url, run_node46
from support.schemas import drop_schema, schema_exists

from alkstore_sa import InvalidNameError, Job, QueueService, Worker, migrate
from alkstore_sa.cli import main
from alkstore_sa.migrations.helpers import lock_key_sql
from alkstore_sa.names import node_channel, schema_key, validate_schema
from alkstore_sa.supervision import Supervisor

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

NAME = "Ünï Jobs-1 x;drop"
"""Upper case, letters beyond ASCII, spaces, a hyphen and a semicolon: only quoted is it a name."""

CANDIDATES = [
    '"pgboss"',
    '"Ünï Jobs"',
    '"x;drop table job"',
    '"1starts_with_a_digit"',
    '"a.b"',
    '"it\'s"',
    '"50%"',
    '"$1"',
    '"back\\\\slash"',
    '"tab\there"',
    '""',
    '"' + "ü" * 25 + '"',
    '"' + "ü" * 26 + '"',
    "plain_lower",
]
"""Configured schema strings, most in quotes: pg-boss and we must accept the same ones."""


@pytest.fixture
def odd(engine: Engine) -> Iterator[str]:
    """:data:`NAME`, installed at 46 by ``alkstore db upgrade --schema '"<NAME>"'``."""
    drop_schema(engine, NAME)
    yield NAME
    drop_schema(engine, NAME)


def test_a_quoted_name_is_the_name_within_and_a_bare_one_is_taken_as_written() -> None:
    assert validate_schema(f'"{NAME}"') == NAME
    assert validate_schema(NAME) == NAME
    assert validate_schema("MyApp") == "MyApp"
    assert validate_schema('"pgboss"') == "pgboss"
    for bad in ('"a.b"', "it's", '"50%"', '""', '"' + "ü" * 26 + '"'):
        with pytest.raises(InvalidNameError) as refused:
            validate_schema(bad)
        assert refused.value.option == "schema"


@pytest.mark.interop
@pytest.mark.smoke
def test_pg_boss_accepts_exactly_the_quoted_names_we_accept(node46_modules: None) -> None:
    script = (
        "import { PgBoss } from 'pg-boss';"
        "const out = {};"
        "for (const s of JSON.parse(process.argv[1])) {"
        "  try { new PgBoss({ connectionString: 'postgres://x@127.0.0.1/x', schema: s });"
        "        out[s] = true } catch (e) { out[s] = false } }"
        "console.log(JSON.stringify(out))"
    )
    theirs = json.loads(run_node46("--input-type=module", "-e", script, json.dumps(CANDIDATES)))

    def ours(name: str) -> bool:
        try:
            validate_schema(name)
        except InvalidNameError:
            return False
        return True

    assert {name: ours(name) for name in CANDIDATES} == theirs
    assert sum(theirs.values()) >= 5 and not all(theirs.values())  # both kinds were tried


@pytest.mark.interop
@pytest.mark.smoke
def test_lock_keys_and_the_channel_are_the_ones_node_derives(
    node46_modules: None, engine: Engine
) -> None:
    configured = ['"pgboss"', "pgboss", f'"{NAME}"', '"MixedCase"']
    script = (
        "import * as plans from './node_modules/pg-boss/dist/plans.js';"
        "console.log(JSON.stringify(JSON.parse(process.argv[1]).map(s =>"
        "  [plans.advisoryLockKey(s, ''), plans.notifyChannelSql(s)])))"
    )
    theirs = json.loads(run_node46("--input-type=module", "-e", script, json.dumps(configured)))
    with engine.connect() as conn:
        for name, (key, channel) in zip(configured, theirs, strict=True):
            stored = validate_schema(name)
            got = conn.execute(text(f"SELECT {key}, {channel}")).one()
            ours = conn.execute(text(f"SELECT {lock_key_sql(stored)}")).scalar_one()
            assert (ours, node_channel(stored)) == (got[0], got[1]), name
    assert schema_key("pgboss") == "pgboss" and schema_key("MixedCase") == '"MixedCase"'


def test_the_cli_installs_and_checks_a_quoted_name(
    database_url: str, engine: Engine, odd: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--database-url", database_url, "--schema", f'"{odd}"']
    assert main(["db", "upgrade", *args]) == 0
    assert schema_exists(engine, odd)
    assert main(["db", "check", *args]) == 0
    assert main(["queue", "create", "mail", *args]) == 0
    capsys.readouterr()
    assert main(["queue", "list", "--json", *args]) == 0
    assert '"mail"' in capsys.readouterr().out
    assert migrate.current_version(engine, f'"{odd}"') == 46


def test_jobs_a_worker_and_supervision_under_a_name_that_must_be_quoted(
    engine: Engine, odd: str
) -> None:
    migrate.upgrade(engine, odd)
    with Session(engine) as session, session.begin():
        service = QueueService(session, schema=odd)
        service.create_queue("mail", retry_limit=0)
        service.schedule("mail", "* * * * *", {"cron": True})
    ran: list[Any] = []
    done = threading.Event()

    def handle(job: Job) -> None:
        ran.append(job.data)
        done.set()

    worker = Worker(engine, schema=f'"{odd}"', supervise=False, poll_interval=60)
    worker.register("mail", handle)
    worker.start()
    try:
        time.sleep(1.5)  # past the first (empty) fetch: polls are a minute apart
        with Session(engine) as session, session.begin():
            QueueService(session, schema=odd).send("mail", {"n": 1})
        assert done.wait(10) and ran == [{"n": 1}]
    finally:
        worker.stop(5)
    report = Supervisor(engine, schema=odd).run_once(force=True)
    assert not report.errors and report.cron_checked and "mail" in report.monitored
    states = rows(
        engine, odd, "SELECT state::text, data FROM {s}.job WHERE name = 'mail' ORDER BY 1"
    )
    # The worker's job, and the one the pass's cron turn sent for the schedule.
    assert states == [("completed", {"n": 1}), ("created", {"cron": True})]


@pytest.mark.interop
def test_node_and_python_share_a_queue_in_a_quoted_schema(
    engine: Engine, odd: str, node46: Any
) -> None:
    boss = node46(f'"{odd}"')  # Node builds it: the name must reach its SQL verbatim
    boss.call("createQueue", "mail", {"notify": True})
    node_job = boss.call("send", "mail", {"by": "node"})
    with Session(engine) as session, session.begin():
        [job] = QueueService(session, schema=f'"{odd}"').fetch("mail")
        assert str(job.id) == node_job
        QueueService(session, schema=odd).complete("mail", job.id, {"by": "python"})
    found = boss.call("getJobById", "mail", node_job)
    assert found["state"] == "completed" and found["output"] == {"by": "python"}
    # Node's notification of a notify queue reaches a worker listening on Node's channel.
    heard = threading.Event()
    worker = Worker(engine, schema=odd, supervise=False, poll_interval=60)
    worker.register("mail", lambda job: heard.set())
    worker.start()
    try:
        time.sleep(1.5)  # past the first (empty) fetch: only Node's notification wakes it
        boss.call("send", "mail", {"by": "node"})
        assert heard.wait(10)
    finally:
        worker.stop(5)
