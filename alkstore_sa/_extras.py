"""What an optional module says when its extra is not installed."""

from __future__ import annotations


def missing_extra(module: str, extra: str, cause: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error :mod:`module` raises on import when a package of its ``extra`` is missing:
    it names the missing package and the command that installs it, and keeps ``cause``'s
    ``name`` so ``except ModuleNotFoundError`` code reads it as before."""
    return ModuleNotFoundError(
        f"{module} needs the {extra!r} extra ({_top(cause)} is not installed): "
        f"pip install 'alkstore_sa[{extra}]'",
        name=cause.name,
    )


def _top(cause: ModuleNotFoundError) -> str:
    """The distribution-level name of the missing module (``starlette``, not
    ``starlette.applications``)."""
    return (cause.name or str(cause)).split(".", 1)[0]
