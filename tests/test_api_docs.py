"""The committed API reference (docs/reference/api.md) is what ``tools/gen_api_docs.py``
writes from the docstrings now, and it documents every public name."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "api.md"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_api_docs", ROOT / "tools" / "gen_api_docs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_page_is_what_the_generator_writes() -> None:
    current = PAGE.read_text(encoding="utf-8")
    assert load_generator().page(current) == current, (
        "docs/reference/api.md is stale: run python tools/gen_api_docs.py"
    )


def test_every_rendered_method_has_a_docstring() -> None:
    # Which names are rendered at all: tests/test_public_api.py.
    assert "(no docstring)" not in PAGE.read_text(encoding="utf-8")


def test_docstrings_become_markdown() -> None:
    markdown = load_generator().markdown
    doc = """Send it.

    Uses :class:`~alkstore_sa.records.Job` and ``code``.

    :param name: the queue,
        on two lines.
    :raises QueueNotFoundError: if missing.
    """
    assert markdown(doc) == (
        "Send it.\n\nUses `Job` and `code`.\n\n"
        "- `name`: the queue, on two lines.\n- raises `QueueNotFoundError`: if missing."
    )


def test_the_index_links_every_section_and_object_once() -> None:
    generator = load_generator()
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    start, end = lines.index(generator.INDEX_OPEN), lines.index(generator.INDEX_CLOSE)
    entries = "\n".join(lines[start:end])
    body = lines[:start] + lines[end:]
    for level, text in generator._headings(body):
        if level <= 3:
            assert f"[{text}](#{generator.slug(text)})" in entries, text


def test_a_repeated_anchor_links_to_the_heading_above_it() -> None:
    index = load_generator().index
    page = ["## A", "### `m`", "#### `f`", "## B", "### `n`", "#### `f`", "#### `g`"]
    assert index(page) == [
        "- [A](#a)",
        "    - [`m`](#m): [`f`](#f)",
        "- [B](#b)",
        "    - [`n`](#n): [`f`](#n) · [`g`](#g)",
    ]
