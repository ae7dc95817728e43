"""Other job queues run by the bench beside the ceiling and alkstore_sa: pg-boss and PgQueuer.

Each peer is a long-lived process of its own runtime (Node for pg-boss 12.38, a Python
process with asyncpg for PgQueuer) that installs the peer in its own schema and answers one
JSON command per line (see ``pgboss.mjs``). pg-boss 11.1.2 (``pgboss11.mjs``, the Node on the
PATH) is the exception: it works in the bench's own schema at 26, which it neither creates
nor migrates (the ``scale26:`` scenario). :func:`peer` starts it on first use; :func:`close_all`
stops them and drops their schemas at the end of the run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from psycopg import sql

from ..common import Config, libpq_url

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
INTEROP46 = ROOT / "tests" / "interop46" / "node_modules"
NODE = INTEROP46 / "node" / "bin" / "node"
"""Node 22 from the npm package ``node`` that ``npm ci --prefix tests/interop46`` installs."""
PGBOSS_ENTRY = INTEROP46 / "pg-boss" / "dist" / "index.js"
PGBOSS_VERSION = "12.38.0"

INTEROP = ROOT / "tests" / "interop" / "node_modules"
PGBOSS11_ENTRY = INTEROP / "pg-boss" / "src" / "index.js"
"""pg-boss 11.1.2 (schema 26), installed by ``npm ci --prefix tests/interop``."""

PGBOSS = "pg-boss 12.38"
PGBOSS11 = "pg-boss 11.1.2"
PGQUEUER = "PgQueuer"


def missing(name: str) -> str | None:
    """Why the peer ``name`` cannot run here, or ``None`` when it can."""
    if name == PGBOSS:
        if not NODE.exists() or not PGBOSS_ENTRY.exists():
            return "pg-boss 12.38 / Node 22 not installed: run `npm ci --prefix tests/interop46`"
        return None
    if name == PGBOSS11:
        if shutil.which("node") is None or not PGBOSS11_ENTRY.exists():
            return "pg-boss 11.1.2 / node not installed: run `npm ci --prefix tests/interop`"
        return None
    if name == PGQUEUER:
        if (
            importlib.util.find_spec("pgqueuer") is None
            or importlib.util.find_spec("asyncpg") is None
        ):
            return "PgQueuer not installed: run `pip install -e . --group bench`"
        return None
    raise ValueError(f"unknown peer {name!r}")


def pgqueuer_version() -> str:
    from importlib.metadata import version

    return version("pgqueuer")


@dataclass
class PeerProcess:
    """A started peer process; :meth:`call` sends one command and returns its answer."""

    name: str
    schema: str
    proc: subprocess.Popen[str]

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited (code {self.proc.wait()})")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.name}: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_running: dict[tuple[str, str], PeerProcess] = {}


def _start(cfg: Config, name: str) -> PeerProcess:
    url = libpq_url(cfg.url)
    if name == PGBOSS:
        schema = f"{cfg.schema}_pgboss"
        config = {
            "connectionString": url,
            "schema": schema,
            "queue": "bench",
            "module": PGBOSS_ENTRY.as_uri(),
        }
        argv = [str(NODE), str(HERE / "pgboss.mjs"), json.dumps(config)]
        env = dict(os.environ)
    elif name == PGBOSS11:
        schema = cfg.schema  # ours, at 26: not its to drop
        config = {"connectionString": url, "schema": schema, "module": PGBOSS11_ENTRY.as_uri()}
        argv = [shutil.which("node") or "node", str(HERE / "pgboss11.mjs"), json.dumps(config)]
        env = dict(os.environ)
    else:
        schema = f"{cfg.schema}_pgq"
        argv = [sys.executable, "-m", "bench.peers.pgqueuer_peer", json.dumps({"dsn": url})]
        # Its own schema, and a prefix for its database-wide NOTIFY channel.
        env = {**os.environ, "PGQUEUER_SCHEMA": schema, "PGQUEUER_PREFIX": f"{cfg.schema}_"}
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    ready = json.loads(first) if first.strip() else {"fatal": f"exit code {proc.wait()}"}
    if not ready.get("ready"):
        proc.kill()
        raise RuntimeError(f"{name} did not start: {ready.get('fatal')}")
    return PeerProcess(name, schema, proc)


def peer(cfg: Config, name: str) -> PeerProcess:
    """The running process of peer ``name`` for this bench run, started on first use."""
    key = (cfg.schema, name)
    if key not in _running:
        _running[key] = _start(cfg, name)
    return _running[key]


def close_all(cfg: Config, *, drop: bool = True) -> None:
    """Stop this run's peer processes and drop their schemas (not the run's own)."""
    for key in [k for k in _running if k[0] == cfg.schema]:
        p = _running.pop(key)
        p.close()
        if drop and p.schema != cfg.schema:
            with cfg.raw(autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(p.schema))
                )
