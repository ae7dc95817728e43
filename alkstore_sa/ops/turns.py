"""The turns on ``version`` at schema 46 besides cron: flows, BAM and reindex.

pg-boss 12.38 takes each of these turns on a claim of its own column
(``flow_on``, ``bam_on``, ``reindex_on``; the statements are in
:mod:`alkstore_sa.sql.v46.turns`). Whoever wins does the whole duty; so do we:

flows (``flow_interval``, default 5 s, like ``flowIntervalSeconds``)
    Node's Navigator, armed when the instance supervises. Per job table, per
    chunk of 100 queues: resolve completed ``blocking`` parents 1,000 at a time
    (at most 100 statements a chunk) until a batch comes back short.
BAM (``bam_interval``, default 60 s, like ``bamIntervalSeconds``)
    Node's runner, on instances started with ``migrate: true`` (its default);
    our ``bam`` setting (default on) plays that part. Runs ``bam`` rows back to
    back, one at a time across the cluster, each claimed under ``bamClaim``:
    the first claim may retry a failed or stale row, later ones take pending
    rows only. Before re-running a concurrent index build, the index is looked
    up: INVALID (an interrupted build) is dropped first, VALID completes the
    row without running it again. After a build, a missing or INVALID index
    fails the row. The statement is tagged ``/* pgboss bam <id> */`` as Node
    tags it.
reindex (``reindex_interval``, default 86,400 s, like ``reindexIntervalSeconds``)
    The last step of the supervise pass: the bloated job-table indexes we own
    and that are at most 2 GB are rebuilt with ``REINDEX INDEX CONCURRENTLY``,
    after the ``*_ccnew`` leftovers of an interrupted rebuild are dropped; a
    bloated index left as it is gets an ``index_bloat`` warning.

Index builds and rebuilds cannot run in a transaction block. Their units are
:class:`Autocommit` steps, which the supervisors run on a connection of their
own in autocommit; a pass run inside the caller's transaction
(``QueueService.supervise``) never claims the BAM and reindex turns, so Node, or
the next background pass, keeps them. The flow turn runs in both.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Generator
from typing import Any

from ..sql.v46 import supervision as sup_sql
from ..sql.v46 import turns as sql
from . import frame
from ._core import Call, Context, Op
from .frame import CHUNK, PassPlan, Tally, queue_tables
from .frame import Autocommit as Autocommit  # re-exported: where it was first defined

logger = logging.getLogger(__name__)

BAM_CLAIM_LOCK = "bamClaim"
"""The advisory lock key every BAM claim is made under (Node's)."""

# What pg-boss recognises as a concurrent index build, and the index it names.

_BLOAT = (
    'Warning: index "{name}" is bloated ({mb} MB across {pages} pages for ~{entries:.0f} live '
    "entries) and was not rebuilt: {reason}."
)


Turn = Generator[Any, Any, None]


def _claim(ctx: Context, column: str, seconds: float, plan: PassPlan) -> Op[bool]:
    params = {"interval": frame.interval(plan, seconds), "now": plan.now}
    return (yield Call(sql.claim_turn(column), params)).first() is not None


def _warn(ctx: Context, plan: PassPlan, kind: str, message: str, data: Any) -> Op[None]:
    if plan.settings.persist_warnings:
        params = {"type": kind, "message": message, "data": json.dumps(data, default=str)}
        yield Call(sup_sql.insert_warning(), {**params, "now": plan.now})


def _execute(statement: Any) -> Op[None]:
    yield Call(statement)


def _drop(ctx: Context, index: str) -> Any:
    return sql.ddl(f"DROP INDEX CONCURRENTLY IF EXISTS {sql.quoted(ctx.schema, index)}")


def _outside(statement: Any) -> Generator[Any, Any, str | None]:
    """Run ``statement`` as an :class:`Autocommit` unit; its error's text, or ``None``."""
    try:
        yield Autocommit(_execute(statement))
    except Exception as exc:
        return _reason(exc)
    return None


def _reason(exc: BaseException) -> str:
    # The database's own message (a DBAPIError's ``orig``), without the SQL.
    return str(getattr(exc, "orig", None) or exc).strip() or type(exc).__name__


# ------------------------------------------------------------------ flows


def _flow_tables(ctx: Context) -> Op[list[tuple[str, list[str]]]]:
    # Every queue, whatever ``queues`` the pass is limited to (Node's resolver's reach).
    tables: dict[str, list[str]] = {}
    for name, table in (yield from queue_tables(ctx, None)):
        tables.setdefault(table, []).append(name)
    return list(tables.items())


def _resolve(ctx: Context, names: list[str], plan: PassPlan) -> Op[tuple[int, int]]:
    skip = not ctx.backend.has("noSkipLocked")
    params = {"names": names, "now": plan.now}
    if not ctx.sql.splits_mutations:
        row = (yield Call(sql.resolve_flows(skip_locked=skip), params)).one()
        return int(row.resolved), int(row.released)
    # noMultiMutationCte: the same steps, one statement each, in one transaction.
    split = sql.resolve_flows_split(skip_locked=skip)
    parents = (yield Call(split.pick, params)).all()
    if not parents:
        return 0, 0
    given = {
        "parent_names": [p.name for p in parents],
        "parent_ids": [p.id for p in parents],
        "now": plan.now,
    }
    released = (yield Call(split.release, given)).scalars().all()
    yield Call(split.clear, given)
    return len(parents), sum(1 for free in released if free)


def flow_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Turn:
    """Win ``flow_on`` and release the children whose parents have completed."""
    won = yield from tally.attempt(
        _claim(ctx, "flow_on", plan.settings.flow_interval, plan), "flows"
    )
    if not won:
        return
    tables = (yield from tally.attempt(_flow_tables(ctx), "flows")) or []
    for _table, names in tables:
        for start in range(0, len(names), CHUNK):
            chunk = names[start : start + CHUNK]
            for _ in range(sql.FLOW_BATCHES):
                done = yield from tally.attempt(_resolve(ctx, chunk, plan), "flows")
                if done is None:
                    break
                tally.flows_resolved += done[0]
                tally.released += done[1]
                if done[0] < sql.FLOW_BATCH:
                    break


# ------------------------------------------------------------------ BAM


def _liveness(ctx: Context) -> bool:
    """Whether a running index build can be told from a dead one (the progress and
    lock views; not under a backend profile with ``noIndexProgressView``)."""
    return not ctx.backend.has("noIndexProgressView")


def _claim_bam(ctx: Context, plan: PassPlan, *, pending_only: bool) -> Op[Any]:
    yield from frame.lock(ctx, BAM_CLAIM_LOCK, plan)
    params = {"bam_schema": ctx.schema, "now": plan.now}
    claim = sql.claim_bam(pending_only=pending_only, liveness=_liveness(ctx))
    return (yield Call(claim, params)).first()


def _validity(ctx: Context, index: str) -> Op[bool | None]:
    """``True`` valid, ``False`` INVALID, ``None`` absent."""
    row = (yield Call(sql.index_validity(), {"schema": ctx.schema, "index": index})).first()
    return None if row is None else not row.invalid


def _finish(ctx: Context, plan: PassPlan, bam_id: Any, error: str | None) -> Op[None]:
    params = {
        "bam_id": bam_id,
        "bam_status": "completed" if error is None else "failed",
        "bam_error": error,
        "now": plan.now,
    }
    yield Call(sql.finish_bam(), params)


def _run_bam(ctx: Context, plan: PassPlan, row: Any, tally: Tally) -> Turn:
    # Imported here, not at the top: the rules are read from the migrations, which
    # import Alembic, and an application that only enqueues and works jobs should
    # not load Alembic (the "Logging" page, "No surprises in your app").
    from .bam_rules import bam_refusal, built_index

    refused = bam_refusal(ctx.schema, row.table_name, row.command)
    if refused is not None:
        # Not one of the index builds pg-boss's migrations queue: never run
        # (alkstore_sa.ops.bam_rules); failed with the reason, reported.
        reason = f"not run: {refused}"
        yield from tally.attempt(_finish(ctx, plan, row.id, reason), "bam")
        tally.bam.append(f"{row.name} ({row.table_name}): refused")
        tally.errors.append(f"bam {row.name} ({row.table_name}): {reason}")
        logger.error(
            "BAM command %s on %s refused: %s",
            row.name,
            row.table_name,
            refused,
            extra={"action": "bam_refused", "bam_id": str(row.id)},
        )
        return
    bare = built_index(row.command)  # what bam_refusal accepted: a build, or the i5 drop
    error: str | None = None
    try:
        built = False
        # Without liveness (noIndexProgressView) an INVALID index is neither healed
        # nor held against the build: such engines roll an interrupted build back,
        # and an index they leave INVALID would fail every retry.
        live = _liveness(ctx)
        if row.reattempt and bare is not None:
            valid = yield _validity(ctx, bare)
            if valid is False and live:
                # An interrupted build left an INVALID index; IF NOT EXISTS would skip it.
                yield Autocommit(_execute(_drop(ctx, bare)))
            built = valid is True
        if not built:
            yield Autocommit(_execute(sql.ddl(f"/* pgboss bam {row.id} */\n{row.command}")))
            if bare is not None:
                valid = yield _validity(ctx, bare)
                if valid is None:
                    error = f"index {bare} does not exist after the build"
                elif not valid and live:
                    error = f"index {bare} is invalid after the build"
    except Exception as exc:
        error = _reason(exc)
    yield from tally.attempt(_finish(ctx, plan, row.id, error), "bam")
    status = "completed" if error is None else "failed"
    tally.bam.append(f"{row.name} ({row.table_name}): {status}")
    if error is not None:
        tally.errors.append(f"bam {row.name} ({row.table_name}): {error}")
        logger.error(
            "BAM command %s on %s failed: %s",
            row.name,
            row.table_name,
            error,
            extra={"action": "bam_failed", "bam_id": str(row.id)},
        )


def bam_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Turn:
    """Win ``bam_on`` and run the pending ``bam`` rows back to back."""
    if not plan.wait_for_locks:
        return  # inside the caller's transaction: no index builds
    won = yield from tally.attempt(_claim(ctx, "bam_on", plan.settings.bam_interval, plan), "bam")
    if not won:
        return
    pending_only = False
    while True:
        row = yield from tally.attempt(_claim_bam(ctx, plan, pending_only=pending_only), "bam")
        if row is None:
            return
        yield from _run_bam(ctx, plan, row, tally)
        pending_only = True


# ------------------------------------------------------------------ reindex


def _scope(ctx: Context, plan: PassPlan) -> Op[list[str]]:
    # Every queue's table, whatever ``queues`` the pass is limited to: the turn is
    # the cluster's for a day, and Node's background pass covers them all.
    pairs = yield from queue_tables(ctx, None)
    tables = sorted({table for _, table in pairs})
    if tables:
        return tables
    return ["job"] if ctx.backend.has("noTablePartitioning") else ["job", "job_common"]


def _read(ctx: Context, statement: Any, tables: list[str]) -> Op[list[Any]]:
    return list((yield Call(statement, {"schema": ctx.schema, "tables": tables})).all())


def _dropped(ctx: Context, tables: list[str], tally: Tally) -> Turn:
    statement = sql.reindex_leftovers(liveness=_liveness(ctx))
    leftovers = yield from tally.attempt(_read(ctx, statement, tables), "reindex")
    for row in leftovers or []:
        error = yield from _outside(_drop(ctx, row.name))
        if error is None:
            tally.reindexed.append(f"{row.name} (leftover dropped)")
        else:
            tally.errors.append(f"reindex: dropping {row.name}: {error}")


def reindex_turn(ctx: Context, plan: PassPlan, tally: Tally) -> Turn:
    """Win ``reindex_on`` and rebuild the bloated job indexes (the pass's last step).

    Under a backend profile with ``noReindex`` the bloat is reported and nothing is
    rebuilt; ``reindex_on`` is then left to an instance that can rebuild (the turn
    runs on this supervisor's own ``reindex_interval``)."""
    if not plan.settings.reindex or not plan.wait_for_locks:
        return
    rebuilds = not ctx.backend.has("noReindex")
    if rebuilds:
        seconds = plan.settings.reindex_interval
        won = yield from tally.attempt(_claim(ctx, "reindex_on", seconds, plan), "reindex")
        if not won:
            return
    tables = yield from tally.attempt(_scope(ctx, plan), "reindex")
    if not tables:
        return
    bloated = yield from tally.attempt(_read(ctx, sql.bloated_indexes(), tables), "reindex")
    targets = [
        r for r in bloated or [] if rebuilds and r.owned and r.bytes <= sql.REINDEX_MAX_BYTES
    ]
    if targets:
        yield from _dropped(ctx, tables, tally)
    failed: dict[str, str] = {}
    rebuilt: set[str] = set()
    for row in targets:
        statement = sql.ddl(f"REINDEX INDEX CONCURRENTLY {sql.quoted(ctx.schema, row.name)}")
        error = yield from _outside(statement)
        if error is None:
            rebuilt.add(row.name)
            tally.reindexed.append(row.name)
        else:
            failed[row.name] = error
    for row in bloated or []:
        if row.name in rebuilt:
            continue
        if row.name in failed:
            reason = failed[row.name]
        elif not rebuilds:
            reason = f"backend {str(ctx.backend)!r} does not rebuild indexes (noReindex)"
        elif not row.owned:
            reason = "the connected role does not own the index"
        else:
            reason = "the index is larger than 2 GB"
        message = _BLOAT.format(
            name=row.name,
            mb=round(row.bytes / 1024 / 1024),
            pages=row.pages,
            entries=row.entries,
            reason=reason,
        )
        logger.warning(message, extra={"action": "index_bloat", "index": row.name})
        data = {
            "name": row.name,
            "table": row.table_name,
            "pages": row.pages,
            "entries": row.entries,
            "bytes": row.bytes,
            "owned": row.owned,
        }
        yield from tally.attempt(_warn(ctx, plan, "index_bloat", message, data), "reindex")


__all__ = ["BAM_CLAIM_LOCK", "Autocommit", "bam_turn", "flow_turn", "reindex_turn"]
