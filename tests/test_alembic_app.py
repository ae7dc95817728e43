"""docs/how-to/alembic.md, run: an application with its own Alembic environment.

Every ``$ alembic ...`` line of section A of the page is run, in order, in a throw-away
project (``python -m alembic``, in a subprocess) against a database created for the test
and dropped after it. The project is wired from the page itself: the keys of its
``alembic.ini`` block, its ``myapp/models.py`` and ``migrations/env.py`` blocks. Every
other Python block of the page is executed too, so the page cannot drift from the code.
"""

from __future__ import annotations

import configparser
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text

from alkstore_sa.migrations import VERSIONS_DIR

pytestmark = pytest.mark.docs_page  # docs/how-to/alembic.md, walked as its reader would

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "how-to" / "alembic.md"

MODELS = "# myapp/models.py"
ENV = "# migrations/env.py"
FROM_PYTHON = "# upgrade from Python"
OWN_FILTERS = "# env.py, with filters of your own"

# What the test adds to the page's models before "Later revisions" (step 6).
REFUNDS = """

class Refund(Base):
    __tablename__ = "refunds"

    id: Mapped[int] = mapped_column(primary_key=True)
"""


def _page() -> str:
    return DOC.read_text()


def _blocks(markdown: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", markdown, flags=re.S | re.M)


def _python_blocks() -> dict[str, str]:
    blocks = {block.splitlines()[0]: block for block in _blocks(_page(), "python")}
    # A block added to the page must be run here too.
    assert set(blocks) == {MODELS, ENV, FROM_PYTHON, OWN_FILTERS}, sorted(blocks)
    return blocks


def _section_a() -> str:
    page = _page()
    return page[page.index("## A. ") : page.index("\n## ", page.index("## A. ") + 1)]


def _commands() -> list[list[str]]:
    lines = [
        line.removeprefix("$ ")
        for block in _blocks(_section_a(), "console")
        for line in block.splitlines()
        if line.startswith("$ ")
    ]
    commands = []
    for line in lines:
        args = shlex.split(line, comments=True)
        assert args[0] == "alembic" and not {">", "|", "&&"} & set(args), line
        commands.append(args[1:])
    return commands


def _flat(output: str) -> str:
    """Alembic wraps its messages to the terminal width."""
    return " ".join(output.split())


def _package_files() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in VERSIONS_DIR.iterdir() if p.is_file()}


