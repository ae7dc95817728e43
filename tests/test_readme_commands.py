"""The README's two commands are the ones CI proves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    section = (ROOT / "README.md").read_text().split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", section, flags=re.S)]


def test_readme_gives_a_newcomer_two_commands_a_demo_and_the_tests() -> None:
    demo, tests = readme_commands()
    assert demo.endswith("&& alkstore demo")
    assert tests.endswith("&& python -m pytest")


def test_ci_runs_the_readme_test_command_before_installing_anything_else() -> None:
    _, tests = readme_commands()
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    installs = [i for i, line in enumerate(lines) if "pip install" in line]
    assert installs, ".ci/run installs nothing"
    assert lines[installs[0]] == tests


def test_tox_installs_the_extras_the_readme_names() -> None:
    _, tests = readme_commands()
    extras = set(re.search(r'"\.\[(.*?)\]"', tests).group(1).split(","))  # type: ignore[union-attr]
    tox = (ROOT / "tox.ini").read_text()
    testenv = tox.split("[testenv]", 1)[1].split("\n[", 1)[0]
    listed = set(re.search(r"extras =\n((?:    .*\n)+)", testenv).group(1).split())  # type: ignore[union-attr]
    assert listed == extras


def test_tox_installs_the_dependency_groups_the_readme_names() -> None:
    _, tests = readme_commands()
    groups = set(re.findall(r"--group (\S+)", tests))
    assert "test" in groups
    tox = (ROOT / "tox.ini").read_text()
    testenv = tox.split("[testenv]", 1)[1].split("\n[", 1)[0]
    listed = set(re.search(r"dependency_groups =\n((?:    .*\n)+)", testenv).group(1).split())  # type: ignore[union-attr]
    assert listed == groups


def test_the_readme_installs_a_pip_that_knows_dependency_groups_first() -> None:
    """``pip install --group`` needs pip 25.1; an older pip stops at the unknown option."""
    _, tests = readme_commands()
    steps = [step.strip() for step in tests.split("&&")]
    assert steps[0] == 'python -m pip install -U "pip>=25.1"'
    assert "--group test" in steps[1]
