"""The dashboard's schema health page (docs/how-to/dashboard.md): what ``alkstore db check``
reports, on a real schema, as a page."""

from __future__ import annotations

from urllib.parse import quote

from sqlalchemy import Engine
from starlette.testclient import TestClient
from support.direct import rows
from support.schemas import drop_schema, random_schema

from alkstore_sa import migrate
from alkstore_sa.dashboard import create_app

LOCAL = "http://127.0.0.1"


def _get(engine: Engine, schema: str, path: str) -> str:
    client = TestClient(create_app(engine, schemas=[schema]), base_url=LOCAL)
    page = client.get(path)
    assert page.status_code == 200
    return page.text


def test_a_healthy_schema_says_nothing_is_amiss(engine: Engine, schema46: str) -> None:
    page = _get(engine, schema46, f"/s/{schema46}/health")
    assert "pg-boss schema version 46" in page and "Nothing amiss" in page
    assert 'id="findings"' not in page
    link = f'href="/s/{quote(schema46, safe="")}/health"'
    assert link in _get(engine, schema46, "/")  # in the header


def test_a_dropped_index_and_an_unknown_one_are_listed_with_their_severity(
    engine: Engine, schema46: str
) -> None:
    rows(engine, schema46, "DROP INDEX {s}.job_common_i13")
    rows(engine, schema46, 'CREATE INDEX "<b>mine</b>" ON {s}.job_common (name)')
    page = _get(engine, schema46, f"/s/{schema46}/health")
    assert 'data-severity="heal"' in page and "job_common_i13" in page
    assert 'data-severity="warn"' in page
    assert "&lt;b&gt;mine&lt;/b&gt;" in page and "<b>mine</b>" not in page  # shown as text
    assert "1 unfinished build" in page


def test_the_page_says_whether_every_failed_attempt_is_kept(engine: Engine) -> None:
    schema = random_schema()
    migrate.upgrade(engine, schema, schema_version=46, attempt_history=False)
    try:
        page = _get(engine, schema, f"/s/{schema}/health")
        assert "No attempt history" in page and "alkstore db upgrade" in page
        migrate.install_attempt_history(engine, schema)
        page = _get(engine, schema, f"/s/{schema}/health")
        assert "Every failed attempt's error is kept" in page
        assert "No attempt history" not in page
    finally:
        drop_schema(engine, schema)


def test_a_schema_not_installed_says_how_to_install_it(engine: Engine) -> None:
    name = random_schema()
    page = _get(engine, name, f"/s/{name}/health")
    assert "is not installed" in page and f"alkstore db upgrade --schema {name}" in page
    drop_schema(engine, name)
