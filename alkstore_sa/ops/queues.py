"""Queue operations: create, update, delete, read, stats."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Executable

from .. import options as opt
from .. import versions
from ..errors import (
    InvalidOptionsError,
    QueueExistsError,
    QueueNotFoundError,
    UnknownPolicyError,
    shown,
)
from ..models.enums import QueuePolicy
from ..names import queue_ref, validate_queue
from ..records import QueueInfo, QueueStats
from ..sql.common import locks
from ..sql.v26 import queues as queue_sql
from ._core import Call, Conflict, Context, Op

logger = logging.getLogger(__name__)

_DEAD_LETTER_FKEY = frozenset({"dlq_fkey"})
"""The foreign key of ``job.dead_letter`` (on ``job`` and every partition, at 26 and 46)."""


def _get_queues(ctx: Context, *, by_name: bool) -> Executable:
    return ctx.sql.get_queues(by_name=by_name)


def get_queue(ctx: Context, name: str) -> Op[QueueInfo | None]:
    queue_ref(name)
    result = yield Call(_get_queues(ctx, by_name=True), {"names": [name]})
    row = result.mappings().first()
    return None if row is None else QueueInfo.from_row(row)


def get_queues(ctx: Context, names: Sequence[str] | None) -> Op[list[QueueInfo]]:
    if names is None:
        result = yield Call(_get_queues(ctx, by_name=False))
    else:
        if isinstance(names, str | bytes):
            raise InvalidOptionsError("names", "must be a list of queue names, not one name")
        if not isinstance(names, Iterable) or isinstance(names, Mapping):
            raise InvalidOptionsError(
                "names", f"must be a list of queue names, not {type(names).__name__}"
            )
        names = list(names)
        for n in names:
            queue_ref(n)
        result = yield Call(_get_queues(ctx, by_name=True), {"names": list(names)})
    return [QueueInfo.from_row(r) for r in result.mappings().all()]


def require_queue(ctx: Context, name: str) -> Op[QueueInfo]:
    """Queue ``name``, or :class:`QueueNotFoundError`."""
    info = yield from get_queue(ctx, name)
    if info is None:
        raise QueueNotFoundError(name, ctx.schema)
    return info


def queue_policy(ctx: Context, name: str, *, refresh: bool = False) -> Op[str]:
    """Queue ``name``'s policy, from the engine's cache when fresh (else read and
    cached); :class:`QueueNotFoundError` if the queue does not exist."""
    policy = None if refresh else ctx.policies.get(ctx.schema, name)
    if policy is None:
        info = yield from get_queue(ctx, name)
        if info is None:
            ctx.policies.drop(ctx.schema, name)
            raise QueueNotFoundError(name, ctx.schema)
        if not isinstance(info.policy, QueuePolicy):
            raise UnknownPolicyError(name, info.policy)
        policy = info.policy.value
        ctx.policies.put(ctx.schema, name, policy)
    return policy


def _lock(ctx: Context, key: str) -> Op[None]:
    # Not under noAdvisoryLocks: the queue functions then rely on the queue row's
    # primary key alone, as pg-boss's do there.
    if ctx.sql.advisory_locks:
        yield Call(locks.xact_lock(), {"lock_schema": ctx.lock_name, "lock_key": key})


def create_queue(
    ctx: Context, name: str, *, exist_ok: bool, options: Mapping[str, Any]
) -> Op[QueueInfo]:
    validate_queue(name)
    opt.check_bool("exist_ok", exist_ok)
    checked = opt.queue_options(name, options, version=ctx.version)
    _refuse_for_backend(ctx, checked)
    if checked.get("policy") == QueuePolicy.KEY_STRICT_FIFO and not ctx.has("key_strict_fifo"):
        # Schema 26 has neither the index nor the check this policy relies on.
        raise InvalidOptionsError(
            "policy",
            f"key_strict_fifo needs a schema at version {versions.since('key_strict_fifo')} "
            f"(pg-boss 12); {shown(ctx.schema)} is at {ctx.version}",
        )
    dead = checked.get("dead_letter")
    if dead is not None:
        found = yield from get_queue(ctx, dead)
        if found is None:
            raise InvalidOptionsError("dead_letter", f"queue {shown(dead)} does not exist")
    # Same lock as Node's createQueue: concurrent creators queue up behind it.
    yield from _lock(ctx, locks.CREATE_QUEUE)
    before = yield from get_queue(ctx, name)
    if before is not None:
        if not exist_ok:
            raise QueueExistsError(name)
        _warn_unchanged(name, differences(before, checked))
        return before
    return (yield from _insert_queue(ctx, name, checked))


def _refuse_for_backend(ctx: Context, checked: Mapping[str, Any]) -> None:
    """Refuse, before any SQL, a queue option the backend profile cannot honour."""
    if checked.get("notify") and ctx.backend.has("noListenNotify"):
        raise InvalidOptionsError(
            "notify",
            f"backend {str(ctx.backend)!r} has no LISTEN/NOTIFY (noListenNotify): nothing "
            "would hear the queue's notifications; workers there poll",
        )
    if checked.get("partition") and ctx.backend.has("noTablePartitioning"):
        raise InvalidOptionsError(
            "partition",
            f"backend {str(ctx.backend)!r} builds one plain job table (noTablePartitioning): "
            "a queue cannot have a partition of its own there",
        )


def _insert_queue(ctx: Context, name: str, checked: Mapping[str, Any]) -> Op[QueueInfo]:
    yield Call(
        queue_sql.create_queue(),
        {
            "qname": name,
            "options": opt.encode_json("options", opt.pgboss_queue_json(name, checked)),
        },
    )
    created = yield from require_queue(ctx, name)
    ctx.policies.put(ctx.schema, name, str(created.policy))
    return created


def differences(current: QueueInfo, wanted: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The options in ``wanted`` (checked, as :func:`~alkstore_sa.options.queue_options`
    returns them) whose value differs from ``current``'s: ``{option: (old, new)}``."""
    out: dict[str, tuple[Any, Any]] = {}
    for option, new in wanted.items():
        old = getattr(current, str(opt.OPTION[option].queue_column))
        # A policy is a QueuePolicy on one side and may be its text on the other.
        if getattr(old, "value", old) != getattr(new, "value", new):
            out[option] = (getattr(old, "value", old), getattr(new, "value", new))
    return out


