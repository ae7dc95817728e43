"""The command line's queue and send options, generated from the option table
(:data:`alkstore_sa.options.OPTIONS`): one flag per option, named after it."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from ..errors import shown
from ..models.enums import QueuePolicy
from ..options import OPTIONS, OptionSpec


def integer(text: str) -> int:
    """An argparse ``type`` for whole numbers (the range is checked by the service)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{shown(text)} is not an integer") from None
    return value


def _settings(spec: OptionSpec) -> dict[str, Any]:
    """The argparse settings of ``spec``'s flag, from the kind of its value."""
    if spec.kind == "bool":
        return {"action": argparse.BooleanOptionalAction, "help": spec.help}
    if spec.kind == "policy":
        return {"choices": [p.value for p in QueuePolicy], "help": spec.help}
    settings: dict[str, Any] = {"metavar": spec.metavar, "help": spec.help}
    if spec.kind == "int":
        settings["type"] = integer
    return settings


QUEUE_CREATE = tuple(o for o in OPTIONS if o.queue)
"""The flags of ``queue create``."""
QUEUE_UPDATE = tuple(o for o in OPTIONS if o.queue and o.updatable)
"""The flags of ``queue update``."""
SEND = tuple(o for o in OPTIONS if o.send and o.public)
"""The flags of ``send``."""
SCHEDULE = tuple(o for o in SEND if o.name != "id")
"""The flags of ``schedule add``: a schedule sends many jobs, so it takes no ``--id``."""


def add_options(parser: argparse.ArgumentParser, specs: Iterable[OptionSpec]) -> None:
    """One flag per option of ``specs``, in the table's order."""
    for spec in specs:
        parser.add_argument(spec.flag, dest=f"opt_{spec.name}", default=None, **_settings(spec))


def given_options(args: argparse.Namespace, specs: Iterable[OptionSpec]) -> dict[str, Any]:
    """The options of ``specs`` given on the command line, as service keywords."""
    found: dict[str, Any] = {}
    for spec in specs:
        value = getattr(args, f"opt_{spec.name}", None)
        if value is not None:
            found[spec.name] = value
    return found
