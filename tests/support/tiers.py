"""Which tier a test runs in, and the CI rule on skips (docs/development.md, "Running the tests").

- The **fast tier** is the README's ``python -m pytest``: ``pyproject.toml`` adds
  ``-m "not slow"``. It touches every module and every public operation.
- The **slow tier** is ``python -m pytest -m slow``: everything else. CI runs both, so every
  test runs in one of them.

A test is slow when it carries ``@pytest.mark.slow`` itself, or when :func:`slow_reason`
finds one of the kinds below and the test is not marked ``smoke`` (the few representatives
of a slow kind that the fast tier keeps: one Node round trip each way per schema version,
one browser test, the README's and the quickstart's examples...).
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

SLOW_KINDS: dict[str, str] = {
    "interop": "starts Node pg-boss",
    "chaos": "kills, freezes and disconnects worker processes",
    "browser": "drives a headless Chromium",
    "subprocess": "runs the CLI or an app in a child process",
    "docs_page": "runs a docs page's examples",
    "packaging": "builds the wheel",
}
"""Markers that put a test in the slow tier unless it is also marked ``smoke``."""

ASYNC_DOUBLED = ("env", "env46", "env46_or_split")
"""Fixtures that run a service test once per flavour. The async service is generated from
the sync one and runs the same operation code, so the fast tier runs the sync half, the async
half of :data:`ASYNC_IN_FAST_TIER`, and ``test_async_service_smoke.py``, which calls every
async method once; the slow tier runs the rest of the async half."""

ASYNC_IN_FAST_TIER = frozenset({"test_send.py", "test_policies.py"})
"""Modules whose async half stays in the fast tier: the driver's branches for savepoints
and conflicts (``ops.driver.arun``) on the operations every application calls."""


SPLIT_DOUBLED = ("env46_or_split",)
"""Fixtures that run a service test once more with ``noMultiMutationCte`` forced (its fails,
expiry, flows and redrive as separate statements), and once more under the ``cockroachdb``
profile on a schema built for it: those doubles run in the slow tier, and the fast tier keeps
the flags' own tests (``test_backends.py``, ``test_backend_schemas.py``)."""


def slow_reason(item: pytest.Item) -> str | None:
    """Why ``item`` belongs to the slow tier, or ``None``."""
    if item.get_closest_marker("smoke") is not None:
        return None
    for kind, why in SLOW_KINDS.items():
        if item.get_closest_marker(kind) is not None:
            return why
    callspec = getattr(item, "callspec", None)
    if callspec is None or item.path.name in ASYNC_IN_FAST_TIER:
        return None
    if any(callspec.params.get(name) == "async" for name in ASYNC_DOUBLED):
        return "the async double of a service test"
    if any(callspec.params.get(name) == "split" for name in SPLIT_DOUBLED):
        return "the noMultiMutationCte double of a service test"
    if any(callspec.params.get(name) == "cockroachdb" for name in SPLIT_DOUBLED):
        return "the cockroachdb-profile double of a service test"
    return None


NODE_FIXTURES = frozenset({"node_modules", "node46_modules"})
"""Fixtures that install Node pg-boss: a test using one (directly or through another fixture)
is an ``interop`` test whether or not it says so, so ``-m "not interop"`` never needs Node."""


def mark_tiers(items: Iterable[pytest.Item]) -> None:
    """Mark Node users ``interop``, then every item :func:`slow_reason` finds ``slow``."""
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if uses & NODE_FIXTURES and item.get_closest_marker("interop") is None:
            item.add_marker(pytest.mark.interop)
        if slow_reason(item) is not None:
            item.add_marker(pytest.mark.slow)


ALLOWED_SKIPS: frozenset[str] = frozenset()
"""Node ids of tests allowed to skip under CI. Empty: CI installs everything the tests need,
and ``support.skips.unavailable`` already fails there; this catches any other skip."""


def without_profile_double(item: pytest.Item) -> bool:
    """Whether ``item`` is the ``cockroachdb`` double of a test marked ``postgres_only``
    (partitioned queues or LISTEN/NOTIFY, which that profile does not have): not run."""
    callspec = getattr(item, "callspec", None)
    if callspec is None or item.get_closest_marker("postgres_only") is None:
        return False
    return any(callspec.params.get(name) == "cockroachdb" for name in SPLIT_DOUBLED)


def unexpected_skips(skipped: Iterable[str]) -> list[str]:
    """The skipped node ids that are not on :data:`ALLOWED_SKIPS`."""
    return sorted(set(skipped) - ALLOWED_SKIPS)
