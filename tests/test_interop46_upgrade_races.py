"""Interop: ``alkstore db upgrade --schema-version 46`` racing Node pg-boss 12.38.0's
``start()`` (``migrate: true``) on a schema at 26.

Both take pg-boss's migration advisory lock, one key derived from the database and the
schema: the key is checked against the one pg-boss's own code computes, and observed in
``pg_locks`` while Node waits for it. Whoever gets the lock first migrates; the other
waits and finds nothing left to migrate. Either way both finish, no ``bam`` row is left
unfinished, and the schema is a clean 46 (``alkstore_sa.schema_health`` finds nothing,
nor does pg-boss's own drift check).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support import catalog
from support.node import NodeBoss46, node46, node46_modules, node_url, run_node46
from support.schemas import drop_schema, random_schema

import alkstore_sa
from alkstore_sa import QueueService, migrate, schema_health
from alkstore_sa.ops.bam_rules import bam_refusal

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

pytestmark = pytest.mark.interop

ROOT = Path(alkstore_sa.__file__).resolve().parent.parent

NODE_KEY = """
import { pathToFileURL } from 'node:url';
import { resolve } from 'node:path';
const plans = await import(pathToFileURL(resolve('node_modules/pg-boss/dist/plans.js')).href);
console.log(plans.advisoryLockKey(process.argv[1]));
"""
"""Prints the SQL expression pg-boss 12.38.0 locks a schema's migrations with."""


@pytest.fixture
def schema26(engine: Engine) -> Iterator[str]:
    name = random_schema("race_")
    migrate.upgrade(engine, name, schema_version=26)
    with Session(engine) as session, session.begin():
        service = QueueService(session, schema=name)
        service.create_queue("shared")
        service.create_queue("own", partition=True)
        service.create_queue("own-single", policy="singleton", partition=True)
        for queue in ("shared", "own", "own-single"):
            service.send(queue, {"n": 1})
    yield name
    drop_schema(engine, name)


def _scalar(engine: Engine, sql: str, **params: Any) -> Any:
    with engine.begin() as conn:
        return conn.execute(text(sql), params).scalar()


def _key(engine: Engine, schema: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f"SELECT {schema_health.lock_key_sql(schema)}")).scalar_one())


def _lockers(engine: Engine, key: int) -> list[tuple[int, bool]]:
    unsigned = key & 0xFFFFFFFFFFFFFFFF
    with engine.connect() as conn:
        found = conn.execute(
            text(
                "SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory' "
                "AND objsubid = 1 AND classid::bigint = :hi AND objid::bigint = :lo "
                "AND database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database()) ORDER BY pid"
            ),
            {"hi": unsigned >> 32, "lo": unsigned & 0xFFFFFFFF},
        )
        return [(int(r[0]), bool(r[1])) for r in found]


