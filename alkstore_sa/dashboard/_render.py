"""How the dashboard shows values: the Jinja environment its pages render in,
with the filters the templates use (the "Browse and act in the dashboard" page).

Every printed value goes through :func:`bidi_finalize`, whatever the template.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
import markupsafe

from .._humanize import job_attempt, job_attempt_short
from ..records import OUTSIDE_DATETIME

_BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def bidi_safe(value: object) -> str:
    """Text for display: bidirectional overrides shown as escapes, so that a
    job's data cannot reorder what is around it on the page."""
    out = str(value)
    for ch in _BIDI:
        out = out.replace(ch, f"\\u{ord(ch):04x}")
    return out


def bidi_finalize(value: Any) -> Any:
    """Jinja's ``finalize``: a printed string with its bidirectional overrides
    escaped (markup stays markup); any other value as it is."""
    if isinstance(value, str) and any(ch in _BIDI for ch in value):
        escaped = bidi_safe(value)
        return markupsafe.Markup(escaped) if isinstance(value, markupsafe.Markup) else escaped
    return value


def pretty(value: Any) -> str:
    if value is None:
        return "null"
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def compact(value: Any, width: int = 120) -> str:
    try:
        out = json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        out = repr(value)
    return out if len(out) <= width else out[: width - 1] + "…"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172_800:
        return f"{s // 3600}h"
    return f"{s // 86_400}d"


def when(value: dt.datetime | None) -> str:
    if value is None:
        return "-"
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def stamp(record: Any, name: str) -> str:
    """A time field of ``record`` (a row read through ``readable_columns``), as
    :func:`when` shows it; one Python cannot hold (``infinity``, a year past 9999)
    as its stored text, not as the stand-in the row carries."""
    problem = getattr(record, "unreadable", {}).get(name)
    if isinstance(problem, str) and problem.endswith(OUTSIDE_DATETIME):
        return problem.removesuffix(OUTSIDE_DATETIME)
    return when(getattr(record, name))


def segment(value: str) -> str:
    """A schema name as one URL path segment: every character a path would read
    otherwise (``/``, ``#``, ``?``, a space, letters beyond ASCII) percent-encoded."""
    return quote(value, safe="")


def sparkline(
    values: Sequence[float], width: int = 120, height: int = 24, top: float | None = None
) -> str:
    """An SVG polyline's points for ``values`` (oldest first) in a ``width`` x ``height``
    box, ``top`` (else the highest value) near the top, zero at the bottom: two lines
    given the same ``top`` share a scale."""
    if not values:
        return ""
    top = top or max(values) or 1
    step = width / max(len(values) - 1, 1)
    room = height - 2
    return " ".join(f"{i * step:.1f},{height - room * v / top:.1f}" for i, v in enumerate(values))


@dataclass(frozen=True, slots=True)
class TracePart:
    """A run of a traceback's lines: ``library`` frames (this package's, or an
    installed package's) are shown collapsed, the rest as they are."""

    library: bool
    text: str
    frames: int


@dataclass(frozen=True, slots=True)
class Failure:
    """A failed job's output as stored (``{name, message, stack}``, see
    :func:`alkstore_sa.options.error_output`), ready to show."""

    name: str
    message: str
    parts: list[TracePart]


# A frame's first line in a Python traceback, and the paths that are not the user's.
_FRAME = re.compile(r'^  File "([^"]*)", line \d+')
_LIBRARY_PATH = re.compile(r"[/\\](alkstore_sa|site-packages|dist-packages)[/\\]|^<frozen ")


def failure(output: Any) -> Failure | None:
    """``output`` as a failure to show, when it has the error shape (a text ``stack``
    beside ``name``/``message``, as our worker and pg-boss store it); else ``None``.

    Consecutive library frames become one collapsed part, so the user's own frames
    stand out."""
    if not isinstance(output, dict) or not isinstance(output.get("stack"), str):
        return None
    parts: list[TracePart] = []
    lines = output["stack"].splitlines()
    i = 0
    while i < len(lines):
        match = _FRAME.match(lines[i])
        # A frame is its File line and the indented source lines under it.
        end = i + 1
        if match:
            while end < len(lines) and lines[end].startswith("    "):
                end += 1
        library = bool(match and _LIBRARY_PATH.search(match.group(1)))
        text = "\n".join(lines[i:end]) + "\n"
        if parts and parts[-1].library == library:
            last = parts[-1]
            parts[-1] = TracePart(library, last.text + text, last.frames + (1 if match else 0))
        else:
            parts.append(TracePart(library, text, 1 if match else 0))
        i = end
    return Failure(str(output.get("name") or ""), str(output.get("message") or ""), parts)


def trace_id(context: Any) -> str | None:
    if isinstance(context, dict):
        parent = context.get("traceparent")
        if isinstance(parent, str):
            parts = parent.split("-")
            if len(parts) >= 3 and len(parts[1]) == 32:
                return parts[1]
        for key in ("trace_id", "traceId"):
            if isinstance(context.get(key), str):
                return str(context[key])
    return None


def environment(directory: Path) -> jinja2.Environment:
    """The Jinja environment of the templates in ``directory``: autoescaped,
    strict about undefined names, with the display filters."""
    templates = jinja2.Environment(
        loader=jinja2.FileSystemLoader(directory),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        # Every printed value, whatever the template: no bidirectional override
        # reaches the page (a name or key from a row shown in place).
        finalize=bidi_finalize,
    )
    templates.filters.update(
        pretty=pretty,
        compact=compact,
        age=age,
        when=when,
        stamp=stamp,
        sparkline=sparkline,
        segment=segment,
        attempt=job_attempt,
        attempt_short=job_attempt_short,
    )
    return templates
