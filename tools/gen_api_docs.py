"""Write the API reference (docs/reference/api.md) from the docstrings.

The page is committed, so it reads on GitHub, in an editor or in the wheel's source without
building anything. Its hand-written parts stay as they are; each line

    <!-- api: alkstore_sa.QueueService -->

is followed by that object's generated reference, up to the next ``<!-- /api -->``, which
this tool rewrites: the signature, the docstring turned from the reST our docstrings use into
Markdown, and, for a class, each public method and property; for a module, its public names.
Between ``<!-- api-index -->`` and ``<!-- /api-index -->`` it writes the page's index: a link
to each section, to each object of the section, and to each method of a class or name of a
module, so that a reader finds any name in two clicks.

    python tools/gen_api_docs.py           # rewrite the page
    python tools/gen_api_docs.py --check   # exit 1 if the page is not what it would write

``tests/test_api_docs.py`` fails when the committed page is stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib
import inspect
import re
import sys
import textwrap
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reference" / "api.md"
OPEN = re.compile(r"^<!-- api: (?P<target>[\w.]+) -->$")
CLOSE = "<!-- /api -->"
INDEX_OPEN = "<!-- api-index -->"
INDEX_CLOSE = "<!-- /api-index -->"
_HEADING = re.compile(r"^(?P<level>#{2,4}) (?P<text>.+?)\s*$")

_ROLE = re.compile(r":(?:class|func|meth|data|attr|mod|exc|obj):`(?P<tilde>~?)(?P<target>[^`]+)`")
_BORDER = re.compile(r"\s*=+( +=+)+\s*")
_FIELD = re.compile(
    r"^:(?P<kind>param|ivar|raises|returns|return|type|rtype)\s*(?P<name>[^:]*):\s*(?P<text>.*)$"
)


# ------------------------------------------------------------------ docstrings


def _role(match: re.Match[str]) -> str:
    target = match.group("target")
    if match.group("tilde"):
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _inline(text: str) -> str:
    """reST inline markup as Markdown: roles and ````literals```` as code."""
    text = _ROLE.sub(_role, text)
    return re.sub(r"``(.+?)``", r"`\1`", text)


def _blocks(lines: list[str]) -> Iterator[tuple[str, list[str]]]:
    """Split a docstring into ("text" | "code" | "table" | "field", lines) blocks."""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i].strip())
                i += 1
            yield "pycon", block
            continue
        if _BORDER.fullmatch(line):  # a reST simple table: three border lines
            block, borders = [], 0
            while i < len(lines) and borders < 3:
                borders += bool(_BORDER.fullmatch(lines[i]))
                block.append(lines[i])
                i += 1
            yield "table", block
            continue
        if _FIELD.match(line):
            block = [line]
            i += 1
            while i < len(lines) and lines[i].startswith((" ", "\t")) and lines[i].strip():
                block.append(lines[i].strip())
                i += 1
            yield "field", block
            continue
        block = []
        while i < len(lines) and lines[i].strip() and not _FIELD.match(lines[i]):
            if lines[i].lstrip().startswith(">>>") or _BORDER.fullmatch(lines[i]):
                break
            block.append(lines[i])
            i += 1
        if block and block[-1].rstrip().endswith("::"):
            yield "text", block
            j = i
            while j < len(lines) and not lines[j].strip():
                j += 1
            code = []
            while j < len(lines) and (not lines[j].strip() or lines[j].startswith((" ", "\t"))):
                code.append(lines[j])
                j += 1
            while code and not code[-1].strip():
                code.pop()
            yield "python", textwrap.dedent("\n".join(code)).splitlines()
            i = j
            continue
        if block:
            yield "text", block
        while i < len(lines) and not lines[i].strip():
            i += 1


def markdown(doc: str | None) -> str:
    """A docstring in Markdown."""
    if not doc:
        return ""
    lines = inspect.cleandoc(doc).splitlines()
    out: list[str] = []
    fields: list[str] = []
    for kind, block in _blocks(lines):
        if kind == "field":
            match = _FIELD.match(block[0])
            assert match is not None
            text = _inline(" ".join([match.group("text"), *block[1:]]).strip())
            name = match.group("name").strip()
            field = match.group("kind")
            if field in ("param", "ivar"):
                fields.append(f"- `{name}`: {text}")
            elif field == "raises":
                fields.append(f"- raises `{name}`: {text}")
            elif field in ("returns", "return"):
                fields.append(f"- returns: {text}")
            continue
        if fields:
            out.append("\n".join(fields))
            fields = []
        if kind in ("pycon", "python"):
            out.append(
                f"```{'pycon' if kind == 'pycon' else 'text'}\n" + "\n".join(block) + "\n```"
            )
        elif kind == "table":
            out.append("```text\n" + "\n".join(block) + "\n```")
        else:
            text = "\n".join(block)
            if text.rstrip().endswith("::"):
                text = text.rstrip()[:-1]
            out.append(_inline(text))
    if fields:
        out.append("\n".join(fields))
    return "\n\n".join(out)


# ------------------------------------------------------------------ signatures


def _annotation(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return value.__qualname__
    return str(value).replace("typing.", "")


def _default(value: Any, names: dict[str, Any]) -> str:
    """A default as its source says it: a name the module binds it to, not a repr that
    holds a memory address."""
    if isinstance(value, type | types.FunctionType):
        return value.__name__
    text = repr(value)
    if " at 0x" in text:
        bound = [n for n, v in names.items() if v is value]
        return bound[0] if bound else "..."
    return text


def signature(obj: Any, *, skip_self: bool = False) -> str:
    """``(name: str, data: Any = None, **options) -> UUID | None``, annotations as written."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return "(...)"
    parts: list[str] = []
    star_done = False
    params = list(sig.parameters.values())
    if skip_self and params and params[0].name in ("self", "cls"):
        params = params[1:]
    for p in params:
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        text = p.name
        if p.kind is p.VAR_POSITIONAL:
            text, star_done = "*" + text, True
        elif p.kind is p.VAR_KEYWORD:
            text = "**" + text
        if p.annotation is not p.empty:
            text += f": {_annotation(p.annotation)}"
        if p.default is not p.empty:
            shown = _default(p.default, getattr(obj, "__globals__", {}))
            text += f" = {shown}" if p.annotation is not p.empty else f"={shown}"
        parts.append(text)
        if p.kind is p.POSITIONAL_ONLY and (
            p is params[-1] or params[params.index(p) + 1].kind is not p.POSITIONAL_ONLY
        ):
            parts.append("/")
    result = f"({', '.join(parts)})"
    if sig.return_annotation is not sig.empty:
        result += f" -> {_annotation(sig.return_annotation)}"
    return result


