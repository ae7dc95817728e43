"""The command-line reference (docs/reference/cli.md) names every command, action and
option the parser has, in the section of its command, and no option the parser lacks.

The parser is walked, not listed by hand, so a new option without its line here fails.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from alkstore_sa.cli import build_parser

PAGE = Path(__file__).parent.parent / "docs" / "reference" / "cli.md"
GLOBAL = "Global options and environment"


def _sections() -> dict[str, str]:
    """Each command's part of the page (a heading may name several commands), and the
    global options' part under :data:`GLOBAL`."""
    out: dict[str, str] = {}
    parts = re.split(r"^## ", PAGE.read_text(), flags=re.M)[1:]
    for part in parts:
        heading, _, body = part.partition("\n")
        names = re.findall(r"`([a-z-]+)`", heading.split(" — ")[0])
        for name in names or [heading.strip()]:
            out[name] = out.get(name, "") + body
    return out


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    children = _subparsers(parser)
    if not children:
        return [(path, parser)]
    out = []
    for name, child in children.items():
        if child.prog.split()[-1] == name:  # not an alias
            out.extend(_leaves(child, (*path, name)))
    return out


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for a in parser._actions for o in a.option_strings if o.startswith("--")}


GLOBAL_OPTIONS = _options(build_parser()) - {"--help"}


def test_every_command_and_option_is_in_its_section() -> None:
    sections = _sections()
    missing = []
    for path, parser in _leaves(build_parser()):
        section = sections.get(path[0])
        if section is None:
            missing.append(f"no section for `{path[0]}`")
            continue
        if not re.search(r"alkstore " + r"\s+".join(map(re.escape, path)) + r"\b", section):
            missing.append(f"`alkstore {' '.join(path)}` in section `{path[0]}`")
        for option in sorted(_options(parser) - GLOBAL_OPTIONS - {"--help"}):
            if not re.search(re.escape(option) + r"(?![\w-])", section):
                missing.append(f"`{' '.join(path)} {option}` in section `{path[0]}`")
    for option in sorted(GLOBAL_OPTIONS):
        if option not in sections[GLOBAL]:
            missing.append(f"global `{option}`")
    assert missing == [], "docs/reference/cli.md lacks:\n" + "\n".join(missing)


def test_the_page_names_no_option_the_command_lacks() -> None:
    sections = _sections()
    # A section that names several commands may name any of their options.
    known: dict[str, set[str]] = {}
    names: dict[str, set[str]] = {}
    for path, parser in _leaves(build_parser()):
        known.setdefault(sections[path[0]], set()).update(_options(parser))
        names.setdefault(sections[path[0]], set()).add(path[0])
    stale = []
    for text, options in known.items():
        for option in sorted(set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))):
            if option not in options:
                stale.append(f"`{option}` in the section of {sorted(names[text])}")
    assert stale == [], "docs/reference/cli.md names options the parser lacks:\n" + "\n".join(stale)
