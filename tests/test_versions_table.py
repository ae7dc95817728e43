"""The table of what needs which schema version (``alkstore_sa.versions``): the
compatibility page lists it exactly, and every entry is read by the runtime."""

from __future__ import annotations

import pathlib
import re

import pytest
from sqlalchemy import Engine, text

from alkstore_sa import SchemaFeatureError, names, options, versions

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "concepts" / "compatibility.md"


def _section() -> str:
    text = PAGE.read_text(encoding="utf-8")
    start = text.index("## What needs which schema version")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _rows(header: str) -> dict[str, str]:
    """The rows of the section's table whose header starts with ``header``: the
    first cell's backquoted name and the last cell."""
    rows: dict[str, str] = {}
    inside = False
    for line in _section().splitlines():
        if line.startswith(f"| {header} |"):
            inside = True
            continue
        if inside and not line.startswith("|"):
            break
        if inside and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            name = re.match(r"`([^`]+)`", cells[0])
            assert name is not None, line
            rows[name.group(1)] = cells[-1]
    return rows


def test_the_page_lists_every_feature_with_its_version() -> None:
    listed = _rows("Feature")
    assert listed == {name: str(v) for name, v in versions.FEATURES.items()}


def test_the_page_lists_every_option_newer_than_26() -> None:
    newer = {o.name: str(o.since) for o in options.OPTIONS if o.since > names.SCHEMA_VERSION}
    assert newer, "the option table has options of pg-boss 12"
    assert _rows("Option") == newer


def test_every_feature_is_read_by_the_runtime() -> None:
    sources = [
        p.read_text(encoding="utf-8")
        for p in (ROOT / "alkstore_sa").rglob("*.py")
        if p.name != "versions.py"
    ]
    unread = [
        f for f in versions.FEATURES if not any(f'"{f}"' in s or f"'{f}'" in s for s in sources)
    ]
    assert unread == []


def test_require_refuses_an_older_version_naming_what_was_asked() -> None:
    with pytest.raises(SchemaFeatureError) as caught:
        versions.require("s", 26, "flow", "get_dependents")
    assert (caught.value.feature, caught.value.needed, caught.value.found) == (
        "get_dependents",
        versions.FEATURES["flow"],
        26,
    )
    versions.require("s", 46, "flow")  # no error at 46
    assert versions.has(47, "flow") and not versions.has(26, "flow")


def test_an_unknown_feature_is_a_key_error_not_a_silent_yes() -> None:
    with pytest.raises(KeyError):
        versions.has(46, "no such feature")


def test_every_reader_of_the_version_row_gives_one_answer_for_a_missing_row(
    engine: Engine, schema: str
) -> None:
    from alkstore_sa import SchemaVersionError, migrate
    from alkstore_sa.ops import Context, check_schema, driver, read_version
    from alkstore_sa.schema_versions import NO_VERSION_ROW

    options = {"schema_translate_map": {"pgboss": schema}}
    with engine.begin() as conn:
        assert migrate.installed_version(conn, schema) == 26
        conn.execute(text(f'DELETE FROM "{schema}".version'))
        answers = {
            migrate.installed_version(conn, schema),
            driver.run(conn, read_version(schema), options),
        }
        assert answers == {NO_VERSION_ROW}
        with pytest.raises(SchemaVersionError) as caught:
            driver.run(conn, check_schema(Context(schema)), options)
        assert caught.value.found is None and "no version" in str(caught.value)
        conn.rollback()
    with engine.connect() as conn:
        missing = "no_such_schema_for_versions"
        assert migrate.installed_version(conn, missing) is None
        assert driver.run(conn, read_version(missing), options) is None
