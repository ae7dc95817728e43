"""The SQL Node pg-boss runs itself: 11.1.2 by ``interop/construction_plan.js``, 12.38.0 by
``interop46/boss.mjs``.

Node and the npm package are test prerequisites: without them the tests that need
them skip locally and fail under ``CI=true``, like the database fixture.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .node import BOSS46_SCRIPT, run_node46
from .skips import unavailable

INTEROP = Path(__file__).resolve().parent.parent / "interop"
PLAN_SCRIPT = INTEROP / "construction_plan.js"


@functools.cache
def _node() -> str | None:
    node = shutil.which("node")
    if node is None:
        return None
    if not (INTEROP / "node_modules" / "pg-boss").is_dir():
        npm = shutil.which("npm")
        if npm is None:
            return None
        subprocess.run(
            [npm, "ci", "--prefix", str(INTEROP), "--no-audit", "--no-fund"],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return node


def _run(*args: str) -> str:
    node = _node()
    if node is None:
        unavailable("Node.js and npm are needed to run pg-boss 11.1.2")
    done = subprocess.run(
        [node, str(PLAN_SCRIPT), *args], cwd=INTEROP, capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise RuntimeError(f"{PLAN_SCRIPT.name} failed: {done.stderr.strip()}")
    return done.stdout


TEMPLATE_SCHEMA = "n_zztemplatezz"
"""The name Node writes its plans for once per session; each test's plan is that one renamed.
pg-boss writes a lower-case schema name into its SQL as it was given (identifiers and string
literals alike), so for such a name the renamed plan is the one it writes
(``tests/test_golden_schema.py`` checks both versions' plans); a name with capitals, which
pg-boss folds in some places only, is asked of Node itself."""


def _renamable(schema: str) -> bool:
    return schema == schema.lower()


@functools.cache
def _template_plan() -> str:
    return _run(TEMPLATE_SCHEMA)


def construction_plan(schema: str) -> str:
    """``PgBoss.getConstructionPlans(schema)``: the whole install script (one transaction)."""
    if not _renamable(schema):
        return construction_plan_from_node(schema)
    return _template_plan().replace(TEMPLATE_SCHEMA, schema)


def construction_plan_from_node(schema: str) -> str:
    """:func:`construction_plan`, asked of Node for ``schema`` itself (no renaming)."""
    return _run(schema)


def client_statements(schemas: list[str], calls: list[list[Any]]) -> dict[str, list[str]]:
    """The statements Node pg-boss sends for ``createQueue``/``deleteQueue`` calls.

    ``calls`` items are ``["create-queue", name, options]`` or ``["delete-queue", name]``,
    options with pg-boss's own keys (``retryLimit``, ``deadLetter``, ...). Each
    statement is a whole locked transaction, as the client sends it. One list per
    schema, from a single Node run.
    """
    statements: dict[str, list[str]] = json.loads(_run(",".join(schemas), json.dumps(calls)))
    return statements


@functools.cache
def _template_plan46() -> str:
    return run_node46(str(BOSS46_SCRIPT), "plan", TEMPLATE_SCHEMA)


def construction_plan46(schema: str) -> str:
    """pg-boss 12.38.0's ``getConstructionPlans(schema)``: a fresh install at schema 46.

    Run once per session by the Node 22 in ``tests/interop46`` (installed by
    ``node46_modules``), for :data:`TEMPLATE_SCHEMA`, and renamed.
    """
    if not _renamable(schema):
        return construction_plan46_from_node(schema)
    return _template_plan46().replace(TEMPLATE_SCHEMA, schema)


def construction_plan46_from_node(schema: str) -> str:
    """:func:`construction_plan46`, asked of Node for ``schema`` itself (no renaming)."""
    return run_node46(str(BOSS46_SCRIPT), "plan", schema)


@functools.cache
def migration_plan46(schema: str, version: int) -> str:
    """pg-boss 12.38.0's ``getMigrationPlans(schema, version)``: ``version`` to 46."""
    return run_node46(str(BOSS46_SCRIPT), "migration-plan", schema, str(version))
