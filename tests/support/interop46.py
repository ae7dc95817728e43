"""Shared pieces of the schema-46 interop tests (Node pg-boss 12.38.0 against our runtime).

- ``schema46_by``: a fresh schema at 46, made once by our migrations (``alkstore``) and
  once by Node pg-boss 12.38.0's own construction plan (``node``), with 46 spoken
  (the ``spoken46`` fixture of tests/conftest.py).
- helpers reading rows, states and columns with plain SQL, so that what a test checks
  does not depend on the code under test.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text

from alkstore_sa import migrate

from .node import NodeBoss46, node_connection_string, run_node46
from .schemas import drop_schema, random_schema, run_script

MAKERS = ["alkstore", "node"]
"""Who builds the schema at 46: our migrations (their offline script), or Node pg-boss
12.38.0's construction plan (what its first start runs)."""


def node_plan(schema: str) -> str:
    """Node pg-boss 12.38.0's ``getConstructionPlans(schema)``: what its first start runs."""
    return run_node46("boss.mjs", "plan", schema)


TEMPLATE_SCHEMA = "i46_template_0f3a9c"
"""The schema name the construction scripts are written for once, then renamed."""

_scripts: dict[str, str] = {}


def construction_script(maker: str, name: str) -> str:
    """The script that builds schema ``name`` at 46 the way ``maker`` does.

    Each maker's script is made once per session for :data:`TEMPLATE_SCHEMA` and renamed:
    both scripts name their schema only as an identifier, so the renamed script is the one
    they would write for ``name`` (``test_construction_scripts_renamed_equal_made`` checks it).
    """
    if maker not in _scripts:
        if maker == "alkstore":
            # The script migrate.upgrade(..., schema_version=46) runs (the same revisions,
            # one round trip): five times faster than upgrading online, which matters at
            # one fresh schema per test. The online path is covered by
            # test_interop46_schema.py and the rolling upgrade.
            _scripts[maker] = migrate.offline_sql(TEMPLATE_SCHEMA, schema_version=46)
        elif maker == "node":
            _scripts[maker] = node_plan(TEMPLATE_SCHEMA)
        else:  # pragma: no cover - a typo in a parametrization
            raise ValueError(maker)
    return _scripts[maker].replace(TEMPLATE_SCHEMA, name)


def make_schema46(engine: Engine, database_url: str, maker: str, prefix: str = "i46_") -> str:
    """A fresh schema at 46, built by ``maker`` (``"alkstore"`` or ``"node"``)."""
    name = random_schema(prefix)
    run_script(database_url, construction_script(maker, name))
    return name


def node_rollback_plan(schema: str, version: int) -> str:
    """Node pg-boss 12.38.0's ``getRollbackPlans(schema, V)`` for each V from 46 down to
    ``version + 1``: its own SQL taking a schema at 46 back to ``version``."""
    return run_node46("boss.mjs", "rollback-plan", schema, str(version))


def make_node_schema_at(
    engine: Engine, database_url: str, version: int, prefix: str = "i46_"
) -> str:
    """A fresh schema at ``version`` (27 to 46) made by Node pg-boss 12.38.0 alone: its
    construction plan at 46, then its own rollback plans down to ``version``. No revision
    of ours is recorded in it."""
    name = make_schema46(engine, database_url, "node", prefix)
    if version < 46:
        run_script(database_url, node_rollback_plan(name, version))
    return name


@pytest.fixture(params=MAKERS)
def schema46_by(
    request: pytest.FixtureRequest,
    engine: Engine,
    database_url: str,
    spoken46: None,
    node46_modules: None,
) -> Iterator[str]:
    """A fresh schema at 46 made by our migrations or by Node 12.38.0, with 46 spoken."""
    name = make_schema46(engine, database_url, request.param)
    yield name
    drop_schema(engine, name)


class Shared46:
    """One schema at 46 and one Node pg-boss 12.38.0 on it, shared by a module's tests.

    Only for tests that start no Node worker and no supervisor, and that name their
    queues with :meth:`queue` so that no two tests meet in the shared schema.
    """

    def __init__(self, schema: str, boss: NodeBoss46) -> None:
        self.schema, self.boss = schema, boss

    def queue(self, stem: str = "q") -> str:
        """A queue name no other test of the module uses."""
        return f"{stem}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module", params=MAKERS)
def shared46_by(
    request: pytest.FixtureRequest, engine: Engine, database_url: str, node46_modules: None
) -> Iterator[Shared46]:
    """A schema at 46 made by our migrations or by Node 12.38.0, and one Node on it, for
    the whole module (a test still asks for ``spoken46``: see :func:`on46`)."""
    name = make_schema46(engine, database_url, request.param)
    boss = NodeBoss46(node_connection_string(database_url), name, supervise=False, schedule=False)
    try:
        yield Shared46(name, boss)
    finally:
        boss.close()
        drop_schema(engine, name)


@pytest.fixture
def on46(shared46_by: Shared46, spoken46: None) -> Shared46:
    """The module's shared schema and Node, with 46 spoken and Node's past events forgotten."""
    shared46_by.boss.clear_events()
    return shared46_by


def wait_until(predicate: Callable[[], bool], timeout: float = 15, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; return the last answer."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return bool(predicate())
        time.sleep(interval)
    return True


def sql(engine: Engine, schema: str, statement: str, **params: Any) -> list[Any]:
    """Rows of ``statement`` with ``{s}`` standing for the quoted schema (own transaction)."""
    with engine.begin() as conn:
        result = conn.execute(text(statement.replace("{s}", f'"{schema}"')), params)
        return list(result.all()) if result.returns_rows else []


def job_row(engine: Engine, schema: str, job_id: Any, columns: str = "*") -> dict[str, Any]:
    """One job row by id, as a dict."""
    [row] = sql(engine, schema, f"SELECT {columns} FROM {{s}}.job WHERE id = :id", id=str(job_id))
    return dict(row._mapping)


def states(engine: Engine, schema: str, name: str) -> Counter[str]:
    """How many jobs of queue ``name`` are in each state."""
    rows = sql(
        engine,
        schema,
        "SELECT state::text, count(*) FROM {s}.job WHERE name = :n GROUP BY 1",
        n=name,
    )
    return Counter({state: count for state, count in rows})


def version_of(engine: Engine, schema: str) -> int:
    """The version row of ``schema``."""
    [(version,)] = sql(engine, schema, "SELECT version::int FROM {s}.version")
    return int(version)
