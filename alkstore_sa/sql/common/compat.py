"""What differs between the SQLAlchemy releases we support (2.0.x and 2.1.x), in one place.

SQLAlchemy 2.1 moved PostgreSQL's ``DISTINCT ON`` from ``Select.distinct(*columns)``
(deprecated there) to ``Select.ext(distinct_on(*columns))``, which 2.0 lacks. Both render
the same SQL; :func:`distinct_on` picks whichever the installed release offers.
"""

from __future__ import annotations

from typing import Any, TypeVar

from sqlalchemy import Select
from sqlalchemy.dialects import postgresql

_distinct_on_ext: Any = getattr(postgresql, "distinct_on", None)
"""SQLAlchemy 2.1's ``distinct_on`` extension, or ``None`` on 2.0."""

S = TypeVar("S", bound=Select[Any])


def distinct_on(stmt: S, *columns: Any) -> S:
    """``stmt`` with ``DISTINCT ON (columns)``, on SQLAlchemy 2.0 and 2.1 alike."""
    if _distinct_on_ext is not None:
        extended: S = stmt.ext(_distinct_on_ext(*columns))
        return extended
    plain: S = stmt.distinct(*columns)
    return plain
