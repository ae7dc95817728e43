"""Shared pieces of the builders."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Interval,
    LargeBinary,
    Select,
    Table,
    Text,
    Uuid,
    and_,
    bindparam,
    cast,
    column,
    func,
    literal,
    literal_column,
    select,
    table,
    type_coerce,
)
from sqlalchemy.dialects.postgresql import ARRAY, BIT, OID, TIMESTAMP
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.types import NullType, TypeEngine

from ...models import (
    ATTEMPT_TABLE,
    CLAIM_TABLE,
    CLAIMER_TABLE,
    JobRow,
    QueueRow,
    ScheduleRow,
    SubscriptionRow,
    VersionRow,
    job_state_type,
)
from ...models.enums import JobState

JOB: Table = JobRow.__table__  # type: ignore[assignment]
QUEUE: Table = QueueRow.__table__  # type: ignore[assignment]
SCHEDULE: Table = ScheduleRow.__table__  # type: ignore[assignment]
SUBSCRIPTION: Table = SubscriptionRow.__table__  # type: ignore[assignment]
VERSION: Table = VersionRow.__table__  # type: ignore[assignment]

JOB_COLUMNS = [c.name for c in JOB.columns]

_ONE_SECOND: ColumnElement[Any] = literal_column("interval '1 second'")


def state(value: JobState) -> ColumnElement[Any]:
    """A state as a SQL literal (not a bind parameter).

    Literals let the planner match the partial indexes (``WHERE state < 'active'``),
    which a bind parameter in a generic plan cannot prove.
    """
    return cast(literal_column(f"'{JobState(value).value}'"), job_state_type)


def state_text(value: JobState) -> ColumnElement[Any]:
    """A state literal left untyped, for comparisons with the ``state`` column."""
    return literal_column(f"'{JobState(value).value}'", job_state_type)


def seconds(expr: ColumnElement[Any]) -> ColumnElement[Any]:
    """A number of seconds (integer or not) as an interval: ``expr * interval '1 second'``."""
    return type_coerce(expr * _ONE_SECOND, Interval)


def advisory_key(schema_and_key: ColumnElement[str]) -> ColumnElement[int]:
    """pg-boss's advisory lock key: first 64 bits of sha224(db || '.pgboss.' || schema || key)."""
    digest = func.encode(
        func.sha224(
            cast(func.current_database(type_=Text) + ".pgboss." + schema_and_key, LargeBinary)
        ),
        "hex",
    )
    return cast(cast(literal_column("'x'", Text) + digest, BIT(64)), BigInteger)


class _SchemaFunction(FunctionElement[Any]):
    """A call to one of the schema's own SQL functions (``<schema>.<fn_name>(...)``).

    ``schema_translate_map`` covers tables and types but not function names, so
    the schema is rendered through the same translation the tables get.
    """

    fn_name = ""
    inherit_cache = True
    type: TypeEngine[Any] = NullType()


class create_queue_fn(_SchemaFunction):
    fn_name = "create_queue"
    inherit_cache = True


class delete_queue_fn(_SchemaFunction):
    fn_name = "delete_queue"
    inherit_cache = True


@compiles(_SchemaFunction)
def _compile_schema_function(element: _SchemaFunction, compiler: Any, **kw: Any) -> str:
    preparer = compiler.preparer
    schema = preparer.schema_for_object(QUEUE)
    arguments = compiler.process(element.clauses, **kw)
    return f"{preparer.quote_schema(schema)}.{element.fn_name}({arguments})"


def now_param(fallback: ColumnElement[Any] | None = None) -> ColumnElement[Any]:
    """``COALESCE(:now, <fallback>)``: a bound time if given, else the clock
    ``fallback`` (the database's ``now()`` unless a version reads another)."""
    return func.coalesce(
        bindparam("now", None, type_=TIMESTAMP(timezone=True), required=False),
        func.now() if fallback is None else fallback,
    )


def qname() -> Any:
    """``:qname``, the queue a statement works on."""
    return bindparam("qname", type_=Text)


def any_name() -> Any:
    """``ANY(:names)``, the queues a statement works on."""
    return func.any(bindparam("names", type_=ARRAY(Text)))


def ids() -> Any:
    """``ANY(:ids)``, the jobs a statement works on."""
    return func.any(bindparam("ids", type_=ARRAY(Uuid())))


