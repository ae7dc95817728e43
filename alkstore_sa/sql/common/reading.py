"""Columns in a form every row can be read in, whatever another client wrote: the
job table's, and those of the other tables a reader lists (warnings, instances).

PostgreSQL stores values that Python cannot hold: timestamps before year 1 or
after year 9999 (and ``infinity``), and JSON nested deeper than Python's decoder
recurses. Read as they are, one such row makes the driver raise while it reads the
result, so the whole statement fails: for the claim that means every later fetch of
the queue fails on the same row. These columns make reading never fail:

* each timestamp is clamped into a range that converts to a Python datetime in any
  session time zone, and ``unreadable`` names the columns that were clamped together
  with their stored text, so the reader knows the value is a stand-in;
* every JSON column (``data``, ``output``...) comes back as text, decoded per row by
  :func:`alkstore_sa.records.read_job` (:func:`~alkstore_sa.records.read_record`),
  which checks the nesting depth first and names what does not decode.

For rows that are fine this costs a few comparisons per row in the database and no
extra round trip; JSON is decoded in Python either way.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    ColumnElement,
    DateTime,
    Select,
    Table,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    or_,
    select,
)

from .base import JOB

# timestamptz columns are converted to the session time zone by the driver, which
# may be up to a day away from UTC: one day of margin at each end keeps the converted
# value inside Python's years 1 to 9999.
_TZ_LOW = "'0001-01-02 00:00:00+00'"
_TZ_HIGH = "'9999-12-30 00:00:00+00'"
# singleton_on (timestamp without time zone) is read as stored, so its range is exact.
_NAIVE_LOW = "'0001-01-01 00:00:00'"
_NAIVE_HIGH = "'9999-12-31 23:59:59.999999'"

UNREADABLE = "unreadable"
"""Label of the column listing clamped timestamps as ``name=stored text;...`` (or NULL)."""


def _bound(text: str, *, aware: bool) -> ColumnElement[Any]:
    return cast(literal_column(text), DateTime(timezone=aware))


EARLIEST = _bound(_TZ_LOW, aware=True)
"""The earliest ``timestamptz`` read as itself: where an earlier one (``-infinity``) is
clamped to."""


def infinite(stamp: ColumnElement[Any]) -> ColumnElement[bool]:
    """Whether ``stamp`` is at +infinity or -infinity, the two a subtraction refuses (a
    throttle stamp another client wrote: the supervision claims read it as due now)."""
    return stamp.in_(
        [literal_column("timestamptz 'infinity'"), literal_column("timestamptz '-infinity'")]
    )


def readable_columns(columns: Any, table: Table = JOB) -> list[ColumnElement[Any]]:
    """The job columns of ``columns`` (a table's or a CTE's ``.c``), each labelled
    with its own name, plus :data:`UNREADABLE`. See the module docstring.

    ``table`` says which columns a job has: the schema-26 job table by default,
    :data:`alkstore_sa.sql.v46.tables.JOB` at 46."""
    out: list[ColumnElement[Any]] = []
    marks: list[ColumnElement[Any]] = []
    for name in (c.name for c in table.c):
        column = columns[name]
        if isinstance(table.c[name].type, JSON):
            out.append(cast(column, Text).label(name))
        elif isinstance(table.c[name].type, DateTime):
            aware = bool(getattr(table.c[name].type, "timezone", False))
            low = _bound(_TZ_LOW if aware else _NAIVE_LOW, aware=aware)
            high = _bound(_TZ_HIGH if aware else _NAIVE_HIGH, aware=aware)
            too_high = column >= high if aware else column > high
            out.append(case((column < low, low), (too_high, high), else_=column).label(name))
            stored = literal_column(f"'{name}='", Text) + cast(column, Text)
            marks.append(case((or_(column < low, too_high), stored)))
        else:
            out.append(column.label(name))
    # concat_ws skips NULLs: rows that are fine give '' and so NULL.
    out.append(func.nullif(func.concat_ws(";", *marks), "").label(UNREADABLE))
    return out


def readable(stmt: Select[Any], table: Table = JOB) -> Select[Any]:
    """``stmt`` (selecting every column of ``table``) with its rows read as
    :func:`readable_columns`.

    For statements without an ORDER BY: the outer select does not keep an inner order.
    """
    inner = stmt.subquery("j")
    return select(*readable_columns(inner.c, table))


def readable_schedules(
    schedule: Table, *, by_name: bool = False, by_key: bool = False
) -> Select[Any]:
    """The rows of ``schedule`` (26's table or 46's) as :func:`readable_columns`, by queue
    and key; of queue ``:qname`` and key ``:key`` when asked. The timekeepers and
    ``get_schedules`` read through it, so a row whose data Python cannot decode, or
    whose timestamp it cannot hold, is that row's problem and not the read's."""
    stmt = select(*readable_columns(schedule.c, schedule)).order_by(schedule.c.name, schedule.c.key)
    if by_name:
        stmt = stmt.where(schedule.c.name == bindparam("qname", type_=Text))
    if by_key:
        stmt = stmt.where(schedule.c.key == bindparam("key", type_=Text))
    return stmt
