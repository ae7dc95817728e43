"""Operations by key at schema 46: ``update``, ``upsert`` and ``get_blocked_keys``.

pg-boss 12.38 (schema 45 on) is the specification; the "Replace a queued job by key: upserts"
page and the "Run each key's jobs in order: key_strict_fifo" page describe the behaviour.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from .. import options as opt
from .. import tracing
from ..errors import InvalidOptionsError, QueueNotFoundError, shown
from ..models.enums import QueuePolicy
from ..names import node_channel, queue_ref
from ..records import UpdateResult, UpsertResult
from ..sql.v46 import keys as keys_sql
from ..sql.v46 import send as send46_sql
from ._core import Call, Conflict, Context, Op
from .queues import queue_policy, require_queue
from .sending import _check_dead_letters, _job_arrays, _refuse_unkeyed, sent_ids, traced

BLOCKED_KEYS_LIMIT = 1000
"""``get_blocked_keys``'s default ``limit`` (pg-boss's list default)."""

BLOCKED_KEYS_LIMIT_MAX = 100_000
"""The largest ``limit`` ``get_blocked_keys`` accepts (pg-boss's list maximum)."""

UPSERT_ROUNDS = 10
"""Update-then-insert rounds an upsert tries before it reports ``rejected``. A round is lost
when another transaction inserts the key first and a worker claims that job before this
one can edit it; with three rounds, four processes upserting five keys beside a busy worker
lost about one upsert in 800 on two loaded cores."""


class _Keep:
    """The default ``data`` of ``update`` and ``upsert``: keep the job's data."""

    def __repr__(self) -> str:
        return "KEEP_DATA"


KEEP_DATA: Any = _Keep()
"""The default ``data`` of ``update`` and ``upsert``: an edited job keeps its data (only
options change); a job an upsert inserts gets none."""


class _Target:
    """Which jobs an update or upsert names, checked."""

    def __init__(self, verb: str, id: object, singleton_key: object, match: object) -> None:
        if (id is None) == (singleton_key is None):
            raise InvalidOptionsError(
                "id", f"{verb} needs exactly one of id or singleton_key to name its job"
            )
        if id is not None and match is not None:
            raise InvalidOptionsError("match", "only applies when jobs are named by singleton_key")
        if match is not None and match not in keys_sql.MATCHES:
            raise InvalidOptionsError(
                "match", f"must be one of {', '.join(keys_sql.MATCHES)}, not {shown(match)}"
            )
        self.id: uuid.UUID | None = None if id is None else opt.check_option("id", id)
        self.key: str | None = (
            None if singleton_key is None else opt.check_option("singleton_key", singleton_key)
        )
        self.match: str = "newest" if match is None else str(match)

    @property
    def params(self) -> dict[str, Any]:
        return {"target_id": self.id} if self.id is not None else {"target_key": self.key}


def _checked_options(options: Mapping[str, Any], verb: str, version: int) -> dict[str, Any]:
    allowed = frozenset(keys_sql.UPDATE_OPTIONS)
    checked = opt.check_options(options, allowed, verb)
    opt.check_version(checked, version, "send")
    return checked


def _update_call(
    ctx: Context, name: str, target: _Target, data: Any, checked: Mapping[str, Any]
) -> Call:
    given = set(checked)
    params: dict[str, Any] = {
        "qname": name,
        "channel": ctx.channel,
        "node_channel": node_channel(ctx.schema),
        **target.params,
    }
    if data is not KEEP_DATA:
        given.add("data")
        params["payload"] = opt.encode_json("data", data)
    for key, value in checked.items():
        if key == "start_after":
            params["start_at"] = value.absolute
            params["start_in"] = value.relative
        else:
            params[f"v_{key}"] = value
    stmt = keys_sql.update_jobs(
        by_id=target.id is not None,
        match=target.match,
        given=frozenset(given),
        notify=ctx.notify,
    )
    # In a savepoint: a row lock can deadlock with another transaction editing the
    # same keys in the other order, which must not abort the caller's transaction.
    return Call(stmt, params, savepoint=True)


def _edited(result: Any) -> tuple[uuid.UUID, ...]:
    return tuple(row.id for row in result.all())


def update(
    ctx: Context,
    name: str,
    data: Any,
    id: object,
    singleton_key: object,
    match: object,
    options: Mapping[str, Any],
) -> Op[UpdateResult]:
    """Edit not-yet-active jobs in place; see ``QueueService.update``."""
    queue_ref(name)
    ctx.require("update")
    target = _Target("update", id, singleton_key, match)
    checked = _checked_options(options, "update", ctx.version)
    call = _update_call(ctx, name, target, data, checked)
    yield from _check_dead_letters(name, [checked])
    yield from require_queue(ctx, name)
    try:
        jobs = _edited((yield call))
    except Conflict:
        # Deadlocked with another transaction: nothing was edited.
        return UpdateResult((), 0)
    return UpdateResult(jobs, len(jobs))


def upsert(
    ctx: Context,
    name: str,
    data: Any,
    id: object,
    singleton_key: object,
    match: object,
    options: Mapping[str, Any],
) -> Op[UpsertResult]:
    """Edit the named job if it has not started, else insert one; see ``QueueService.upsert``."""
    queue_ref(name)
    ctx.require("upsert")
    target = _Target("upsert", id, singleton_key, match)
    checked = _checked_options(options, "upsert", ctx.version)
    update_call = _update_call(ctx, name, target, data, checked)
    spec: dict[str, Any] = {**options, "data": None if data is KEEP_DATA else data}
    if target.id is not None:
        spec["id"] = target.id
    else:
        spec["singleton_key"] = target.key
    arrays, ids = _job_arrays([spec], ctx.version)
    yield from _check_dead_letters(name, [checked])
    policy = yield from queue_policy(ctx, name)
    if policy == QueuePolicy.KEY_STRICT_FIFO and target.key is None:
        # A job inserted on a miss needs a key there (the queue's CHECK), and
        # pg-boss refuses such an upsert whatever it would have found.
        raise _refuse_unkeyed(name)

    def body(span: tracing.Producing) -> Op[UpsertResult]:
        return _upsert(ctx, name, target, update_call, arrays, ids, span.carrier)

    # Only an insert is a send: an edited job keeps the trace of the send that made it.
    return (yield from traced(ctx, "upsert", name, 1, body, _inserted))


def _inserted(result: UpsertResult) -> tuple[uuid.UUID, ...]:
    return result.jobs if result.inserted else ()


def _upsert(
    ctx: Context,
    name: str,
    target: _Target,
    update_call: Call,
    arrays: dict[str, Any],
    ids: list[uuid.UUID],
    carrier: str | None,
) -> Op[UpsertResult]:
    insert = send46_sql.insert_jobs(
        notify=ctx.notify,
        given=frozenset(k[3:] for k in arrays),
        upsert_by_key=target.key is not None,
        traced=carrier is not None,
    )
    insert_params = {
        "qname": name,
        "channel": ctx.channel,
        "node_channel": node_channel(ctx.schema),
        "all_keyed": target.key is not None,
        "trace_context": carrier,
        "n_jobs": len(ids),
        **arrays,
    }
    for _ in range(UPSERT_ROUNDS):
        try:
            jobs = _edited((yield update_call))
            if jobs:
                return UpsertResult(jobs, len(jobs), 0)
            result = yield Call(insert, insert_params, savepoint=True)
        except Conflict:
            # Deadlocked with another transaction (say, one upserting the same keys in
            # the other order): waiting again would deadlock again. Nothing was written.
            break
        row = result.one()
        if not row.found:
            ctx.policies.drop(ctx.schema, name)
            raise QueueNotFoundError(name, ctx.schema)
        if row.policy == QueuePolicy.KEY_STRICT_FIFO and target.key is None:
            ctx.policies.put(ctx.schema, name, QueuePolicy.KEY_STRICT_FIFO.value)
            raise _refuse_unkeyed(name)
        inserted = tuple(i for i in sent_ids(ids, row) if i is not None)
        if inserted:
            return UpsertResult(inserted, 0, len(inserted))
        # Skipped on a unique index: a concurrent upsert or send of the key won
        # (its job is visible now, unless a worker already took it), or the
        # policy holds the key. Look for it again.
    return UpsertResult((), 0, 0)


def get_blocked_keys(ctx: Context, name: str, limit: object, after: object) -> Op[list[str]]:
    """Keys of a key_strict_fifo queue holding a failed job (``QueueService.get_blocked_keys``)."""
    queue_ref(name)
    ctx.require("get_blocked_keys")
    if limit is None:
        limit = BLOCKED_KEYS_LIMIT
    count = opt.check_int("limit", limit, minimum=1, maximum=BLOCKED_KEYS_LIMIT_MAX)
    if after is not None and (not isinstance(after, str) or not after):
        raise InvalidOptionsError(
            "after", f"must be a non-empty string (a key), not {shown(after)}"
        )
    if after is not None:
        opt.check_text("after", after)
    info = yield from require_queue(ctx, name)
    if info.policy != QueuePolicy.KEY_STRICT_FIFO:
        raise InvalidOptionsError(
            "name",
            f"queue {shown(name)} has policy {info.policy!s}: blocked keys exist only "
            "on key_strict_fifo queues",
        )
    params: dict[str, Any] = {"qname": name, "limit": count}
    if after is not None:
        params["after"] = after
    result = yield Call(keys_sql.blocked_keys(after=after is not None), params)
    return list(result.scalars().all())
