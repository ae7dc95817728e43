"""``npm ci`` of one of the tests' npm projects, once, whichever processes ask at once.

Several pytest-xdist workers may need the same project at the same moment; two ``npm ci``
in one folder delete each other's ``node_modules``. An exclusive lock on a file beside the
project's ``package.json`` lets one install while the others wait, then find it done.
"""

from __future__ import annotations

import fcntl
import subprocess
from collections.abc import Callable
from pathlib import Path


def npm_ci(project: Path, installed: Callable[[], bool], *, timeout: float) -> None:
    """Run ``npm ci`` in ``project`` unless ``installed()`` says it is there already,
    asked again under the lock, so only the first of processes asking together installs."""
    if installed():
        return
    with (project / ".npm-ci.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if installed():
                return
            subprocess.run(
                ["npm", "ci", "--prefix", str(project), "--no-audit", "--no-fund"],
                check=True,
                capture_output=True,
                timeout=timeout,
            )
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