def _warn_unchanged(name: str, changed: Mapping[str, tuple[Any, Any]]) -> None:
    if not changed:
        return
    said = ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in sorted(changed.items()))
    # A warning, not an error: pg-boss returns an existing queue unchanged, and an
    # application that creates its queues at start-up must keep starting.
    logger.warning(
        "create_queue(%r): the queue exists with other options, kept unchanged: %s; "
        "ensure_queue() (alkstore queue ensure) makes it match",
        name,
        said,
        extra={"action": "queue_options_ignored", "queue": name, "ignored": dict(changed)},
    )


def ensure_queue(ctx: Context, name: str, options: Mapping[str, Any]) -> Op[QueueInfo]:
    """Create queue ``name`` with ``options``, or change the existing queue's options
    given here to match (the others stay as they are)."""
    validate_queue(name)
    checked = opt.queue_options(name, options, version=ctx.version)
    yield from _lock(ctx, locks.CREATE_QUEUE)
    before = yield from get_queue(ctx, name)
    if before is None:
        return (yield from create_queue(ctx, name, exist_ok=True, options=options))
    changed = differences(before, checked)
    fixed = sorted(k for k in changed if not opt.OPTION[k].updatable)
    if fixed:
        old, new = changed[fixed[0]]
        raise InvalidOptionsError(
            fixed[0],
            f"queue {shown(name)} has {old!r}, which cannot be changed to {new!r}; "
            "delete and create the queue to change it",
        )
    if not changed:
        return before
    return (yield from update_queue(ctx, name, {k: checked[k] for k in changed}))


def update_queue(ctx: Context, name: str, options: Mapping[str, Any]) -> Op[QueueInfo]:
    queue_ref(name)
    checked = opt.queue_options(name, options, update=True, version=ctx.version)
    _refuse_for_backend(ctx, checked)
    current = yield from require_queue(ctx, name)
    # An option not given keeps the queue's value, which the rules between options see.
    opt.check_requirements(
        checked, {o.name: getattr(current, str(o.queue_column)) for o in opt.OPTIONS if o.queue}
    )
    dead = checked.get("dead_letter")
    if dead is not None:
        found = yield from get_queue(ctx, dead)
        if found is None:
            raise InvalidOptionsError("dead_letter", f"queue {shown(dead)} does not exist")
    if not checked:
        return current
    columns = tuple(sorted(checked))
    params = {"qname": name, **{f"v_{c}": checked[c] for c in columns}}
    yield Call(ctx.sql.update_queue(columns), params)
    return (yield from require_queue(ctx, name))


def delete_queue(ctx: Context, name: str) -> Op[bool]:
    queue_ref(name)
    yield from _lock(ctx, locks.DELETE_QUEUE)
    info = yield from get_queue(ctx, name)
    if info is None:
        return False
    refs = yield Call(queue_sql.queue_references(), {"qname": name})
    row = refs.one()
    if row.queues:
        raise InvalidOptionsError(
            "name",
            f"queue {shown(name)} is the dead letter queue of {', '.join(sorted(row.queues))}",
        )
    # Jobs of other queues that name it as dead letter queue are found by the
    # foreign key's own check when the queue row goes (ON DELETE RESTRICT: at
    # once, not at commit). Nothing indexes job.dead_letter, so that check reads
    # the whole job table; asking first would read it twice
    # (the "Limits" page). The savepoint keeps the transaction usable.
    try:
        yield Call(
            queue_sql.delete_queue(), {"qname": name}, savepoint=True, refused=_DEAD_LETTER_FKEY
        )
    except Conflict:
        raise InvalidOptionsError(
            "name", f"jobs of other queues dead-letter into {shown(name)}"
        ) from None
    ctx.policies.drop(ctx.schema, name)
    return True


def get_queue_stats(ctx: Context, name: str) -> Op[QueueStats]:
    queue_ref(name)
    result = yield Call(queue_sql.live_stats(by_name=True), {"names": [name]})
    row = result.mappings().first()
    if row is None:
        raise QueueNotFoundError(name, ctx.schema)
    values = dict(row)
    values["singletons_active"] = list(values["singletons_active"] or [])
    return QueueStats(**values)