def id_list() -> Any:
    """``:ids`` as a ``uuid[]``, bound as ONE text (:func:`id_list_text`): the server
    parses it in one go, where the driver would adapt each UUID in Python."""
    return cast(bindparam("ids", type_=Text), ARRAY(Uuid()))


def fence_list() -> Any:
    """``:fences`` as a ``timestamptz[]``, bound as one text (:func:`fence_list_text`)."""
    return cast(bindparam("fences", type_=Text), ARRAY(TIMESTAMP(timezone=True)))


def id_list_text(values: Sequence[uuid.UUID]) -> str:
    """The ``:ids`` text of :func:`id_list`: an array literal of the ids' hex digits."""
    return "{" + ",".join([v.hex for v in values]) + "}"


def fence_list_text(values: Sequence[dt.datetime | None]) -> str:
    """The ``:fences`` text of :func:`fence_list`: ISO 8601 instants (no comma, brace,
    quote or space in them), ``NULL`` for none."""
    return "{" + ",".join(["NULL" if v is None else v.isoformat() for v in values]) + "}"


def fenced_input() -> Any:
    """``unnest(:ids, :fences)`` as ``src(id, fence)``: jobs and their fencing tokens."""
    return (
        func.unnest(id_list(), fence_list())
        .table_valued(column("id", Uuid()), column("fence", TIMESTAMP(timezone=True)), name="src")
        .render_derived()
    )


def job_keys(names: str = "names", ids: str = "ids") -> Any:
    """``unnest(:<names>, :<ids>)`` as ``keys(name, id)``: jobs given by queue and id
    together, never apart (ids can be given, so one id may name a job in two queues)."""
    return (
        func.unnest(bindparam(names, type_=ARRAY(Text())), bindparam(ids, type_=ARRAY(Uuid())))
        .table_valued(column("name", Text()), column("id", Uuid()), name="keys")
        .render_derived()
    )


def settle_input() -> Any:
    """``unnest(:ids, :outputs, :fences)``: per-job output and fencing token.

    A NULL fence means "no fencing" (settling by id, for administration); a
    fetched Job gives its ``started_on``, and a fenced settlement applies only to
    a job still ``active`` in that attempt, never to a later one.
    """
    return (
        func.unnest(id_list(), bindparam("outputs", type_=ARRAY(Text())), fence_list())
        .table_valued(
            column("id", Uuid()),
            column("output", Text()),
            column("fence", TIMESTAMP(timezone=True)),
            name="src",
        )
        .render_derived()
    )


def version_table_exists(schema: str) -> Select[Any]:
    """One boolean: whether ``<schema>.version`` exists (``schema`` is bound as text,
    so it needs no translation)."""
    return select(func.to_regclass(literal(f'"{schema}".version', Text)).is_not(None))


def schema_tables(schema: str) -> Select[Any]:
    """One row: ``job_kind``, the ``pg_class.relkind`` of ``<schema>.job`` (``'p'``
    partitioned, ``'r'`` a plain table, NULL without one), and ``attempts``, whether
    ``<schema>.alkstore_job_attempt`` (the attempt history) exists, and ``claims``, whether
    our workers' claim tables (``alkstore_claim``, ``alkstore_claimer``) exist and this
    role may read and write both; ``schema`` is bound as text, as above."""
    c = table("pg_class", column("oid", OID), column("relkind", Text), schema="pg_catalog")
    job = func.to_regclass(literal(f'"{schema}".job', Text))
    kind = select(c.c.relkind).where(c.c.oid == job).scalar_subquery()
    attempts = func.to_regclass(literal(f'"{schema}".{ATTEMPT_TABLE}', Text)).is_not(None)
    # Our workers' claims at 26 (models/claims.py): usable when both tables are there
    # and this role may write them; otherwise the rescue they serve is simply off.
    usable = [
        func.coalesce(func.has_table_privilege(func.to_regclass(literal(t, Text)), p), False)
        for t in (f'"{schema}".{CLAIM_TABLE}', f'"{schema}".{CLAIMER_TABLE}')
        for p in ("SELECT", "INSERT", "UPDATE", "DELETE")
    ]
    return select(kind.label("job_kind"), attempts.label("attempts"), and_(*usable).label("claims"))


def version_row() -> Select[Any]:
    """The version row's number (no row: no result), in the placeholder schema."""
    return select(VERSION.c.version).limit(1)
