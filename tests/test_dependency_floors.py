"""The lowest versions we declare are the ones CI installs (``.ci/floors``), and the one
construct that differs between SQLAlchemy 2.0 and 2.1 renders the same SQL on both."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.version import Version
from sqlalchemy import Engine, column, select, table

from alkstore_sa.sql.common.compat import distinct_on

ROOT = Path(__file__).resolve().parent.parent

FLOORED_EXTRAS = ("binary", "embedded", "dashboard", "api", "metrics", "otel")
"""The extras an application installs; our own tools are dependency groups (``test``,
``dev``, ``docs``, ``examples``, ``bench``), never published as extras."""

REQUIREMENT = re.compile(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)")


def normalised(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared_floors(
    extras: tuple[str, ...] = FLOORED_EXTRAS, *, group: str | None = None
) -> dict[str, Version]:
    """The floors of the package and ``extras``, or of the dependency group ``group`` alone."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    project = pyproject["project"]
    if group is not None:
        requirements = [str(r) for r in pyproject["dependency-groups"][group]]
    else:
        requirements = list(project["dependencies"])
        for extra in extras:
            requirements += project["optional-dependencies"][extra]
    floors: dict[str, Version] = {}
    for requirement in requirements:
        found = REQUIREMENT.match(requirement)
        assert found, f"{requirement!r} declares no floor (name>=version)"
        name, version = normalised(found.group(1)), Version(found.group(2))
        assert floors.setdefault(name, version) == version, f"two floors for {name}"
    return floors


def pinned() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "tests" / "floors.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[normalised(name)] = Version(version)
    return pins


def test_every_declared_floor_is_what_the_floors_job_installs() -> None:
    floors = declared_floors()
    pins = pinned()
    # psycopg[binary] brings psycopg-binary at psycopg's own version.
    assert pins.pop("psycopg-binary") == floors["psycopg"]
    # Any other pin is a test tool held at the test group's own floor.
    tools = declared_floors(group="test")
    held = {name: pins.pop(name) for name in set(pins) - set(floors)}
    assert held == {name: tools[name] for name in held}, "a pin that is no declared floor"
    assert pins == floors


def test_the_floors_job_runs_the_fast_tier_on_the_pins() -> None:
    script = (ROOT / ".ci" / "floors").read_text()
    assert "-c tests/floors.txt" in script
    assert '-m pytest "$@"' in script
    run = (ROOT / ".ci" / "run").read_text()
    assert "\n.ci/floors " in run


def test_distinct_on_renders_the_same_sql_on_the_installed_sqlalchemy(engine: Engine) -> None:
    jobs = table("job", column("id"), column("singleton_key"), column("created_on"))
    stmt = distinct_on(select(jobs.c.id), jobs.c.singleton_key).order_by(
        jobs.c.singleton_key, jobs.c.created_on
    )
    sql = str(stmt.compile(engine))
    assert " ".join(sql.split()) == (
        "SELECT DISTINCT ON (job.singleton_key) job.id FROM job "
        "ORDER BY job.singleton_key, job.created_on"
    )
