"""Child processes that receive Ctrl-C as they would at a terminal."""

from __future__ import annotations

import signal


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a child a test sends SIGINT: the signal's default disposition.

    A test run started in the background, and pytest-xdist's workers, ignore SIGINT, and an
    ignored signal stays ignored across ``exec``: the child's Python would then never raise
    ``KeyboardInterrupt``, and a test of Ctrl-C would wait for an exit that never comes.
    """
    signal.signal(signal.SIGINT, signal.SIG_DFL)
