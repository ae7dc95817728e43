"""Parse Python source into an AST with the garbage collector paused.

On CPython 3.11, an ``ast.parse`` interrupted by another one fails with ``SystemError:
AST constructor recursion depth mismatch``; the garbage collector can cause that
interruption, when it finalizes a pooled connection a test dropped and the connection's
logged error formats a traceback (which parses source to place its carets).
"""

from __future__ import annotations

import ast
import gc


def parsed(source: str | bytes, filename: str = "<unknown>") -> ast.Module:
    """``ast.parse(source)``, with no collection (and so no finalizer) running inside it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source, filename=filename)
    finally:
        if enabled:
            gc.enable()
