"""``alkstore demo``'s progress: a bar redrawn in place on a terminal, plain lines at a
low rate otherwise, so a log file or CI output gets no ``\\r`` frames."""

from __future__ import annotations

import io
import threading
from types import SimpleNamespace
from typing import Any

from alkstore_sa.cli.demo import _progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def draw(out: io.StringIO, seconds: float, **kwargs: Any) -> str:
    shop: Any = SimpleNamespace(settled=3, committed=[1, 2, 3, 4])
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    _progress(shop, 10, out, stop, **kwargs)
    timer.join()
    return out.getvalue()


def test_progress_into_a_file_is_plain_lines_without_carriage_returns() -> None:
    text = draw(io.StringIO(), 0.5, every=60)
    assert "\r" not in text
    assert text.startswith("  3/10 settled, 4 placed, ")
    assert text.count("\n") == 1  # only the final line within the minute


def test_progress_into_a_file_writes_a_line_per_interval() -> None:
    lines = draw(io.StringIO(), 0.65, every=0.2).splitlines()
    assert 2 <= len(lines) <= 5
    assert all(line.startswith("  3/10 settled, 4 placed, ") for line in lines)


def test_progress_on_a_terminal_redraws_one_line_in_place() -> None:
    text = draw(Terminal(), 0.35)
    assert text.count("\r") >= 2 and text.count("\n") == 1
    assert "[#########---------------------]" in text