@pytest.fixture
def app_database(engine: Engine, database_url: str) -> Iterator[str]:
    """The URL of a database created for this test (the app's version table is its own)."""
    name = "alk_app_" + uuid.uuid4().hex[:12]
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(database_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@dataclass
class App:
    """The throw-away project, wired as the page says."""

    root: Path
    url: str
    log: list[str] = field(default_factory=list)

    @property
    def versions(self) -> Path:
        return self.root / "migrations" / "versions"

    def alembic(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "alembic", *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.log.append(f"$ alembic {shlex.join(args)}\n{done.stdout}{done.stderr}")
        if check:
            assert done.returncode == 0, "\n".join(self.log)
        return done

    def wire(self) -> None:
        """Step 2 and 3 of the page, on what ``alembic init`` generated."""
        (ini_block,) = _blocks(_page(), "ini")
        wanted = configparser.ConfigParser(interpolation=None)
        wanted.read_string(ini_block)
        ini = configparser.ConfigParser(interpolation=None)
        ini.read(self.root / "alembic.ini")
        for key, value in wanted["alembic"].items():
            ini["alembic"][key] = value
        ini["alembic"]["sqlalchemy.url"] = self.url.replace("%", "%%")
        with (self.root / "alembic.ini").open("w") as out:
            ini.write(out)
        blocks = _python_blocks()
        (self.root / "myapp").mkdir()
        (self.root / "myapp" / "__init__.py").write_text("")
        (self.root / "myapp" / "models.py").write_text(blocks[MODELS])
        (self.root / "migrations" / "env.py").write_text(blocks[ENV])

    def app_revisions(self) -> list[Path]:
        return sorted(self.versions.glob("*.py"))

    def query(self, sql: str) -> list[Any]:
        eng = create_engine(self.url)
        try:
            with eng.connect() as conn:
                return [row[0] for row in conn.execute(text(sql))]
        finally:
            eng.dispose()

    def tables(self, schema: str) -> set[str]:
        return set(self.query(f"SELECT tablename FROM pg_tables WHERE schemaname = '{schema}'"))

    def recorded(self) -> set[str]:
        return set(self.query("SELECT version_num FROM alembic_version"))


@pytest.fixture
def app(tmp_path: Path, app_database: str) -> Iterator[App]:
    before = set(_package_files())
    try:
        yield App(tmp_path, app_database)
    finally:
        # Should a broken guard let a revision into the package, remove it at once:
        # other tests load that folder too. The assertions above have failed already.
        for name in set(_package_files()) - before:
            (VERSIONS_DIR / name).unlink()


def _initialised(app: App) -> App:
    app.alembic("init", "migrations")
    app.wire()
    return app


def _declared(path: Path, name: str) -> Any:
    match = re.search(rf"^{name}(?:: [^=]+)? = (.+)$", path.read_text(), flags=re.M)
    assert match, f"{name} not found in {path}"
    return eval(match.group(1))


def test_the_pages_walkthrough_keeps_the_apps_revisions_in_the_apps_folder(app: App) -> None:
    package_before = _package_files()
    commands = _commands()
    assert commands[0] == ["init", "migrations"]
    made: list[Path] = []
    for args in commands:
        if args[0] == "revision" and "myapp@head" in args:
            # "Change your models, then ..." (step 6).
            with (app.root / "myapp" / "models.py").open("a") as models:
                models.write(REFUNDS)
        before = app.app_revisions()
        app.alembic(*args)
        if args[0] == "init":
            app.wire()
        elif args[0] == "revision":
            new = sorted(set(app.app_revisions()) - set(before))
            assert len(new) == 1, "\n".join(app.log)
            made += new
            # In the app's folder, never in the package's.
            assert _package_files() == package_before
        elif args[:2] == ["upgrade", "heads"]:
            assert {"job", "job_common", "queue", "version", "alkstore_job_attempt"} <= app.tables(
                "pgboss"
            )
            # The version table holds the heads: ours, and the app's latest.
            assert app.recorded() == {"alkstore_0046"} | {
                _declared(p, "revision") for p in made[-1:]
            }
            assert app.tables("public") == {"alembic_version", *["orders", "refunds"][: len(made)]}

    assert len(made) == 2, "\n".join(app.log)
    first, later = made
    # The first revision starts the app's own branch; the later one builds on it.
    assert _declared(first, "down_revision") is None
    assert _declared(first, "branch_labels") == ("myapp",)
    assert "op.create_table('orders'" in first.read_text()
    assert _declared(later, "down_revision") == _declared(first, "revision")
    assert "op.create_table('refunds'" in later.read_text()
    # The filters kept autogenerate away from the queue schema.
    for path in made:
        upgrade = path.read_text().split("def downgrade")[0]
        assert "pgboss" not in upgrade and "drop_" not in upgrade, upgrade
    # The page ends section A with "downgrade alkstore@base": only our branch went away.
    assert commands[-1][-2:] == ["downgrade", "alkstore@base"]
    assert app.query("SELECT count(*) FROM pg_namespace WHERE nspname = 'pgboss'") == [0]
    assert {"orders", "refunds"} <= app.tables("public")
    assert app.recorded() == {_declared(later, "revision")}
    assert _package_files() == package_before


def test_a_revision_that_would_land_in_the_package_is_refused_and_nothing_is_written(
    app: App,
) -> None:
    _initialised(app).alembic("upgrade", "heads")
    package_before = _package_files()
    # What the user of the bug report ran, and the same without autogenerate
    # (checked because the page sets revision_environment = true).
    for args in (
        ["revision", "--autogenerate", "-m", "create orders"],
        ["revision", "-m", "create orders"],
        ["revision", "--head", "base", "--version-path", str(VERSIONS_DIR), "-m", "x"],
    ):
        done = app.alembic(*args, check=False)
        assert done.returncode != 0
        said = _flat(done.stdout + done.stderr)
        assert "FAILED: the new revision" in said, said
        assert "--head base --branch-label myapp --version-path migrations/versions" in said
        assert "Traceback" not in said
    assert "build on alkstore_sa's revision 'alkstore_0046'" in _flat(app.log[-2])
    assert "be written into alkstore_sa's versions folder" in _flat(app.log[-1])
    assert _package_files() == package_before
    assert app.app_revisions() == []


def test_the_upgrade_from_python_block_installs_the_schema_it_names(app: App) -> None:
    _initialised(app)
    block = _python_blocks()[FROM_PYTHON]
    done = subprocess.run(
        [sys.executable, "-c", block], cwd=app.root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert {"job_common", "alkstore_job_attempt"} <= app.tables("jobs")
    assert app.recorded() == {"alkstore_0046"}


def test_the_own_filters_block_combines_the_users_filter_with_ours() -> None:
    namespace: dict[str, Any] = {}
    exec(_python_blocks()[OWN_FILTERS], namespace)
    options = namespace["alkstore_options"]
    assert sorted(options) == [
        "include_name",
        "include_object",
        "on_version_apply",
        "process_revision_directives",
    ]
    include_name = options["include_name"]
    assert include_name("legacy", "table", {"schema_name": None}) is False  # the user's
    assert include_name("pgboss", "schema", {}) is False  # ours
    assert include_name("orders", "table", {"schema_name": None}) is True
