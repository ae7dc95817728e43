"""Statements of the schema-46 turns on ``version``: flows, BAM and reindex
(as pg-boss 12.38's Navigator, BAM runner and index-bloat pass do them).

Each turn is claimed as the cron turn is: an ``UPDATE`` of the one ``version``
row that stamps ``flow_on``, ``bam_on`` or ``reindex_on`` only where the
interval has passed (``>=``; a column never stamped counts as stamped a week
ago), returning a row only to the instance that moved it.

- **Flows.** A completed parent still marked ``blocking`` is resolved in
  batches of 1,000 (``FOR UPDATE SKIP LOCKED``): each child's
  ``pending_dependencies`` goes down by the number of its parents in the batch,
  a child reaching zero is unblocked and its ``start_after`` moved up to now
  (never back), and the parents lose ``blocking``.
- **BAM.** One ``bam`` row at a time across the cluster: the claim runs under
  the ``bamClaim`` advisory lock, takes pending rows before failed or stale
  ones (``created_on`` order within each), waits while an earlier row of the
  same version on the same table is not completed, and sees an ``in_progress``
  row as stale once it is five minutes old and no session holds a granted
  ``ShareUpdateExclusiveLock`` on its table (a concurrent index build holds one
  from start to end). Under a backend profile with ``noIndexProgressView`` there
  is no liveness to read: a row is stale after 24 hours, and the claim takes no
  row lock (the ``UPDATE`` rechecks the row instead), as pg-boss's timeout-only
  claim does.
- **Reindex.** Job-table leaf indexes that are valid, larger than 128 pages,
  hold fewer than 5 entries a page and are over 4 times the pages their live
  entries need (from ``pg_stats`` widths).

Time is ``COALESCE(:now, <schema>.job_now())``, as everywhere at 46.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Boolean,
    Float,
    Integer,
    Select,
    Text,
    TextClause,
    Update,
    Uuid,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal_column,
    select,
    text,
    true,
)
from sqlalchemy.dialects.postgresql import ARRAY, OID
from sqlalchemy.sql import column, table

from ...models.enums import JobState
from ..common.base import any_name, job_keys, state_text
from .supervision import now
from .tables import BAM, JOB, JOB_DEPENDENCY, VERSION

FLOW_BATCH = 1_000
"""Completed parents one flow statement resolves (pg-boss's ``FLOW_BATCH_SIZE``)."""

FLOW_BATCHES = 100
"""Flow statements per chunk of queues in one turn (pg-boss's ``MAX_BATCHES_PER_PASS``)."""

BAM_GRACE_SECONDS = 300
"""How old an ``in_progress`` BAM row must be before a dead build may be reclaimed."""

BAM_STALE_SECONDS = 24 * 60 * 60
"""How old an ``in_progress`` BAM row must be before it is reclaimed where no build's
liveness can be read (``noIndexProgressView``; pg-boss's ``BAM_STALE_SECONDS``)."""

REINDEX_MIN_PAGES = 128
REINDEX_MAX_ENTRIES_PER_PAGE = 5
REINDEX_MIN_SIZE_RATIO = 4
REINDEX_MAX_BYTES = 2 * 1024**3
"""pg-boss 12.38's ``REINDEX_DEFAULTS``: an index over 2 GB is reported, not rebuilt."""

TURN_COLUMNS = ("flow_on", "bam_on", "reindex_on")


@functools.cache
def claim_turn(column_name: str) -> Update:
    """Stamp ``version.<column_name>`` if ``:interval`` seconds have passed;
    returns one row (``won``) to the instance that moved it."""
    if column_name not in TURN_COLUMNS:
        raise ValueError(column_name)
    col = VERSION.c[column_name]
    t = now()
    since = func.coalesce(col, t - literal_column("interval '1 week'"))
    return (
        VERSION.update()
        .where(func.extract("epoch", t - since) >= bindparam("interval", type_=Float))
        .values({column_name: t})
        .returning(true().label("won"))
    )


# ------------------------------------------------------------------ flows


def _blocking_parents(*, skip_locked: bool) -> Select[Any]:
    """Up to :data:`FLOW_BATCH` completed ``blocking`` parents of the queues
    ``:names``, row-locked in name order: ``(name, id)``."""
    parent = JOB.alias("p")
    return (
        select(parent.c.name, parent.c.id)
        .where(
            parent.c.blocking,
            parent.c.state == state_text(JobState.COMPLETED),
            parent.c.name == any_name(),
        )
        .order_by(parent.c.name, parent.c.id)
        .limit(FLOW_BATCH)
        .with_for_update(of=parent, skip_locked=skip_locked)
    )


def _release(parents: Any) -> Update:
    """Count each child of ``parents`` (``name``, ``id``) down by its parents there
    and unblock those left with none: their ``free`` (one per child)."""
    d = JOB_DEPENDENCY
    owed = (
        select(d.c.child_name, d.c.child_id, cast(func.count(), Integer).label("n"))
        .select_from(
            d.join(parents, (d.c.parent_name == parents.c.name) & (d.c.parent_id == parents.c.id))
        )
        .group_by(d.c.child_name, d.c.child_id)
        .cte("owed")
    )
    child = JOB.alias("c")
    children = (
        select(child.c.name, child.c.id, owed.c.n)
        .select_from(
            child.join(owed, (child.c.name == owed.c.child_name) & (child.c.id == owed.c.child_id))
        )
        .where(child.c.blocked)
        .order_by(child.c.name, child.c.id)
        .with_for_update(of=child)
        .cte("children")
    )
    left = func.greatest(JOB.c.pending_dependencies - children.c.n, 0)
    return (
        JOB.update()
        .where(JOB.c.name == children.c.name, JOB.c.id == children.c.id)
        .values(
            pending_dependencies=left,
            blocked=left > 0,
            # Released: its wait counts from now, not from when the flow was sent.
            start_after=case(
                (left == 0, func.greatest(JOB.c.start_after, now())), else_=JOB.c.start_after
            ),
        )
        .returning((~JOB.c.blocked).label("free"))  # RETURNING sees the new row
    )


def _clear(parents: Any) -> Update:
    """Take ``blocking`` off ``parents``: resolved."""
    return (
        JOB.update()
        .where(JOB.c.name == parents.c.name, JOB.c.id == parents.c.id)
        .values(blocking=False)
        .returning(literal_column("1").label("one"))
    )


@functools.cache
def resolve_flows(*, skip_locked: bool = True) -> Select[Any]:
    """Resolve up to :data:`FLOW_BATCH` completed ``blocking`` parents of the
    queues ``:names``; one row, ``resolved`` (parents) and ``released``
    (children whose last pending parent this was). Without ``skip_locked`` (the
    ``noSkipLocked`` flag) a parent another pass holds is waited for."""
    parents = _blocking_parents(skip_locked=skip_locked).cte("parents")
    released = _release(parents).cte("released")
    cleared = _clear(parents).cte("cleared")
    return select(
        select(cast(func.count(), Integer))
        .select_from(cleared)
        .scalar_subquery()
        .label("resolved"),
        select(cast(func.count(), Integer))
        .select_from(released)
        .where(released.c.free)
        .scalar_subquery()
        .label("released"),
    )


@dataclass(frozen=True, slots=True)
class SplitResolve:
    """:func:`resolve_flows` as separate statements in one transaction, each changing
    the job table once (``noMultiMutationCte``): :attr:`pick` locks the parents
    (``name``, ``id`` rows), :attr:`release` counts their children down and
    :attr:`clear` takes ``blocking`` off them, both given the parents as
    ``:parent_names`` and ``:parent_ids``."""

    pick: Select[Any]
    release: Update
    clear: Update


@functools.cache
def resolve_flows_split(*, skip_locked: bool = True) -> SplitResolve:
    """:func:`resolve_flows` as separate statements (see :class:`SplitResolve`)."""
    given = job_keys("parent_names", "parent_ids")
    return SplitResolve(_blocking_parents(skip_locked=skip_locked), _release(given), _clear(given))


# ------------------------------------------------------------------ BAM

_PG_LOCKS = table(
    "pg_locks",
    column("locktype", Text),
    column("granted", Boolean),
    column("mode", Text),
    column("database", OID),
    column("relation", OID),
    schema="pg_catalog",
)
_PG_DATABASE = table(
    "pg_database", column("oid", OID), column("datname", Text), schema="pg_catalog"
)


def _stale(row: Any, *, liveness: bool) -> Any:
    if not liveness:
        # Nothing tells a live build from a dead one: only its age does.
        return row.c.started_on < now() - literal_column(f"interval '{BAM_STALE_SECONDS} seconds'")
    # Past the grace window, and no session building on its table: a concurrent
    # index build holds a granted ShareUpdateExclusiveLock on it from start to end.
    lk = _PG_LOCKS.alias("l")
    db = select(_PG_DATABASE.c.oid).where(_PG_DATABASE.c.datname == func.current_database())
    relation = func.to_regclass(
        func.quote_ident(bindparam("bam_schema", type_=Text))
        + "."
        + func.quote_ident(row.c.table_name)
    )
    building = exists().where(
        lk.c.locktype == "relation",
        lk.c.granted,
        lk.c.mode == "ShareUpdateExclusiveLock",
        lk.c.database == db.scalar_subquery(),
        lk.c.relation == cast(relation, OID),
    )
    grace = now() - literal_column(f"interval '{BAM_GRACE_SECONDS} seconds'")
    return (row.c.started_on < grace) & ~building


@functools.cache
def claim_bam(*, pending_only: bool, liveness: bool = True) -> Update:
    """Take the next ``bam`` row (run it under the ``bamClaim`` lock).

    ``:bam_schema`` is the schema's name (the stale test looks its tables up).
    ``liveness``: a stale row is one whose build is not running (else only an old
    one), and the candidate is locked ``SKIP LOCKED`` (else the ``UPDATE``'s
    recheck of status and start alone keeps two claims apart).
    Returns the row as claimed, with ``reattempt`` (it was failed or stale, not
    pending) and ``prior_status``/``prior_started_on`` (to hand it back).
    """
    c = BAM.alias("c")
    g = BAM.alias("g")
    p = BAM.alias("p")
    if pending_only:
        claimable = c.c.status == "pending"
    else:
        claimable = c.c.status.in_(("pending", "failed")) | (
            (c.c.status == "in_progress") & _stale(c, liveness=liveness)
        )
    waits = exists().where(
        p.c.version == c.c.version,
        p.c.table_name == c.c.table_name,
        p.c.created_on < c.c.created_on,
        p.c.status != "completed",
    )
    running = exists().where(g.c.status == "in_progress", ~_stale(g, liveness=liveness))
    chosen = (
        select(
            c.c.id,
            c.c.status.label("prior_status"),
            c.c.started_on.label("prior_started_on"),
        )
        .where(claimable, ~waits, ~running)
        .order_by(c.c.status != "pending", c.c.created_on)
        .limit(1)
    )
    if liveness:
        chosen = chosen.with_for_update(of=c, skip_locked=True)
    candidate = chosen.cte("candidate")
    return (
        BAM.update()
        .where(
            BAM.c.id == candidate.c.id,
            BAM.c.status == candidate.c.prior_status,
            BAM.c.started_on.is_not_distinct_from(candidate.c.prior_started_on),
        )
        .values(status="in_progress", started_on=now())
        .returning(
            BAM.c.id,
            BAM.c.name,
            BAM.c.version,
            BAM.c.queue,
            BAM.c.table_name,
            BAM.c.command,
            BAM.c.started_on,
            (candidate.c.prior_status != "pending").label("reattempt"),
            candidate.c.prior_status,
            candidate.c.prior_started_on,
        )
    )


@functools.cache
def finish_bam() -> Update:
    """Mark BAM row ``:bam_id`` ``:bam_status`` (completed, or failed with ``:bam_error``)."""
    return (
        BAM.update()
        .where(BAM.c.id == bindparam("bam_id", type_=Uuid()))
        .values(
            status=bindparam("bam_status", type_=Text),
            error=bindparam("bam_error", type_=Text),
            completed_on=now(),
        )
    )


@functools.cache
def index_validity() -> TextClause:
    """``invalid`` of index ``:index`` in schema ``:schema``; no row when it is absent."""
    return text(
        "SELECT NOT x.indisvalid AS invalid FROM pg_catalog.pg_class i"
        " JOIN pg_catalog.pg_index x ON x.indexrelid = i.oid"
        " JOIN pg_catalog.pg_namespace n ON n.oid = i.relnamespace"
        " WHERE n.nspname = :schema AND i.relname = :index"
    ).bindparams(bindparam("schema", type_=Text), bindparam("index", type_=Text))


# ------------------------------------------------------------------ reindex

# The pages an index's live entries need: its key columns' average widths from
# pg_stats (the table's for a column, the index's own for an expression), plus
# 20 bytes of tuple header and line pointer, over 8 kB pages.
_INDEXES = """
    FROM pg_catalog.pg_class i
    JOIN pg_catalog.pg_index x ON x.indexrelid = i.oid
    JOIN pg_catalog.pg_class t ON t.oid = x.indrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = i.relnamespace
"""

_WIDTH = """
    LEFT JOIN LATERAL (
      SELECT COALESCE(sum(COALESCE(ts.avg_width, xs.avg_width, 0)), 0) AS key_width
      FROM unnest(x.indkey::int2[]) WITH ORDINALITY AS k(attnum, pos)
      LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum
      LEFT JOIN pg_catalog.pg_stats ts
        ON ts.schemaname = n.nspname AND ts.tablename = t.relname AND ts.attname = a.attname
      LEFT JOIN pg_catalog.pg_attribute ia ON ia.attrelid = i.oid AND ia.attnum = k.pos::int2
      LEFT JOIN pg_catalog.pg_stats xs
        ON xs.schemaname = n.nspname AND xs.tablename = i.relname AND xs.attname = ia.attname
    ) w ON true
"""


@functools.cache
def bloated_indexes() -> TextClause:
    """The bloated leaf indexes of the job tables ``:tables`` in schema ``:schema``,
    largest first: ``name, table_name, pages, entries, bytes, owned``."""
    return text(
        "SELECT i.relname AS name, t.relname AS table_name, i.relpages AS pages,"
        " floor(i.reltuples)::float8 AS entries, pg_relation_size(i.oid)::float8 AS bytes,"
        " pg_has_role(current_user, i.relowner, 'USAGE') AS owned"
        + _INDEXES
        + _WIDTH
        + " WHERE n.nspname = :schema AND i.relkind = 'i' AND x.indisvalid"
        " AND t.relname = ANY(:tables)"
        f" AND i.relpages > {REINDEX_MIN_PAGES}"
        " AND i.reltuples >= 0"
        f" AND i.reltuples / GREATEST(i.relpages, 1) < {REINDEX_MAX_ENTRIES_PER_PAGE}"
        f" AND i.relpages > {REINDEX_MIN_SIZE_RATIO}"
        " * GREATEST(ceil((i.reltuples * (w.key_width + 20)) / 8192.0), 1)"
        " ORDER BY pg_relation_size(i.oid) DESC"
    ).bindparams(bindparam("schema", type_=Text), bindparam("tables", type_=ARRAY(Text)))


@functools.cache
def reindex_leftovers(*, liveness: bool = True) -> TextClause:
    """Invalid ``*_ccnew`` indexes an interrupted ``REINDEX CONCURRENTLY`` left on
    the job tables ``:tables``, owned by us, with no index build running on
    their table (``liveness``; else whatever is running): ``name``."""
    building = (
        " AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_stat_progress_create_index p"
        " WHERE p.relid = x.indrelid)"
    )
    return text(
        "SELECT i.relname AS name"
        + _INDEXES
        + " WHERE n.nspname = :schema AND i.relkind = 'i' AND NOT x.indisvalid"
        " AND i.relname ~ '_ccnew[0-9]*$' AND t.relname = ANY(:tables)"
        " AND pg_has_role(current_user, i.relowner, 'USAGE')" + (building if liveness else "")
    ).bindparams(bindparam("schema", type_=Text), bindparam("tables", type_=ARRAY(Text)))


def quoted(schema: str, name: str) -> str:
    """``"schema"."name"``, each identifier quoted (a queue's table may need it)."""

    def q(ident: str) -> str:
        return '"' + ident.replace('"', '""') + '"'

    return f"{q(schema)}.{q(name)}"


def ddl(command: str) -> TextClause:
    """``command`` (SQL text from the catalog or the ``bam`` table) as a statement
    with no parameters: its colons escaped so none reads as a bind."""
    return text(command.replace(":", "\\:"))


__all__ = [
    "BAM_GRACE_SECONDS",
    "BAM_STALE_SECONDS",
    "FLOW_BATCH",
    "FLOW_BATCHES",
    "REINDEX_MAX_BYTES",
    "bloated_indexes",
    "claim_bam",
    "claim_turn",
    "ddl",
    "finish_bam",
    "index_validity",
    "quoted",
    "reindex_leftovers",
    "resolve_flows",
]
