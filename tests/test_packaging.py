"""The wheel holds the package users need, typed, licensed, and nothing else."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (built,) = out.glob("alkstore_sa-*.whl")
    return zipfile.ZipFile(built)


def metadata(wheel: zipfile.ZipFile) -> list[tuple[str, str]]:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return list(Parser().parsestr(wheel.read(name).decode()).items())


def test_wheel_ships_only_the_package_and_its_metadata(wheel: zipfile.ZipFile) -> None:
    tops = {name.split("/", 1)[0] for name in wheel.namelist()}
    assert tops == {"alkstore_sa", f"alkstore_sa-{_version(wheel)}.dist-info"}


def test_wheel_ships_the_migrations_and_their_template(wheel: zipfile.ZipFile) -> None:
    names = set(wheel.namelist())
    assert "alkstore_sa/migrations/env.py" in names
    assert "alkstore_sa/migrations/script.py.mako" in names
    assert any(n.startswith("alkstore_sa/migrations/versions/alkstore_") for n in names)


def test_wheel_is_marked_typed_for_type_checkers(wheel: zipfile.ZipFile) -> None:
    assert "alkstore_sa/py.typed" in wheel.namelist()


def test_wheel_carries_the_mit_license(wheel: zipfile.ZipFile) -> None:
    (license_file,) = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert wheel.read(license_file).decode().startswith("MIT License")
    assert ("License-Expression", "MIT") in metadata(wheel)


def test_psycopg_implementation_is_the_applications_choice(wheel: zipfile.ZipFile) -> None:
    requires = [value for key, value in metadata(wheel) if key == "Requires-Dist"]
    unconditional = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("psycopg>=") for r in unconditional)
    assert not any("binary" in r for r in unconditional)
    assert any(
        r.startswith("psycopg[binary]") and r.replace('"', "'").endswith("extra == 'binary'")
        for r in requires
    )


def _version(wheel: zipfile.ZipFile) -> str:
    return dict(metadata(wheel))["Version"]


def test_wheel_metadata_is_what_pypi_shows(wheel: zipfile.ZipFile) -> None:
    from alkstore_sa import __version__

    fields = metadata(wheel)
    classifiers = {value for key, value in fields if key == "Classifier"}
    assert {
        "Typing :: Typed",
        "Framework :: AsyncIO",
        "Programming Language :: Python :: 3.11",
    } <= classifiers
    assert any(c.startswith("Development Status :: ") for c in classifiers)
    # Only the Python versions CI runs are claimed.
    claimed = {c.rsplit(" :: ", 1)[1] for c in classifiers if c.count("::") == 2 and "3." in c}
    assert claimed == {"3.11"}
    urls = {value.split(",", 1)[0] for key, value in fields if key == "Project-URL"}
    assert {"Homepage", "Documentation", "Repository", "Changelog", "Issues"} <= urls
    assert dict(fields)["Version"] == __version__
    assert dict(fields).get("Author") or dict(fields).get("Author-email")
    assert dict(fields).get("Keywords")


def test_development_tools_are_not_published_as_extras(wheel: zipfile.ZipFile) -> None:
    extras = {value for key, value in metadata(wheel) if key == "Provides-Extra"}
    assert extras == {"binary", "embedded", "metrics", "otel", "dashboard", "api"}


def test_the_cli_reports_the_wheels_version(wheel: zipfile.ZipFile) -> None:
    for command in (["alkstore"], [sys.executable, "-m", "alkstore_sa"]):
        done = subprocess.run(
            [*command, "--version"], capture_output=True, text=True, timeout=60, check=True
        )
        assert done.stdout.strip() == f"alkstore {_version(wheel)}"