# ------------------------------------------------------------------ objects


def _resolve(target: str) -> Any:
    parts = target.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(target)


def _own_doc(obj: Any) -> str | None:
    doc = obj.__doc__
    if (
        isinstance(obj, type)
        and dataclasses.is_dataclass(obj)
        and doc
        and doc.startswith(obj.__name__ + "(")
    ):
        return None  # the dataclass's generated signature, not a docstring
    return str(doc) if doc is not None else None


def _members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties defined by ``cls`` or a base of this package, in
    source order."""
    seen: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("alkstore_sa") or klass is object:
            continue
        for name, value in vars(klass).items():
            if name.startswith("_") or name in seen:
                continue
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if inspect.isfunction(value) or isinstance(value, property):
                seen.add(name)
                yield name, value


def _class(name: str, cls: type, level: int) -> list[str]:
    h = "#" * level
    out: list[str] = []
    if issubclass(cls, enum.Enum):
        out.append(f"{h} `{name}`")
        out.append(markdown(_own_doc(cls)))
        out.append("\n".join(f"- `{m.name}` = `{m.value!r}`" for m in cls))
        return out
    if isinstance(cls, type) and hasattr(cls, "__annotations__") and issubclass(cls, dict):
        out.append(f"{h} `{name}`")
        out.append(markdown(_own_doc(cls)))
        keys = [f"- `{k}`: `{_annotation(v)}`" for k, v in cls.__annotations__.items()]
        out.append("Keys (all optional unless said):\n\n" + "\n".join(keys))
        return out
    init = signature(cls)
    kind = "exception" if issubclass(cls, BaseException) else "class"
    out.append(f"{h} `{name}`")
    out.append(f"```text\n{kind} {name}{init}\n```")
    doc = markdown(_own_doc(cls))
    if doc:
        out.append(doc)
    if dataclasses.is_dataclass(cls):
        fields = [
            f"- `{f.name}`: `{_annotation(f.type)}`"
            for f in dataclasses.fields(cls)
            if not f.name.startswith("_")
        ]
        if fields:
            out.append("Fields:\n\n" + "\n".join(fields))
    for member, value in _members(cls):
        if isinstance(value, property):
            out.append(f"{h}# `{name}.{member}` (property)")
            body = markdown(value.__doc__)
        else:
            out.append(f"{h}# `{name}.{member}`")
            prefix = "async " if inspect.iscoroutinefunction(value) else ""
            out.append(f"```text\n{prefix}{member}{signature(value, skip_self=True)}\n```")
            body = markdown(value.__doc__)
        out.append(body or "(no docstring)")
    return out


def _module(name: str, module: types.ModuleType, level: int) -> list[str]:
    h = "#" * level
    out = [f"{h} `{name}`", markdown(module.__doc__)]
    names = getattr(module, "__all__", None)
    if names is None:
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_")
            and (inspect.isfunction(v) or inspect.isclass(v))
            and getattr(v, "__module__", None) == module.__name__
        ]
    for member in names:
        value = getattr(module, member)
        out.extend(_object(member, value, level + 1))
    return out


def _object(name: str, obj: Any, level: int) -> list[str]:
    h = "#" * level
    if inspect.ismodule(obj):
        return _module(name, obj, level)
    if inspect.isclass(obj):
        return _class(name, obj, level)
    if inspect.isfunction(obj) or inspect.isbuiltin(obj):
        prefix = "async " if inspect.iscoroutinefunction(obj) else ""
        return [
            f"{h} `{name}`",
            f"```text\n{prefix}{name}{signature(obj)}\n```",
            markdown(obj.__doc__) or "(no docstring)",
        ]
    return [f"{h} `{name}`", f"```text\n{name} = {obj!r}\n```"]


def render(target: str) -> str:
    """The generated reference of ``target`` (a dotted name)."""
    obj = _resolve(target)
    short = target.rsplit(".", 1)[-1] if not inspect.ismodule(obj) else target
    parts = [p for p in _object(short, obj, 3) if p]
    return "\n\n".join(parts)


def slug(heading: str) -> str:
    """The anchor the docs site's table of contents gives ``heading`` (Python-Markdown's
    ``toc``: the text without its inline markup and punctuation, lower case, dashes)."""
    text = re.sub(r"[`*]", "", heading)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _headings(lines: list[str]) -> Iterator[tuple[int, str]]:
    """``(level, text)`` of the level 2 to 4 headings outside fenced blocks."""
    fenced = False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is not None:
            yield len(match.group("level")), match.group("text")


def index(lines: list[str]) -> list[str]:
    """The page's index: each section (``##``), its objects (``###``) and their members
    (``####``, on one line). A heading whose anchor an earlier one took (the site would
    suffix its anchor) links to the heading above it instead."""
    seen: set[str] = set()
    parents = {2: "", 3: ""}

    def link(text: str, level: int, label: str | None = None) -> str:
        anchor = slug(text)
        shown = label if label is not None else text
        if anchor in seen:
            anchor = parents[level - 1] if level > 2 else ""
        else:
            seen.add(anchor)
        if level in parents:
            parents[level] = anchor
        return f"[{shown}](#{anchor})" if anchor else shown

    out: list[str] = []
    members: list[str] = []

    def flush() -> None:
        if members:
            out[-1] += ": " + " · ".join(members)
            members.clear()

    for level, text in _headings(lines):
        if level == 2:
            flush()
            out.append(f"- {link(text, 2)}")
        elif level == 3:
            flush()
            out.append(f"    - {link(text, 3)}")
        elif out and out[-1].startswith("    - "):
            code = re.match(r"`([^`]+)`", text)
            name = code.group(1).rsplit(".", 1)[-1] if code else text
            members.append(link(text, 4, f"`{name}`"))
    flush()
    return out


def _with_index(lines: list[str]) -> list[str]:
    if INDEX_OPEN not in lines:
        return lines
    start = lines.index(INDEX_OPEN)
    if INDEX_CLOSE not in lines[start:]:
        raise SystemExit(f"{PAGE.name}: {INDEX_OPEN} has no {INDEX_CLOSE}")
    end = lines.index(INDEX_CLOSE, start)
    rest = lines[:start] + lines[end + 1 :]
    return [*lines[: start + 1], "", *index(rest), "", *lines[end:]]


def page(text: str) -> str:
    """``text`` (the page) with every generated part, and its index, rewritten."""
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        match = OPEN.match(line)
        i += 1
        if match is None:
            continue
        while i < len(lines) and lines[i] != CLOSE:
            i += 1
        if i == len(lines):
            raise SystemExit(f"{PAGE.name}: {line} has no {CLOSE}")
        out.extend(["", render(match.group("target")), "", CLOSE])
        i += 1
    return "\n".join(_with_index("\n".join(out).splitlines())) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the page is stale")
    args = parser.parse_args(argv)
    current = PAGE.read_text(encoding="utf-8")
    fresh = page(current)
    if args.check:
        if fresh != current:
            print(
                f"{PAGE.relative_to(ROOT)} is stale: run python tools/gen_api_docs.py",
                file=sys.stderr,
            )
            return 1
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
