"""QueueService and AsyncQueueService offer the same API, and the async one is
exactly what ``tools/gen_async.py`` generates from the sync one."""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from alkstore_sa import AsyncQueueService, QueueService

ROOT = Path(__file__).resolve().parent.parent


def public_members(cls: type) -> dict[str, Any]:
    return {name: value for name, value in vars(cls).items() if not name.startswith("_")}


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_async", ROOT / "tools" / "gen_async.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_services_have_the_same_public_names() -> None:
    assert sorted(public_members(QueueService)) == sorted(public_members(AsyncQueueService))


@pytest.mark.parametrize("name", sorted(public_members(QueueService)))
def test_each_method_has_the_same_signature(name: str) -> None:
    sync = public_members(QueueService)[name]
    other = public_members(AsyncQueueService)[name]
    if isinstance(sync, property):
        assert isinstance(other, property)
        sync, other = sync.fget, other.fget
    assert inspect.signature(sync) == inspect.signature(other)
    assert (sync.__doc__ or "").strip() and (other.__doc__ or "").strip(), "undocumented"


@pytest.mark.parametrize(
    "name",
    sorted(n for n, v in public_members(QueueService).items() if inspect.isfunction(v)),
)
def test_async_methods_are_coroutines_and_sync_ones_are_not(name: str) -> None:
    assert not inspect.iscoroutinefunction(getattr(QueueService, name))
    assert inspect.iscoroutinefunction(getattr(AsyncQueueService, name))


def test_constructors_take_the_same_arguments() -> None:
    sync = inspect.signature(QueueService.__init__).parameters
    other = inspect.signature(AsyncQueueService.__init__).parameters
    assert list(sync) == list(other)
    assert [p.default for p in sync.values()] == [p.default for p in other.values()]


def test_async_service_is_up_to_date_with_the_generator() -> None:
    generator = load_generator()
    expected = generator.convert(generator.SOURCE.read_text())
    assert generator.TARGET.read_text() == expected, "run: python tools/gen_async.py"


def test_generator_check_mode_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    generator = load_generator()
    monkeypatch.setattr("sys.argv", ["gen_async.py", "--check"])
    assert generator.main() == 0


@pytest.mark.parametrize(
    "gone",
    ["def _check_version(", "self._read_version()", "time.sleep(MIGRATION_WAIT)"],
)
def test_a_rule_that_stops_matching_stops_the_generator(gone: str) -> None:
    """The sync service changing under a rule (here: its text renamed away) is an
    error, not an async twin that silently keeps the sync code."""
    generator = load_generator()
    source = generator.SOURCE.read_text()
    assert gone in source
    with pytest.raises(generator.RuleUnused, match="matches nothing"):
        generator.convert(source.replace(gone, gone.replace("_", "__", 1).replace(".", "..")))


def test_a_call_of_run_the_rules_would_leave_bare_stops_the_generator() -> None:
    """Every ``self._run(`` of the async twin is awaited: a call the rules do not
    rewrite (here one not building its operation from ``ops``) is an error, not a
    method that hands its caller a coroutine."""
    generator = load_generator()
    source = generator.SOURCE.read_text()
    call = "return self._run(ops.delete_queue("
    assert call in source
    with pytest.raises(RuntimeError, match="not awaited"):
        generator.convert(
            source.replace(call, "op = ops.delete_queue\n        return self._run(op(")
        )
