"""Every relative link of README.md and docs/ reaches a file of the repository, and its
``#anchor`` a heading of that file (as the docs site's table of contents names them), so a
renamed page or section cannot leave a reader at a dead end."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def slug(heading: str) -> str:
    """The anchor the Markdown table of contents gives ``heading``: its text without
    the inline markup, without punctuation, lower case, runs of spaces and dashes as one
    dash."""
    text = re.sub(r"[`*]", "", heading)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    body = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#{1,6}\s+(.+?)\s*$", body, re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_reach_a_file_and_a_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        reached = (page.parent / path).resolve() if path else page
        if not reached.exists():
            broken.append(f"{target}: no such file")
        elif anchor and reached.suffix == ".md" and anchor not in anchors(reached):
            broken.append(f"{target}: no heading #{anchor}")
    assert broken == [], f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_slug_follows_the_table_of_contents() -> None:
    assert slug("Schema versions and Node pg-boss releases") == (
        "schema-versions-and-node-pg-boss-releases"
    )
    assert slug("`alkstore` command line") == "alkstore-command-line"
    assert slug("What a won turn includes (schema 46)") == "what-a-won-turn-includes-schema-46"
    assert slug("What alkstore_sa refuses") == "what-alkstore_sa-refuses"


def project_urls() -> tuple[str, str]:
    """The docs site and the repository's ``blob/main/`` address, from ``[project.urls]``."""
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    return urls["Documentation"].rstrip("/") + "/", urls["Repository"].rstrip("/") + "/blob/main/"


def file_behind(url: str) -> Path | None:
    """The repository file a docs-site or repository URL shows (``None`` for any other
    address): ``<site>/how-to/alembic/`` is ``docs/how-to/alembic.md``, as MkDocs builds it."""
    site, repository = project_urls()
    if url.startswith(repository):
        return ROOT / url[len(repository) :]
    if url.startswith(site):
        page = url[len(site) :].strip("/")
        return ROOT / "docs" / (f"{page}.md" if page else "index.md")
    return None


def test_every_readme_link_is_absolute_and_reaches_a_file_and_a_heading() -> None:
    """PyPI shows the README away from the repository: a relative link breaks there."""
    relative, broken = [], []
    for target in LINK.findall(FENCE.sub("", (ROOT / "README.md").read_text(encoding="utf-8"))):
        if not re.match(r"https?://", target):
            relative.append(target)
            continue
        url, _, anchor = target.partition("#")
        reached = file_behind(url)
        if reached is None:
            continue  # another site's page
        if not reached.is_file():
            broken.append(f"{target}: no file {reached.relative_to(ROOT)}")
        elif anchor and reached.suffix == ".md" and anchor not in anchors(reached):
            broken.append(f"{target}: no heading #{anchor}")
    assert relative == [], f"relative links in README.md: {relative}"
    assert broken == []


def test_a_project_url_maps_back_to_its_file() -> None:
    site, repository = project_urls()
    assert file_behind(f"{site}how-to/alembic/") == ROOT / "docs" / "how-to" / "alembic.md"
    assert file_behind(site) == ROOT / "docs" / "index.md"
    assert file_behind(f"{repository}CHANGELOG.md") == ROOT / "CHANGELOG.md"
    assert file_behind("https://example.com/docs/") is None
