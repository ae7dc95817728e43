"""One rule for tests that cannot run here: skip locally, fail under ``CI=true``.

A developer without Node, Chromium or the embedded server gets a skip that says what is
missing; CI, which installs all of them (``.ci/run``), must not pass by not running a test.
``tests/conftest.py`` also fails a CI run on any skip not on its allow-list, so a skip that
does not come through here cannot hide there either.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import NoReturn

import pytest


def under_ci() -> bool:
    """Whether this run is CI's (``CI=true``, as ``.ci/run`` and most CI services set)."""
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> NoReturn:
    """Skip the test saying ``reason``; under CI, fail it instead."""
    if under_ci():
        pytest.fail(f"cannot run under CI: {reason}")
    # allow_module_level: a module may call this at import, and its tests are skipped
    # (without it pytest reports a collection error instead).
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, why: str) -> ModuleType:
    """Import ``name``, or :func:`unavailable` saying ``why`` it is needed."""
    try:
        return importlib.import_module(name)
    except ImportError:
        unavailable(f"{why}: {name} is not installed")
