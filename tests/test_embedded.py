"""The embedded PostgreSQL of the demo and the tests cleans up after itself."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support.skips import require_module

require_module("pgserver", "the embedded extra's server")

SCRIPT = """
import sqlalchemy as sa
from alkstore_sa._embedded import embedded_postgres

with embedded_postgres("alkstore-probe-") as url:
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        print(conn.execute(sa.text("SELECT 40 + 2")).scalar_one())
    engine.dispose()
"""


def test_embedded_server_warns_nothing_and_leaves_nothing_in_the_temp_folder(
    tmp_path: Path,
) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    environ["TMPDIR"] = str(tmp_path)
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
    assert list(tmp_path.iterdir()) == []
