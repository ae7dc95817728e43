"""The package's import structure: no cycles, and no module importing one above it.

Every module of ``alkstore_sa`` is read with ``ast`` (nothing is imported): its
imports at the top and inside functions, relative ones resolved, ``from pkg
import module`` counted as importing that module. The graph must have no loop
(a strongly connected component of more than one module, or a module importing
itself) and no upward edge between the layers declared below, bottom first.
A new module belongs to a layer before this test passes.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from support.source import parsed

PACKAGE = Path(__file__).resolve().parent.parent / "alkstore_sa"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # (what the layer is, its modules or packages), bottom first. A module may
    # import any module of its own layer or of a layer below.
    (
        "foundations",
        (
            "alkstore_sa._version",
            "alkstore_sa._extras",
            "alkstore_sa.schema_versions",
            "alkstore_sa.names",
            "alkstore_sa.clock",
            "alkstore_sa.limits",
            "alkstore_sa.steps",
            "alkstore_sa.tracing",
            "alkstore_sa.errors",
            "alkstore_sa.versions",
            "alkstore_sa._pooler",
            "alkstore_sa.backends",
            "alkstore_sa._hosts",
        ),
    ),
    ("models", ("alkstore_sa.models",)),
    (
        "values",
        (
            "alkstore_sa.options",
            "alkstore_sa.records",
            "alkstore_sa.cron",
            "alkstore_sa.rrule",
            "alkstore_sa.groups",
            "alkstore_sa._humanize",
        ),
    ),
    ("statements shared by the versions", ("alkstore_sa.sql", "alkstore_sa.sql.common")),
    ("statements at schema 26", ("alkstore_sa.sql.v26",)),
    ("statements at schema 46", ("alkstore_sa.sql.v46",)),
    ("each version's statement set", ("alkstore_sa.sql.statements",)),
    ("migrations", ("alkstore_sa.migrations",)),
    ("operations", ("alkstore_sa.ops",)),
    (
        "schema and engine upkeep",
        (
            "alkstore_sa.schema_record",
            "alkstore_sa.schema_health",
            "alkstore_sa.migrate",
            "alkstore_sa.alembic_filters",
            "alkstore_sa._engine_cache",
        ),
    ),
    (
        "services",
        (
            "alkstore_sa.service",
            "alkstore_sa.service_async",
            "alkstore_sa.metrics",
            "alkstore_sa.supervision",
            "alkstore_sa._embedded",
        ),
    ),
    (
        "workers, dashboard and HTTP API",
        ("alkstore_sa.worker", "alkstore_sa._web", "alkstore_sa.dashboard", "alkstore_sa.api"),
    ),
    (
        "entry points",
        ("alkstore_sa.cli", "alkstore_sa.testing", "alkstore_sa", "alkstore_sa.__main__"),
    ),
]

KNOWN_CYCLES: list[frozenset[str]] = [
    # (the modules of a loop): why it stays. None today.
]

KNOWN_UPWARD: dict[tuple[str, str], str] = {
    # (importer, imported): why the edge runs up. None today.
}


# ------------------------------------------------------------------ reading the package


def modules(package: Path) -> dict[str, tuple[Path, bool]]:
    """Every module under ``package``: dotted name -> (file, is a package's ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def imports_of(name: str, path: Path, is_package: bool, known: Mapping[str, object]) -> set[str]:
    """The modules of ``known`` that module ``name`` imports, anywhere in its text."""
    here = name if is_package else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(parsed(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                # ``import a.b.c``: the deepest of a.b.c, a.b, a that is a module.
                for size in range(len(parts), 0, -1):
                    if ".".join(parts[:size]) in known:
                        found.add(".".join(parts[:size]))
                        break
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in known:
                    found.add(f"{target}.{alias.name}")  # from pkg import module
                elif target in known:
                    found.add(target)
    return found


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports."""
    known = modules(package)
    return {name: imports_of(name, *where, known) for name, where in known.items()}


# ------------------------------------------------------------------ the checks


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The loops of ``graph``: each strongly connected component of more than one
    module, and each module importing itself; every loop sorted, and the list too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        # Tarjan's algorithm, iteratively (no recursion limit on a long chain).
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for succ in edges:
                if succ not in index:
                    index[succ] = low[succ] = len(index)
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def layer_of(module: str, layers: Sequence[tuple[str, tuple[str, ...]]]) -> int | None:
    """The index of the layer naming ``module`` or the closest package holding it
    (a top-level package named in a layer stands for its ``__init__`` only)."""
    best: tuple[int, int] | None = None  # (length of the name matched, layer)
    for at, (_, members) in enumerate(layers):
        for member in members:
            holds = "." in member and module.startswith(member + ".")
            if (module == member or holds) and (best is None or len(member) > best[0]):
                best = (len(member), at)
    return None if best is None else best[1]


def problems(
    graph: Mapping[str, Iterable[str]],
    layers: Sequence[tuple[str, tuple[str, ...]]],
    known_cycles: Iterable[frozenset[str]] = (),
    known_upward: Mapping[tuple[str, str], str] | None = None,
) -> list[str]:
    """What is wrong with ``graph``, one readable line each: loops, modules in no
    layer, imports running up the layers (the known exceptions left out)."""
    allowed = set(known_cycles)
    upward_allowed = known_upward or {}
    out = []
    for loop in cycles(graph):
        if frozenset(loop) not in allowed:
            ties = [f"{a} -> {b}" for a in loop for b in sorted(graph.get(a, ())) if b in loop]
            out.append(f"import cycle of {len(loop)}: {', '.join(loop)} ({'; '.join(ties)})")
    for module in sorted(graph):
        if layer_of(module, layers) is None:
            out.append(f"module in no layer: {module} (add it to LAYERS)")
    for module in sorted(graph):
        at = layer_of(module, layers)
        for imported in sorted(graph[module]):
            to = layer_of(imported, layers)
            if at is None or to is None or to <= at or (module, imported) in upward_allowed:
                continue
            out.append(
                f"upward import: {module} ({layers[at][0]}) imports {imported} ({layers[to][0]})"
            )
    return out


# ------------------------------------------------------------------ the tests


def test_the_package_has_no_import_cycle_and_no_upward_import() -> None:
    graph = import_graph(PACKAGE)
    assert "alkstore_sa.ops.frame" in graph["alkstore_sa.ops.supervision"]  # the graph is read
    found = problems(graph, LAYERS, KNOWN_CYCLES, KNOWN_UPWARD)
    assert found == [], "\n".join(found)


def test_the_known_exceptions_are_still_needed() -> None:
    # An exception the code no longer needs is deleted, not kept as a loophole.
    graph = import_graph(PACKAGE)
    loops = {frozenset(loop) for loop in cycles(graph)}
    assert [sorted(c) for c in KNOWN_CYCLES if c not in loops] == []
    assert [edge for edge in KNOWN_UPWARD if edge[1] not in graph.get(edge[0], ())] == []


def test_the_checker_reports_a_cycle_and_an_upward_import() -> None:
    layers = [("low", ("pkg.low",)), ("high", ("pkg.high", "pkg"))]
    graph = {
        "pkg.low.a": {"pkg.low.b"},
        "pkg.low.b": {"pkg.low.c"},
        "pkg.low.c": {"pkg.low.a", "pkg.high.x"},  # closes a loop; runs up
        "pkg.low.d": {"pkg.low.d"},  # imports itself
        "pkg.high.x": set(),
        "pkg.high.y": {"pkg.low.a", "pkg.high.x"},  # down, and within its layer: fine
        "pkg.other": set(),  # "pkg" places the package's __init__, not all of it
        "pkg": {"pkg.high.y"},
    }
    assert cycles(graph) == [["pkg.low.a", "pkg.low.b", "pkg.low.c"], ["pkg.low.d"]]
    assert problems(graph, layers) == [
        "import cycle of 3: pkg.low.a, pkg.low.b, pkg.low.c "
        "(pkg.low.a -> pkg.low.b; pkg.low.b -> pkg.low.c; pkg.low.c -> pkg.low.a)",
        "import cycle of 1: pkg.low.d (pkg.low.d -> pkg.low.d)",
        "module in no layer: pkg.other (add it to LAYERS)",
        "upward import: pkg.low.c (low) imports pkg.high.x (high)",
    ]
    # Listed exceptions are left out, and only those.
    known = [frozenset({"pkg.low.a", "pkg.low.b", "pkg.low.c"})]
    upward = {("pkg.low.c", "pkg.high.x"): "a test"}
    assert problems(graph, layers, known, upward) == [
        "import cycle of 1: pkg.low.d (pkg.low.d -> pkg.low.d)",
        "module in no layer: pkg.other (add it to LAYERS)",
    ]


def test_imports_are_read_wherever_they_stand(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import sub\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "one.py").write_text(
        "import pkg.two\n"
        "from .. import three\n"
        "def later():\n"
        "    from .four import NAME\n"
        "    from pkg.sub import five\n"
    )
    for name in ("two", "three"):
        (pkg / f"{name}.py").write_text("")
    (pkg / "sub" / "four.py").write_text("NAME = 1\n")
    (pkg / "sub" / "five.py").write_text("import os\n")
    graph = import_graph(pkg)
    assert graph["pkg"] == {"pkg.sub"}
    assert graph["pkg.sub.one"] == {"pkg.two", "pkg.three", "pkg.sub.four", "pkg.sub.five"}
    assert graph["pkg.sub.five"] == set()  # the standard library is not the package's


# ------------------------------------------------------------------ booleans by keyword

POSITIONAL_BOOLS = {
    # (module file, function): why a bool stays positional there.
    ("alembic_filters.py", "include_object"): "Alembic calls the hook with positional arguments",
    ("dashboard/_serve.py", "check_bind"): "public since the dashboard shipped",
    ("metrics.py", "failed"): "the worker metrics hook's signature, which users implement",
}


def positional_bools(package: Path) -> list[tuple[str, str, str]]:
    """Every ``bool`` parameter that can be passed by position: (file, function, name)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = parsed(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for arg in node.args.posonlyargs + node.args.args:
                    annotation = arg.annotation
                    if isinstance(annotation, ast.Name) and annotation.id == "bool":
                        found.append((path.relative_to(package).as_posix(), node.name, arg.arg))
    return found


def test_booleans_are_passed_by_keyword() -> None:
    """A call reads ``fetch(..., priority=True)``, never ``fetch(..., True)``."""
    loose = [f for f in positional_bools(PACKAGE) if (f[0], f[1]) not in POSITIONAL_BOOLS]
    assert loose == []
    assert all(
        (f, fn) in {(a, b) for a, b, _ in positional_bools(PACKAGE)} for f, fn in POSITIONAL_BOOLS
    )


def test_a_positional_bool_is_found(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f(a: int, flag: bool) -> None: ...\n", encoding="utf-8")
    assert positional_bools(tmp_path) == [("m.py", "f", "flag")]
