"""Every service operation, written once as a generator of statements.

An operation yields :class:`Call` objects and receives each one's buffered
``Result``; it never touches a session. ``QueueService`` drives it with a
``Session`` and ``AsyncQueueService`` with an ``AsyncSession``, so the two cannot
drift apart: they run the very same code.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import Executable, Result, func, select

from . import options as opt
from .errors import InvalidOptionsError, QueueExistsError, QueueNotFoundError
from .names import notify_channel, validate_queue
from .records import Job, QueueInfo, QueueStats, ScheduleInfo, Settled
from .sql import fail as fail_sql
from .sql import fetch as fetch_sql
from .sql import locks
from .sql import queues as queue_sql
from .sql import send as send_sql
from .sql import settle as settle_sql

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Call:
    """One statement to run. ``savepoint``: run it inside a SAVEPOINT and send an
    ``IntegrityError`` back into the operation instead of poisoning the transaction."""

    statement: Executable
    params: Mapping[str, Any] | None = None
    savepoint: bool = False


Op = Generator[Call, Result[Any], T]


class PolicyCache:
    """Queue policies by name, shared by the services of one engine.

    ``fetch`` needs the policy to choose its statement; a queue's policy never
    changes while it exists, and a stale entry (queue deleted and re-created
    with another policy) only makes one fetch come back empty, which refreshes it.
    """

    ttl = 60.0

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[str, float]] = {}

    def get(self, schema: str, name: str) -> str | None:
        hit = self._entries.get((schema, name))
        if hit is None or time.monotonic() - hit[1] > self.ttl:
            return None
        return hit[0]

    def put(self, schema: str, name: str, policy: str) -> None:
        self._entries[(schema, name)] = (policy, time.monotonic())

    def drop(self, schema: str, name: str) -> None:
        self._entries.pop((schema, name), None)


@dataclass(slots=True)
class Context:
    """What every operation needs to know about its service."""

    schema: str
    notify: bool = True
    policies: PolicyCache = field(default_factory=PolicyCache)

    @property
    def channel(self) -> str:
        return notify_channel(self.schema)


def check_schema(ctx: Context) -> Op[None]:
    """Raise a clear error if the schema is missing or at another version."""
    from .errors import SchemaNotInstalledError, SchemaVersionError
    from .names import SCHEMA_VERSION
    from .sql._common import VERSION

    found = yield Call(select(func.to_regclass(f'"{ctx.schema}".version').is_not(None)))
    if not found.scalar_one():
        raise SchemaNotInstalledError(ctx.schema)
    result = yield Call(select(VERSION.c.version).limit(1))
    version = result.scalar()
    if version != SCHEMA_VERSION:
        raise SchemaVersionError(ctx.schema, version, SCHEMA_VERSION)


# ---------------------------------------------------------------- sending


def _job_arrays(specs: Sequence[Mapping[str, Any]]) -> tuple[dict[str, list[Any]], list[uuid.UUID]]:
    arrays: dict[str, list[Any]] = {f"in_{n}": [] for n, _ in send_sql.INPUT_COLUMNS}
    ids: list[uuid.UUID] = []
    for index, spec in enumerate(specs):
        data = spec.get("data")
        options = {k: v for k, v in spec.items() if k != "data"}
        row = _send_row(options, data, index if len(specs) > 1 else None)
        ids.append(row["id"])
        for key, value in row.items():
            arrays[f"in_{key}"].append(value)
    return arrays, ids


def _send_row(options: Mapping[str, Any], data: Any, index: int | None) -> dict[str, Any]:
    try:
        opt.check_unknown(options, opt.SEND_OPTION_NAMES | {"singleton_offset"}, "send")
        checked = opt._check_common(options)
    except InvalidOptionsError as exc:
        if index is None:
            raise
        raise InvalidOptionsError(f"jobs[{index}].{exc.option}", exc.problem) from None
    when = opt.start_after(checked.get("start_after"))
    if checked.get("dead_letter") is not None:
        validate_queue(checked["dead_letter"], "dead_letter")
    key = checked.get("singleton_key")
    if key is not None and not isinstance(key, str):
        raise InvalidOptionsError("singleton_key", f"must be a string, not {key!r}")
    return {
        "id": opt.job_id(checked["id"]) if checked.get("id") is not None else uuid.uuid4(),
        "priority": checked.get("priority"),
        "data": opt.encode_json("data", data),
        "start_at": when.absolute,
        "start_in": when.relative,
        "singleton_key": key,
        "singleton_seconds": checked.get("singleton_seconds"),
        "singleton_offset": checked.get("singleton_offset"),
        "expire_seconds": checked.get("expire_seconds"),
        "deletion_seconds": checked.get("deletion_seconds"),
        "retention_seconds": checked.get("retention_seconds"),
        "retry_limit": checked.get("retry_limit"),
        "retry_delay": checked.get("retry_delay"),
        "retry_backoff": checked.get("retry_backoff"),
        "retry_delay_max": checked.get("retry_delay_max"),
        "dead_letter": checked.get("dead_letter"),
    }


def _check_dead_letters(name: str, specs: Sequence[Mapping[str, Any]]) -> Op[None]:
    wanted = {s["dead_letter"] for s in specs if s.get("dead_letter") is not None}
    if not wanted:
        return
    if name in wanted:
        raise InvalidOptionsError("dead_letter", "a job cannot dead-letter into its own queue")
    # The job's dead_letter foreign key is deferred: a missing queue would only
    # fail at COMMIT, so it is checked here, before anything is written.
    result = yield Call(send_sql.queues_exist(), {"names": sorted(wanted)})
    missing = wanted - set(result.scalars().all())
    if missing:
        raise InvalidOptionsError("dead_letter", f"queue {sorted(missing)[0]!r} does not exist")


def send_many(
    ctx: Context, name: str, jobs: Iterable[Mapping[str, Any]]
) -> Op[list[uuid.UUID | None]]:
    validate_queue(name)
    specs = list(jobs)
    for index, spec in enumerate(specs):
        if not isinstance(spec, Mapping):
            raise InvalidOptionsError(f"jobs[{index}]", "each job must be a mapping")
    if not specs:
        return []
    arrays, ids = _job_arrays(specs)
    yield from _check_dead_letters(name, specs)
    params: dict[str, Any] = {"qname": name, "channel": ctx.channel, **arrays}
    result = yield Call(send_sql.insert_jobs(notify=ctx.notify), params)
    rows = result.all()
    if not rows[0].found:
        raise QueueNotFoundError(name, ctx.schema)
    inserted = {row.id for row in rows if row.id is not None}
    return [i if i in inserted else None for i in ids]


def send(ctx: Context, name: str, data: Any, options: Mapping[str, Any]) -> Op[uuid.UUID | None]:
    ids = yield from send_many(ctx, name, [{**options, "data": data}])
    return ids[0]


def send_debounced(
    ctx: Context, name: str, data: Any, seconds: int, key: str | None, options: Mapping[str, Any]
) -> Op[uuid.UUID | None]:
    opt.check_int("seconds", seconds, minimum=1)
    base = {**options, "singleton_seconds": seconds}
    if key is not None:
        base["singleton_key"] = key
    first = yield from send(ctx, name, data, base)
    if first is not None:
        return first
    # The current slot is taken: claim the next one, starting when it opens
    # (pg-boss: one more attempt with the slot offset by one period).
    result = yield Call(select(func.extract("epoch", func.now())))
    epoch = float(result.scalar_one())
    wait = seconds - math.floor(epoch % seconds)
    if seconds > 1:
        wait += 1
    later = {**base, "singleton_offset": seconds, "start_after": timedelta(seconds=wait)}
    return (yield from send(ctx, name, data, later))


def publish(
    ctx: Context, event: str, data: Any, options: Mapping[str, Any]
) -> Op[list[uuid.UUID | None]]:
    if not isinstance(event, str) or not event:
        raise InvalidOptionsError("event", "must be a non-empty string")
    result = yield Call(queue_sql.subscribers(), {"event": event})
    ids: list[uuid.UUID | None] = []
    for queue in result.scalars().all():
        ids.append((yield from send(ctx, queue, data, options)))
    return ids


def subscribe(ctx: Context, event: str, name: str) -> Op[None]:
    if not isinstance(event, str) or not event:
        raise InvalidOptionsError("event", "must be a non-empty string")
    yield from _require_queue(ctx, name)
    yield Call(queue_sql.subscribe(), {"event": event, "qname": name})


def unsubscribe(ctx: Context, event: str, name: str) -> Op[bool]:
    validate_queue(name)
    result = yield Call(queue_sql.unsubscribe(), {"event": event, "qname": name})
    return bool(getattr(result, "rowcount", 0))


# ---------------------------------------------------------------- fetching


def _policy(ctx: Context, name: str, *, refresh: bool = False) -> Op[str]:
    policy = None if refresh else ctx.policies.get(ctx.schema, name)
    if policy is None:
        info = yield from get_queue(ctx, name)
        if info is None:
            ctx.policies.drop(ctx.schema, name)
            raise QueueNotFoundError(name, ctx.schema)
        policy = info.policy.value
        ctx.policies.put(ctx.schema, name, policy)
    return policy


def fetch(
    ctx: Context, name: str, batch_size: int, priority: bool, ignore_start_after: bool
) -> Op[list[Job]]:
    validate_queue(name)
    opt.check_int("batch_size", batch_size, minimum=1, maximum=100_000)
    opt.check_bool("priority", priority)
    opt.check_bool("ignore_start_after", ignore_start_after)
    cached = ctx.policies.get(ctx.schema, name) is not None
    policy = yield from _policy(ctx, name)
    jobs = yield from _claim(ctx, name, policy, batch_size, priority, ignore_start_after)
    if not jobs and cached:
        # An empty answer from a cached policy: make sure the queue still exists
        # and still has that policy before believing it.
        fresh = yield from _policy(ctx, name, refresh=True)
        if fresh != policy:
            jobs = yield from _claim(ctx, name, fresh, batch_size, priority, ignore_start_after)
    return jobs


def _claim(
    ctx: Context, name: str, policy: str, batch_size: int, priority: bool, ignore_start_after: bool
) -> Op[list[Job]]:
    aware = policy in fetch_sql.RACY_POLICIES
    stmt = fetch_sql.fetch_jobs(
        priority=priority, ignore_start_after=ignore_start_after, singleton_aware=aware
    )
    try:
        result = yield Call(stmt, {"qname": name, "limit": batch_size}, savepoint=aware)
    except _Conflict:
        # Another session activated a job of the same key first (i2/i3):
        # pg-boss answers with no jobs, and so do we.
        return []
    return [Job.from_row(row) for row in result.mappings().all()]


class _Conflict(Exception):
    """Sent into an operation when its savepoint statement hit a unique index."""


# ---------------------------------------------------------------- settling


@dataclass(frozen=True, slots=True)
class Settlement:
    """One job to complete or fail: its output and, for workers, the fencing token."""

    id: uuid.UUID
    output: Any = None
    started_on: datetime | None = None


def _settle_params(name: str, items: Sequence[Settlement]) -> dict[str, Any]:
    return {
        "qname": name,
        "ids": [i.id for i in items],
        "outputs": [opt.encode_json("output", opt.output_value(i.output)) for i in items],
        "fences": [i.started_on for i in items],
    }


def complete_many(ctx: Context, name: str, items: Sequence[Settlement]) -> Op[Settled]:
    validate_queue(name)
    if not items:
        return Settled(0, [])
    result = yield Call(settle_sql.complete_jobs(), _settle_params(name, items))
    return Settled(len(items), list(result.scalars().all()))


@dataclass(frozen=True, slots=True)
class FailResult:
    """What the fail statement did to each job it found."""

    settled: Settled
    states: dict[uuid.UUID, str]
    dead_lettered: int


def fail_many(ctx: Context, name: str, items: Sequence[Settlement]) -> Op[FailResult]:
    validate_queue(name)
    if not items:
        return FailResult(Settled(0, []), {}, 0)
    result = yield Call(fail_sql.fail_jobs(), _settle_params(name, items))
    rows = result.all()
    return FailResult(
        Settled(len(items), [r.id for r in rows]),
        {r.id: r.state for r in rows},
        int(rows[0].dead_lettered) if rows else 0,
    )


def _by_ids(stmt: Executable, name: str, ids: object) -> Op[Settled]:
    validate_queue(name)
    id_list = opt.job_ids(ids)
    result = yield Call(stmt, {"qname": name, "ids": id_list})
    return Settled(len(id_list), list(result.scalars().all()))


def cancel(ctx: Context, name: str, ids: object) -> Op[Settled]:
    return (yield from _by_ids(settle_sql.cancel_jobs(), name, ids))


def resume(ctx: Context, name: str, ids: object) -> Op[Settled]:
    return (yield from _by_ids(settle_sql.resume_jobs(), name, ids))


def retry(ctx: Context, name: str, ids: object) -> Op[Settled]:
    return (yield from _by_ids(settle_sql.retry_jobs(), name, ids))


def delete_jobs(ctx: Context, name: str, ids: object) -> Op[Settled]:
    return (yield from _by_ids(settle_sql.delete_jobs(), name, ids))


def delete_by_state(ctx: Context, name: str, which: str) -> Op[int]:
    yield from _require_queue(ctx, name)
    result = yield Call(settle_sql.delete_by_state(which), {"qname": name})
    return int(getattr(result, "rowcount", 0))


def get_jobs(ctx: Context, name: str, ids: object) -> Op[list[Job]]:
    validate_queue(name)
    result = yield Call(settle_sql.get_jobs(), {"qname": name, "ids": opt.job_ids(ids)})
    return [Job.from_row(r) for r in result.mappings().all()]


def extend_leases(
    ctx: Context, name: str, items: Sequence[Settlement], extend_by: int
) -> Op[list[uuid.UUID]]:
    result = yield Call(
        settle_sql.extend_lease(),
        {
            "qname": name,
            "ids": [i.id for i in items],
            "fences": [i.started_on for i in items],
            "extend_by": extend_by,
        },
    )
    return list(result.scalars().all())


def redrive(
    ctx: Context, dead_letter: str, to: str, ids: object | None, limit: int
) -> Op[list[uuid.UUID]]:
    """Move jobs waiting or failed in ``dead_letter`` into queue ``to`` as new jobs."""
    from .sql import redrive as redrive_sql

    validate_queue(dead_letter, "dead_letter")
    validate_queue(to, "to")
    opt.check_int("limit", limit, minimum=1)
    yield from _require_queue(ctx, to)
    yield from _require_queue(ctx, dead_letter)
    params: dict[str, Any] = {"qname": dead_letter, "limit": limit}
    if ids is not None:
        params["ids"] = opt.job_ids(ids)
    result = yield Call(redrive_sql.take(by_id=ids is not None), params)
    taken = result.all()
    if not taken:
        return []
    new_ids = yield from send_many(ctx, to, [{"data": row.data} for row in taken])
    return [i for i in new_ids if i is not None]


# ---------------------------------------------------------------- queues


def get_queue(ctx: Context, name: str) -> Op[QueueInfo | None]:
    validate_queue(name)
    result = yield Call(queue_sql.get_queues(by_name=True), {"names": [name]})
    row = result.mappings().first()
    return None if row is None else QueueInfo.from_row(row)


def get_queues(ctx: Context, names: Sequence[str] | None) -> Op[list[QueueInfo]]:
    if names is None:
        result = yield Call(queue_sql.get_queues(by_name=False))
    else:
        for n in names:
            validate_queue(n)
        result = yield Call(queue_sql.get_queues(by_name=True), {"names": list(names)})
    return [QueueInfo.from_row(r) for r in result.mappings().all()]


def _require_queue(ctx: Context, name: str) -> Op[QueueInfo]:
    info = yield from get_queue(ctx, name)
    if info is None:
        raise QueueNotFoundError(name, ctx.schema)
    return info


def _lock(ctx: Context, key: str) -> Call:
    return Call(locks.xact_lock(), {"lock_schema": ctx.schema, "lock_key": key})


def create_queue(
    ctx: Context, name: str, exist_ok: bool, options: Mapping[str, Any]
) -> Op[QueueInfo]:
    validate_queue(name)
    checked = opt.queue_options(name, options)
    dead = checked.get("dead_letter")
    if dead is not None:
        found = yield from get_queue(ctx, dead)
        if found is None:
            raise InvalidOptionsError("dead_letter", f"queue {dead!r} does not exist")
    # Same lock as Node's createQueue: concurrent creators queue up behind it.
    yield _lock(ctx, locks.CREATE_QUEUE)
    before = yield from get_queue(ctx, name)
    if before is not None:
        if not exist_ok:
            raise QueueExistsError(name)
        return before
    yield Call(
        queue_sql.create_queue(),
        {
            "qname": name,
            "options": opt.encode_json("options", opt.pgboss_queue_json(name, checked)),
        },
    )
    created = yield from _require_queue(ctx, name)
    ctx.policies.put(ctx.schema, name, created.policy.value)
    return created


def update_queue(ctx: Context, name: str, options: Mapping[str, Any]) -> Op[QueueInfo]:
    validate_queue(name)
    checked = opt.queue_options(name, options, update=True)
    current = yield from _require_queue(ctx, name)
    backoff = checked.get("retry_backoff", current.retry_backoff)
    if checked.get("retry_delay_max", current.retry_delay_max) is not None and not backoff:
        raise InvalidOptionsError("retry_delay_max", "is only allowed with retry_backoff=True")
    dead = checked.get("dead_letter")
    if dead is not None:
        found = yield from get_queue(ctx, dead)
        if found is None:
            raise InvalidOptionsError("dead_letter", f"queue {dead!r} does not exist")
    if not checked:
        return current
    columns = tuple(sorted(checked))
    params = {"qname": name, **{f"v_{c}": checked[c] for c in columns}}
    yield Call(queue_sql.update_queue(columns), params)
    return (yield from _require_queue(ctx, name))


def delete_queue(ctx: Context, name: str) -> Op[bool]:
    validate_queue(name)
    yield _lock(ctx, locks.DELETE_QUEUE)
    info = yield from get_queue(ctx, name)
    if info is None:
        return False
    refs = yield Call(queue_sql.queue_references(), {"qname": name})
    row = refs.one()
    if row.queues:
        raise InvalidOptionsError(
            "name", f"queue {name!r} is the dead letter queue of {', '.join(sorted(row.queues))}"
        )
    if row.jobs:
        raise InvalidOptionsError("name", f"jobs of other queues dead-letter into {name!r}")
    yield Call(queue_sql.delete_queue(), {"qname": name})
    ctx.policies.drop(ctx.schema, name)
    return True


def get_queue_stats(ctx: Context, name: str) -> Op[QueueStats]:
    validate_queue(name)
    result = yield Call(queue_sql.live_stats(by_name=True), {"names": [name]})
    row = result.mappings().first()
    if row is None:
        raise QueueNotFoundError(name, ctx.schema)
    values = dict(row)
    values["singletons_active"] = list(values["singletons_active"] or [])
    return QueueStats(**values)


# ---------------------------------------------------------------- schedules


def validate_cron(cron: object, tz: object) -> tuple[str, str]:
    from .cron import validate

    return validate(cron, tz)


def schedule(
    ctx: Context, name: str, cron: str, data: Any, key: str, tz: str, options: Mapping[str, Any]
) -> Op[None]:
    validate_queue(name)
    if not isinstance(key, str):
        raise InvalidOptionsError("key", f"must be a string, not {key!r}")
    cron, tz = validate_cron(cron, tz)
    # Validate the send options now, so that a schedule never fires bad jobs.
    _send_row(options, data, None)
    yield from _require_queue(ctx, name)
    stored = {**opt.to_pgboss_send_options(options), "tz": tz, "key": key}
    yield Call(
        queue_sql.upsert_schedule(),
        {
            "qname": name,
            "key": key,
            "cron": cron,
            "timezone": tz,
            "data": opt.encode_json("data", data),
            "options": opt.encode_json("options", stored),
        },
    )


def unschedule(ctx: Context, name: str, key: str) -> Op[bool]:
    validate_queue(name)
    result = yield Call(queue_sql.delete_schedule(), {"qname": name, "key": key})
    return bool(getattr(result, "rowcount", 0))


def get_schedules(ctx: Context, name: str | None, key: str | None) -> Op[list[ScheduleInfo]]:
    params: dict[str, Any] = {}
    if name is not None:
        params["qname"] = validate_queue(name)
    if key is not None:
        params["key"] = key
    result = yield Call(
        queue_sql.get_schedules(by_name=name is not None, by_key=key is not None), params
    )
    return [ScheduleInfo(**r) for r in result.mappings().all()]
