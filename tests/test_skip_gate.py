"""A module that cannot run here is skipped whole locally, and fails the run under CI."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parent.parent

MODULE = """
from support.skips import require_module

require_module("alkstore_no_such_module", "a tool this machine lacks")


def test_never_runs() -> None:
    raise AssertionError("a module whose tool is missing must not run")
"""


def run(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    test = ROOT / "tests" / f"test_gate_probe_{os.getpid()}_{int(ci)}.py"
    test.write_text(MODULE)
    try:
        env = {k: v for k, v in os.environ.items() if k != "CI"}
        if ci:
            env["CI"] = "true"
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(test),
                "-n0",
                "-p",
                "no:cacheprovider",
                "-o",
                "addopts=",
                "--rootdir",
                str(ROOT),
                "-c",
                str(ROOT / "pyproject.toml"),
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        test.unlink()


def test_a_missing_tool_skips_the_module_locally(tmp_path: Path) -> None:
    done = run(tmp_path, ci=False)
    # 5: no test ran (the only module was skipped); a collection error would be 2.
    assert done.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, done.stdout + done.stderr
    assert "1 skipped" in done.stdout


def test_a_missing_tool_fails_the_run_under_ci(tmp_path: Path) -> None:
    done = run(tmp_path, ci=True)
    assert done.returncode != 0, done.stdout + done.stderr
    assert "cannot run under CI: a tool this machine lacks" in done.stdout
