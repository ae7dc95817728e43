"""Docstrings of the package link the docs by page title, never by a path into the
repository: the wheel ships neither ``docs/`` nor ``tests/``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from support.source import parsed

PACKAGE = Path(__file__).resolve().parent.parent / "alkstore_sa"
REPO_PATH = re.compile(r"\b(?:docs/[\w./-]+\.md|tests/[\w./-]+\.py)")


def test_no_docstring_cites_a_path_the_wheel_does_not_ship() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = parsed(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            # Every bare string statement: module, class and function docstrings, and
            # the ones documenting a constant or an attribute.
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                doc = node.value.value if isinstance(node.value.value, str) else ""
                found += [f"{path.relative_to(PACKAGE)}: {m}" for m in REPO_PATH.findall(doc)]
    assert found == [], "\n".join(found)
