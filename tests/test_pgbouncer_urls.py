"""``run_pgbouncer`` reaches the server however its URL names it: TCP, a socket folder in the
query, or no host at all (libpq's ``PGHOST`` and default socket folder)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from support.pgbouncer import pgbouncer

from alkstore_sa.testing.pgbouncer import _pooled_url, _Upstream


@pytest.fixture(scope="module")
def socket_dir_and_port(engine: Engine) -> tuple[str, int]:
    """The server's first Unix-socket folder and its port, as it reports them."""
    with engine.connect() as conn:
        folders = conn.execute(text("SHOW unix_socket_directories")).scalar_one()
        port = int(conn.execute(text("SHOW port")).scalar_one())
    first = folders.split(",")[0].strip()
    assert first.startswith("/"), f"the server has no socket folder: {folders!r}"
    return first, port


def through(url: str) -> tuple[str, int | None]:
    """What a connection through ``url`` sees: its database and the server's TCP port
    (``None`` when the server was reached over a Unix socket)."""
    eng = create_engine(url)
    try:
        with eng.connect() as conn:
            database = conn.execute(text("SELECT current_database()")).scalar_one()
            port = conn.execute(text("SELECT inet_server_port()")).scalar_one()
        return database, port
    finally:
        eng.dispose()


@pytest.fixture
def database_name(engine: Engine) -> str:
    with engine.connect() as conn:
        name: str = conn.execute(text("SELECT current_database()")).scalar_one()
    return name


def test_a_socket_folder_in_the_query_reaches_the_server_over_its_socket(
    socket_dir_and_port: tuple[str, int], database_name: str
) -> None:
    folder, port = socket_dir_and_port
    url = f"postgresql+psycopg://postgres@/{database_name}?host={folder}&port={port}"
    with pgbouncer(url, "transaction") as pooled:
        assert make_url(pooled).host == "127.0.0.1"
        assert "host" not in make_url(pooled).query
        database, server_port = through(pooled)
    assert database == database_name
    # PgBouncer met the server on its socket: the server reports no TCP port.
    assert server_port is None


def test_a_url_without_host_reaches_the_server_libpq_would(
    socket_dir_and_port: tuple[str, int], database_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder, port = socket_dir_and_port
    monkeypatch.setenv("PGHOST", folder)
    monkeypatch.setenv("PGPORT", str(port))
    with pgbouncer(f"postgresql+psycopg://postgres@/{database_name}", "session") as pooled:
        monkeypatch.delenv("PGHOST")
        monkeypatch.delenv("PGPORT")
        pooled_url = make_url(pooled)
        assert (pooled_url.host, pooled_url.database) == ("127.0.0.1", database_name)
        database, server_port = through(pooled)
    assert database == database_name
    assert server_port is None


def test_the_tests_own_url_works_through_pgbouncer(database_url: str, database_name: str) -> None:
    """The form the suite runs on (TCP in CI's first run, a socket folder on the embedded
    server) reaches the same database."""
    with pgbouncer(database_url, "transaction") as pooled:
        assert through(pooled)[0] == database_name


@pytest.fixture
def upstream() -> Iterator[_Upstream]:
    yield _Upstream(host="/run/postgresql", port=5433, dbname="app", user="worker")


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "postgresql+psycopg://me:secret@db.example:5433/app?application_name=jobs",
            "postgresql+psycopg://me:secret@127.0.0.1:6432/app?application_name=jobs",
        ),
        (
            "postgresql+psycopg://worker@/app?host=/run/postgresql&port=5433",
            "postgresql+psycopg://worker@127.0.0.1:6432/app",
        ),
        (
            "postgresql+psycopg:///?host=/run/postgresql&hostaddr=10.0.0.1&sslmode=disable",
            "postgresql+psycopg://worker@127.0.0.1:6432/app?sslmode=disable",
        ),
        ("postgresql://", "postgresql://worker@127.0.0.1:6432/app"),
    ],
    ids=["tcp", "socket-in-query", "where-keys-dropped", "no-host-no-database"],
)
def test_the_pooled_url_names_pgbouncer_and_what_libpq_resolved(
    url: str, expected: str, upstream: _Upstream
) -> None:
    assert _pooled_url(url, 6432, upstream) == expected
