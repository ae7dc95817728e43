"""The public API names only public types, and every public name is documented.

A class named in a public signature (parameter or return, through unions,
generics, ``Unpack`` and ``Callable``) is either Python's, SQLAlchemy's, or
exported from ``alkstore_sa``. A testing helper may also name a type of
``alkstore_sa.testing``, where users import it from. Every name in
``alkstore_sa.__all__`` has its own docstring and is listed in
docs/reference/api.md.
"""

from __future__ import annotations

import ast
import inspect
import re
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.source import parsed

import alkstore_sa
import alkstore_sa.testing as testing
from alkstore_sa import AsyncQueueService, AsyncWorker, QueueService, Worker

ROOT = Path(__file__).resolve().parent.parent
API_DOC = (ROOT / "docs" / "reference" / "api.md").read_text()


def public_callables(owner: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The constructor, public methods and property getters of ``owner``."""
    for name, value in inspect.getmembers(owner):
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(inspect.getattr_static(owner, name), property):
            yield name, inspect.getattr_static(owner, name).fget
        elif inspect.isfunction(value) or inspect.ismethod(value):
            yield name, value


def signatures() -> Iterator[tuple[str, Callable[..., Any], tuple[Any, ...]]]:
    """(label, callable, where its types may be exported) for the whole public API."""
    for owner in (QueueService, AsyncQueueService, Worker, AsyncWorker):
        for name, func in public_callables(owner):
            yield f"{owner.__name__}.{name}", func, (alkstore_sa,)
    # What an exported class offers is public too (Worker.listener's Listener...).
    walked = (QueueService, AsyncQueueService, Worker, AsyncWorker)
    for export in alkstore_sa.__all__:
        owner = getattr(alkstore_sa, export)
        if inspect.isclass(owner) and owner not in walked and not issubclass(owner, Exception):
            for name, func in public_callables(owner):
                yield f"{export}.{name}", func, (alkstore_sa,)
    for name in testing.__all__:
        value = getattr(testing, name)
        if inspect.isclass(value):
            for member, func in public_callables(value):
                yield f"testing.{name}.{member}", func, (alkstore_sa, testing)
        elif callable(value):
            yield f"testing.{name}", value, (alkstore_sa, testing)


SIGNATURES = {label: (func, homes) for label, func, homes in signatures()}


def named_classes(hint: Any) -> Iterator[type]:
    """Every class a type hint names, through unions, generics, Unpack, Callable, Literal."""
    if typing.get_origin(hint) is typing.Literal:
        return
    origin = typing.get_origin(hint)
    if origin is not None:
        if isinstance(origin, type):
            yield origin
        for arg in typing.get_args(hint):
            yield from named_classes(arg)
    elif isinstance(hint, list | tuple):  # Callable's parameter list
        for arg in hint:
            yield from named_classes(arg)
    elif isinstance(hint, type):
        yield hint


def is_foreign(cls: type) -> bool:
    """Python's own (builtins, stdlib) or SQLAlchemy's: public by their own rules."""
    module = cls.__module__.split(".")[0]
    return module != "alkstore_sa"


def exported(cls: type, homes: tuple[Any, ...]) -> bool:
    return any(
        cls.__name__ in getattr(home, "__all__", ()) and getattr(home, cls.__name__) is cls
        for home in homes
    )


@pytest.mark.parametrize("label", sorted(SIGNATURES))
def test_public_signature_names_only_exported_types(label: str) -> None:
    func, homes = SIGNATURES[label]
    hints = typing.get_type_hints(func, include_extras=True)
    leaked = sorted(
        f"{cls.__module__}.{cls.__qualname__}"
        for hint in hints.values()
        for cls in named_classes(hint)
        if not is_foreign(cls) and not exported(cls, homes)
    )
    assert leaked == [], f"{label} names types that are not exported: {leaked}"


def test_the_walk_finds_the_settle_types() -> None:
    # Guards the walk itself: it must see through Sequence[... | tuple[...] | X].
    hints = typing.get_type_hints(QueueService.complete_many)
    assert alkstore_sa.Settlement in set(named_classes(hints["items"]))
    hints = typing.get_type_hints(QueueService.send_after, include_extras=True)
    assert alkstore_sa.TimedSendOptions in set(named_classes(hints["options"]))


def own_docstring(value: Any) -> str:
    """The docstring written for ``value`` itself (not inherited nor generated)."""
    if inspect.isclass(value):
        doc = value.__dict__.get("__doc__") or ""
        # A dataclass without a docstring gets its signature as one.
        return "" if doc.startswith(f"{value.__name__}(") else doc
    return getattr(value, "__doc__", None) or ""


def attribute_docstrings(module: Any) -> dict[str, str]:
    """Module constants documented by a string right after their assignment."""
    tree = parsed(inspect.getsource(module))
    docs: dict[str, str] = {}
    for before, after in zip(tree.body, tree.body[1:], strict=False):
        if (
            isinstance(before, ast.Assign | ast.AnnAssign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            targets = before.targets if isinstance(before, ast.Assign) else [before.target]
            for target in targets:
                if isinstance(target, ast.Name):
                    docs[target.id] = after.value.value
    return docs


@pytest.mark.parametrize("name", sorted(alkstore_sa.__all__))
def test_every_export_has_a_docstring(name: str) -> None:
    value = getattr(alkstore_sa, name)
    if inspect.isclass(value) or callable(value):
        assert own_docstring(value).strip(), f"alkstore_sa.{name} has no docstring"
    else:
        from alkstore_sa import names, schema_versions

        assert getattr(names, name, None) is value, f"where is {name} defined?"
        # names hands the schema versions on from schema_versions, where they are written.
        written = attribute_docstrings(names) | attribute_docstrings(schema_versions)
        assert written.get(name, "").strip(), f"{name} has no docstring"


DIRECTIVES = set(re.findall(r"^<!-- api: (\S+) -->$", API_DOC, re.MULTILINE))
"""The objects docs/reference/api.md renders (tools/gen_api_docs.py; tests/test_api_docs.py
holds that each is rendered fresh)."""


@pytest.mark.parametrize("name", sorted(alkstore_sa.__all__))
def test_every_export_is_listed_in_the_api_reference(name: str) -> None:
    # Its own entry, or its whole module rendered (the errors).
    module = getattr(getattr(alkstore_sa, name), "__module__", None)
    assert f"alkstore_sa.{name}" in DIRECTIVES or module in DIRECTIVES, f"{name} not in api.md"


@pytest.mark.parametrize(
    "name", sorted(n for n in testing.__all__ if inspect.isclass(getattr(testing, n)))
)
def test_testing_types_are_documented(name: str) -> None:
    assert own_docstring(getattr(testing, name)).strip()
    assert "alkstore_sa.testing" in DIRECTIVES


FAMILIES: dict[Any, list[str]] = {
    alkstore_sa.Settled: [
        "complete",
        "complete_many",
        "cancel",
        "resume",
        "retry",
        "delete_job",
        "delete_jobs",
    ],
    alkstore_sa.FailResult: ["fail", "fail_many"],
    int: ["delete_queued_jobs", "delete_stored_jobs", "delete_all_jobs"],
    alkstore_sa.SupervisionReport: ["supervise"],
}


@pytest.mark.parametrize("service", [QueueService, AsyncQueueService])
@pytest.mark.parametrize(
    ("returns", "name"), [(kind, name) for kind, names in FAMILIES.items() for name in names]
)
def test_each_family_of_calls_returns_one_type(service: type, returns: Any, name: str) -> None:
    assert typing.get_type_hints(getattr(service, name))["return"] is returns


def test_a_fail_result_is_a_settled() -> None:
    # fail's result reads like every other settle result, and more.
    assert issubclass(alkstore_sa.FailResult, alkstore_sa.Settled)