def _until(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


def _cli_upgrade(database_url: str, schema: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ALKSTORE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env["PGAPPNAME"] = f"alkstore-test-{schema}"  # libpq's application_name: see below
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "alkstore_sa.cli",
            "db",
            "upgrade",
            "--schema-version",
            "46",
            "--schema",
            schema,
            "--database-url",
            database_url,
            "--json",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class NodeStart:
    """``node46(schema, migrate=True)`` in a thread: its ``start()`` may have to wait."""

    def __init__(self, start: Callable[..., NodeBoss46], schema: str) -> None:
        self.boss: NodeBoss46 | None = None
        self.error: BaseException | None = None

        def run() -> None:
            try:
                self.boss = start(schema, migrate=True)
            except BaseException as exc:  # reported by the test
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def started(self, timeout: float = 90) -> NodeBoss46:
        self.thread.join(timeout)
        assert self.error is None, self.error
        assert self.boss is not None, "Node pg-boss did not start"
        return self.boss


def _clean46(engine: Engine, schema: str, boss: NodeBoss46) -> None:
    # Node's background runner may still be marking rows it picked up: give it time.
    def settled() -> bool:
        return all(row[2] == "completed" for row in catalog.bam_rows(engine, schema))

    _until(settled, "the bam rows to complete")
    with engine.connect() as conn:
        found = schema_health.diagnose(conn, schema)
    assert (found.version, found.recorded, list(found.findings)) == (46, 46, [])
    drift = boss.call("detectSchemaDrift")
    assert (drift["missing"], drift["invalid"], drift["missingTables"]) == ([], [], [])
    # Jobs sent at 26 are still there, and Node can work at 46.
    assert _scalar(engine, f'SELECT count(*) FROM "{schema}".job') == 3
    assert boss.call("send", "shared", {"from": "node"})


def test_our_lock_key_is_pg_boss_own(engine: Engine, node46_modules: None, schema26: str) -> None:
    theirs = run_node46("--input-type=module", "-e", NODE_KEY, schema26).strip()
    assert "sha224" in theirs  # pg-boss's expression, evaluated by PostgreSQL below
    assert _scalar(engine, f"SELECT {theirs}") == _key(engine, schema26)


def test_node_start_first_then_our_upgrade_waits_records_and_heals(
    engine: Engine,
    database_url: str,
    schema26: str,
    node46: Callable[..., NodeBoss46],  # after schema26: its instances stop before the drop
) -> None:
    key = _key(engine, schema26)
    with engine.connect() as holder:
        holder.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
        holder.commit()
        node = NodeStart(node46, schema26)
        # Node's migration waits for this very key: the same lock, seen in pg_locks.
        _until(lambda: len(_lockers(engine, key)) == 2, "Node to wait for the lock")
        proc = _cli_upgrade(database_url, schema26)
        _until(
            lambda: (
                _scalar(
                    engine,
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    f"AND application_name = 'alkstore-test-{schema26}' "
                    "AND query LIKE 'SELECT pg_try_advisory_lock(%'",
                )
                >= 1
            ),
            "our upgrade to wait for the lock",
        )
        assert [granted for _, granted in _lockers(engine, key)].count(False) == 1
        assert _scalar(engine, f'SELECT version FROM "{schema26}".version') == 26
        holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
        holder.commit()
    boss = node.started()
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["revision"] == "alkstore_0046"
    assert "recorded schema 46, which Node pg-boss migrated the schema to" in result["message"]
    assert boss.errors() == []
    # Node's migration queued its index builds; between its runner and our heal, all done.
    assert catalog.bam_rows(engine, schema26) != []
    # Every command it queued is one our BAM runner would run (ops/bam_rules.py).
    with engine.connect() as conn:
        queued = conn.execute(text(f'SELECT table_name, command FROM "{schema26}".bam')).all()
    refused = [(c, bam_refusal(schema26, t, c)) for t, c in queued]
    assert [r for r in refused if r[1] is not None] == [], refused
    _clean46(engine, schema26, boss)


def test_our_upgrade_first_then_node_start_waits_and_finds_46(
    engine: Engine,
    database_url: str,
    schema26: str,
    node46: Callable[..., NodeBoss46],  # after schema26: its instances stop before the drop
) -> None:
    key = _key(engine, schema26)
    with engine.connect() as blocker:
        # Our upgrade takes the lock, then waits on the version table this transaction
        # holds; Node's start() reads that table too, then waits for the lock.
        blocker.execute(text(f'LOCK TABLE "{schema26}".version IN ACCESS EXCLUSIVE MODE'))
        proc = _cli_upgrade(database_url, schema26)
        _until(lambda: _lockers(engine, key) != [], "our upgrade to take the lock")
        ours = _lockers(engine, key)
        node = NodeStart(node46, schema26)
        time.sleep(0.5)  # let Node reach the version table (not an assertion)
        blocker.rollback()
    assert len(ours) == 1 and ours[0][1]
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert json.loads(out)["status"] == "upgraded"
    boss = node.started()
    assert boss.errors() == []
    assert catalog.bam_rows(engine, schema26) == []  # ours builds its indexes itself
    _clean46(engine, schema26, boss)
