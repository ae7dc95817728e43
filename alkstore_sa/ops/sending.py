"""Operations that create jobs: send, send_many, debounce, publish/subscribe."""

from __future__ import annotations

import math
import os
import struct
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import timedelta
from typing import Any, TypeVar

from sqlalchemy import func, select

from .. import limits, tracing
from .. import options as opt
from ..errors import InvalidOptionsError, QueueNotFoundError, shown
from ..models.enums import QueuePolicy
from ..names import queue_ref
from ..records import EventSubscription
from ..sql.v26 import queues as queue_sql
from ..sql.v26 import send as send_sql
from ..sql.v46 import node_channel
from ._core import Call, Conflict, Context, Op
from .queues import queue_policy, require_queue

T = TypeVar("T")

_DATA_ONLY = frozenset({"data"})
_POLICIES = frozenset(p.value for p in QueuePolicy)


def _job_arrays(
    specs: Sequence[Mapping[str, Any]], version: int
) -> tuple[dict[str, Any], list[uuid.UUID]]:
    """The statement's inputs (``in_<column>``) and the jobs' ids, in input order,
    the options checked for a schema at ``version``.

    Only columns some job sets get an array; the others stay NULL in SQL. The ids
    (``in_id``) and the data (``in_data``) are one text each (see
    :func:`alkstore_sa.sql.v26.send.id_array` and ``data_array``).
    """
    n = len(specs)
    # The jobs of one transaction share created_on, and fetch breaks that tie by
    # id: ascending ids keep them first-in, first-out.
    fresh, fresh_text = _fresh_ids(n)
    datas = _data_only(specs)
    if datas is not None:
        # The common bulk case, jobs with data and no options: nothing else to
        # check, the data encoded as one JSON array in one call.
        if all(d is None for d in datas):
            return {"in_id": fresh_text}, fresh
        text = opt.encode_json_array(datas)
        if text is not None:
            return {"in_id": fresh_text, "in_data": text}, fresh
        # Some job's data is refused: encoded job by job below, which names it.
    arrays: dict[str, Any] = {}
    ids: list[uuid.UUID] = fresh
    for index, spec in enumerate(specs):
        if spec.keys() <= _DATA_ONLY:
            row: dict[str, Any] = {"data": _encode_data(spec.get("data"), index if n > 1 else None)}
        else:
            options = {k: v for k, v in spec.items() if k != "data"}
            row = _send_row(
                options, spec.get("data"), index if n > 1 else None, version, fresh[index]
            )
            if row["id"] != fresh[index]:
                if ids is fresh:
                    ids = list(fresh)
                ids[index] = row["id"]
        for key, value in row.items():
            if value is not None and key != "id":
                column = arrays.get(f"in_{key}")
                if column is None:
                    column = arrays[f"in_{key}"] = [None] * n
                column[index] = value
    arrays["in_id"] = fresh_text if ids is fresh else send_sql.id_array_text(ids)
    datas_text = arrays.get("in_data")
    if datas_text is not None:
        # One JSON array text (see sql/v26/send.py, data_array); each element was
        # encoded and checked on its own above.
        arrays["in_data"] = "[" + ",".join("null" if d is None else d for d in datas_text) + "]"
    return arrays, ids


# A version-4 UUID (RFC 4122): the version (4) in the high nibble of byte 6 and the
# variant (0b10) in the top bits of byte 8 (only _checked_uuid_of's probe makes one).
_V4_SET = bytes.fromhex("00000000000040008000000000000000")

# Job ids are version-7 UUIDs (RFC 9562): 48 bits of Unix time in milliseconds, the
# version (7), a 12-bit counter (rand_a, the RFC's "fixed bit-length dedicated counter"),
# the variant (0b10) and 62 random bits. Jobs sent in one transaction share created_on
# (now()), and listings and fetch break that tie by id: time-ordered ids keep them in the
# order they were sent, across statements (the "Send jobs" page). Any UUID is a valid
# pg-boss job id; Node never reads its bits.
_LOW_CLEAR = bytes.fromhex("3fffffffffffffff")
_LOW_SET = bytes.fromhex("8000000000000000")
_tick_lock = threading.Lock()
_last_tick = 0
"""The last (milliseconds << 12 | counter) handed out by this process."""


def _ticks(n: int) -> int:
    """The first of ``n`` consecutive ticks (milliseconds << 12 | counter), each later
    than any handed out before in this process, even if the clock steps back."""
    global _last_tick
    now = (time.time_ns() // 1_000_000) << 12
    with _tick_lock:
        first = max(now, _last_tick + 1)
        _last_tick = first + n - 1
    return first


def _fresh_ids(n: int) -> tuple[list[uuid.UUID], str]:
    """``n`` version-7 UUIDs, ascending, later than any this process minted before, and
    the ``:in_id`` text of them (see :func:`alkstore_sa.sql.v26.send.id_array`).

    One ``os.urandom`` call and a few whole-buffer operations for all of them, where
    ``uuid.uuid4()`` makes one system call and several Python calls per id.
    """
    if not n:
        return [], "{}"
    first = _ticks(n)
    if (first & 0xFFF) + n <= 0x1000:
        # The counter does not carry into the milliseconds: the high halves are
        # consecutive integers.
        top = ((first >> 12) << 16) | 0x7000 | (first & 0xFFF)
        highs = struct.pack(f">{n}Q", *range(top, top + n))
    else:
        highs = struct.pack(
            f">{n}Q",
            *[((t >> 12) << 16) | 0x7000 | (t & 0xFFF) for t in range(first, first + n)],
        )
    random = int.from_bytes(os.urandom(8 * n), "big")
    clear = int.from_bytes(_LOW_CLEAR * n, "big")
    marks = int.from_bytes(_LOW_SET * n, "big")
    lows = ((random & clear) | marks).to_bytes(8 * n, "big")
    # Interleave the 8-byte halves, one strided copy per byte position.
    buffer = bytearray(16 * n)
    for k in range(8):
        buffer[k::16] = highs[k::8]
        buffer[8 + k :: 16] = lows[k::8]
    text = "{" + buffer.hex(",", 16) + "}"
    make, from_bytes = _make_uuid, int.from_bytes
    return [make(from_bytes(buffer[i : i + 16], "big")) for i in range(0, 16 * n, 16)], text


def _uuid_of(value: int) -> uuid.UUID:
    # UUID(int=...) checks the range of a value we made ourselves; this is what
    # it then does. Used only if it gives what UUID(int=...) gives (checked below).
    made = _new_object(uuid.UUID)
    _set_attribute(made, "int", value)
    _set_attribute(made, "is_safe", _UNKNOWN_SAFETY)
    return made


_new_object = object.__new__
_set_attribute = object.__setattr__
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown


def _checked_uuid_of() -> Callable[[int], uuid.UUID]:
    probe = int.from_bytes(_V4_SET, "big") | (0x1234 << 112)
    try:
        made = _uuid_of(probe)
        same = made == uuid.UUID(int=probe) and str(made) == str(uuid.UUID(int=probe))
        same = same and hash(made) == hash(uuid.UUID(int=probe)) and made.version == 4
    except (AttributeError, TypeError):
        same = False
    return _uuid_of if same else _plain_uuid_of


def _plain_uuid_of(value: int) -> uuid.UUID:
    return uuid.UUID(int=value)


_make_uuid = _checked_uuid_of()


def _data_only(specs: Sequence[Mapping[str, Any]]) -> list[Any] | None:
    """The jobs' data when every job is ``{"data": ...}`` and nothing else, else ``None``."""
    try:
        datas = [spec["data"] for spec in specs]
    except KeyError:
        return None
    # Each job has "data"; with one key apiece, it is their only key.
    return datas if sum(map(len, specs)) == len(specs) else None


def _encode_data(data: Any, index: int | None) -> str | None:
    try:
        return opt.encode_json("data", data)
    except InvalidOptionsError as exc:
        if index is None:
            raise
        raise type(exc)(f"jobs[{index}].{exc.option}", exc.problem) from None


def _send_row(
    options: Mapping[str, Any],
    data: Any,
    index: int | None,
    version: int,
    fresh_id: uuid.UUID | None = None,
) -> dict[str, Any]:
    """One job's input row, every value checked; errors of ``send_many`` name the job."""
    try:
        return _checked_row(options, data, version, fresh_id)
    except InvalidOptionsError as exc:
        if index is None:
            raise
        raise type(exc)(f"jobs[{index}].{exc.option}", exc.problem) from None


def _checked_row(
    options: Mapping[str, Any], data: Any, version: int, fresh_id: uuid.UUID | None
) -> dict[str, Any]:
    checked = opt.send_options(options, version=version)
    when: opt.StartAfter = checked.pop("start_after", opt.StartAfter(None, None))
    row = {name: checked.get(name) for name in send_sql.OPTION_INPUTS}
    row["id"] = checked.get("id") or fresh_id or _fresh_ids(1)[0][0]
    row["data"] = opt.encode_json("data", data)
    row["start_at"] = when.absolute
    row["start_in"] = when.relative
    return row


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
        raise InvalidOptionsError(
            "dead_letter", f"queue {shown(sorted(missing)[0])} does not exist"
        )


def _job_list(jobs: object) -> list[Any]:
    """The jobs of ``send_many`` as a list; anything but an iterable of jobs is refused."""
    if isinstance(jobs, Mapping):
        raise InvalidOptionsError("jobs", "must be a list of jobs, not one job")
    if isinstance(jobs, str | bytes | bytearray) or not isinstance(jobs, Iterable):
        raise InvalidOptionsError("jobs", f"must be a list of jobs, not {type(jobs).__name__}")
    return list(jobs)


def traced(
    ctx: Context,
    operation: str,
    queue: str | None,
    count: int,
    body: Callable[[tracing.Producing], Op[T]],
    ids_of: Callable[[T], Sequence[Any]],
    parent: tracing.Producing | None = None,
) -> Op[T]:
    """``body(span)`` in the PRODUCER span of ``operation`` (:mod:`alkstore_sa.tracing`),
    a child of ``parent`` if given, else of the current span; ``span.carrier``: the
    ``trace_context`` its jobs store, or ``None``."""
    span = tracing.producing(operation, queue, count, ctx.schema, ctx.version, parent)
    try:
        result = yield from body(span)
    except GeneratorExit:
        raise
    except BaseException as exc:
        span.failed(exc)
        raise
    else:
        span.sent(ids_of(result))
    finally:
        span.end()
    return result


def _sent_ids(ids: list[uuid.UUID | None]) -> list[uuid.UUID | None]:
    return ids


def send_many(
    ctx: Context,
    name: str,
    jobs: Iterable[Mapping[str, Any]],
    operation: str = "insert",
    parent: tracing.Producing | None = None,
) -> Op[list[uuid.UUID | None]]:
    """``operation`` and ``parent``: the span's name (``insert``, pg-boss's name of
    it, or ``send``) and parent, see :func:`traced`."""
    queue_ref(name)
    specs = _job_list(jobs)
    if not all(type(spec) is dict for spec in specs):
        for index, spec in enumerate(specs):
            if not isinstance(spec, Mapping):
                raise InvalidOptionsError(f"jobs[{index}]", "each job must be a mapping")
    if not specs:
        return []
    arrays, ids = _job_arrays(specs, ctx.version)

    def body(span: tracing.Producing) -> Op[list[uuid.UUID | None]]:
        return _send_many(ctx, name, specs, arrays, ids, span.carrier)

    return (yield from traced(ctx, operation, name, len(specs), body, _sent_ids, parent))


def _send_many(
    ctx: Context,
    name: str,
    specs: Sequence[Mapping[str, Any]],
    arrays: dict[str, Any],
    ids: list[uuid.UUID],
    carrier: str | None,
) -> Op[list[uuid.UUID | None]]:
    if "in_dead_letter" in arrays:  # some job names a dead letter queue
        yield from _check_dead_letters(name, specs)
    # Inputs no job uses stay out of the statement (NULL in SQL), so that a plain
    # send binds and encodes two arrays rather than sixteen.
    given = frozenset(k[3:] for k in arrays)
    # Large batches of jobs no built-in unique index can refuse skip ON CONFLICT
    # (see _insert): every id is one we made, and no job has a key or a slot.
    plain = (
        len(ids) >= PLAIN_INSERT_JOBS
        and given.isdisjoint(_TIED)
        and all(spec.get("id") is None for spec in specs)
    )
    row = yield from _insert(ctx, name, given, arrays, len(ids), carrier, plain=plain)
    if not row.found:
        raise QueueNotFoundError(name, ctx.schema)
    return sent_ids(ids, row)


def sent_ids(ids: Sequence[uuid.UUID], row: Any) -> list[uuid.UUID | None]:
    """What a send returns for jobs ``ids`` from the insert's ``row`` (see
    :func:`alkstore_sa.sql.v26.send.inserted_ids`): each id, or ``None`` for a job
    skipped on a unique index."""
    if row.inserted == len(ids):
        return list(ids)
    inserted = set(row.ids or ())
    # An id given twice in one batch is inserted once: only its first job gets it.
    out: list[uuid.UUID | None] = []
    for job_id in ids:
        out.append(job_id if job_id in inserted else None)
        inserted.discard(job_id)
    return out


def _refuse_unkeyed(name: str) -> InvalidOptionsError:
    return InvalidOptionsError(
        "singleton_key", f"queue {shown(name)} has policy key_strict_fifo: every job needs a key"
    )


PLAIN_INSERT_JOBS = 200
"""Batches from this many jobs on may be inserted without ``ON CONFLICT`` (in a
savepoint: see :func:`_insert`). ``ON CONFLICT`` costs the server about 2.5 us per
job, the savepoint about 0.1 ms per batch: from here on it saves several times what
it costs."""

_TIED = frozenset({"singleton_key", "singleton_seconds"})
"""Inputs that tie a job to others through a unique index whatever the policy."""


def _insert(
    ctx: Context,
    name: str,
    given: frozenset[str],
    arrays: Mapping[str, Any],
    count: int,
    carrier: str | None,
    *,
    plain: bool = False,
) -> Op[Any]:
    """The insert of ``count`` jobs; its one row as
    :func:`alkstore_sa.sql.v26.send.insert_jobs`'s (or, at 46, as
    :func:`alkstore_sa.sql.v46.send.insert_jobs`'s).

    ``plain``: the jobs can conflict only through the queue's policy. Into a queue
    whose cached policy is ``standard`` they are then inserted without ``ON
    CONFLICT`` (its speculative insertion is about 15 % of a large insert), in a
    savepoint: should a unique index refuse one anyway (a stale cache, an index
    someone added), the savepoint is rolled back and the batch inserted with ``ON
    CONFLICT DO NOTHING``, as always, so the outcome is the same."""
    strict = ctx.has("key_strict_fifo")
    keys = arrays.get("in_singleton_key")  # a job without one has None there
    all_keyed = not strict or (keys is not None and None not in keys)
    if not all_keyed:
        # A key_strict_fifo queue's CHECK refuses a job without a key and would
        # abort the caller's transaction: refused here, before any SQL, by the
        # queue's (cached) policy. Should the cache be stale, the statement
        # inserts nothing for such a batch and reports the policy.
        policy: str | None = yield from queue_policy(ctx, name)
        if policy == QueuePolicy.KEY_STRICT_FIFO:
            raise _refuse_unkeyed(name)
    else:
        policy = ctx.policies.get(ctx.schema, name)
    traces = carrier is not None
    params: dict[str, Any] = {"qname": name, "channel": ctx.channel, "n_jobs": count, **arrays}
    if ctx.has("Node's notify channel"):
        params["node_channel"] = node_channel(ctx.schema)
    if strict:
        params["all_keyed"] = all_keyed
    if carrier is not None:
        params["trace_context"] = carrier
    result = None
    if plain and policy == send_sql.CONFLICT_FREE_POLICY:
        stmt = ctx.sql.insert_jobs(notify=ctx.notify, given=given, traced=traces, conflicts=False)
        try:
            result = yield Call(stmt, params, savepoint=True, direct=True)
        except Conflict:
            result = None  # rolled back to the savepoint: nothing was written
    if result is None:
        # One statement that never fails on a conflict (ON CONFLICT DO NOTHING): the
        # driver may run it on the driver's connection itself (see ops/driver.py).
        stmt = ctx.sql.insert_jobs(notify=ctx.notify, given=given, traced=traces)
        result = yield Call(stmt, params, direct=True)
    row = result.one()
    if row.found and row.policy in _POLICIES:
        ctx.policies.put(ctx.schema, name, row.policy)
    if not all_keyed and row.policy == QueuePolicy.KEY_STRICT_FIFO:
        ctx.policies.put(ctx.schema, name, QueuePolicy.KEY_STRICT_FIFO.value)
        raise _refuse_unkeyed(name)
    return row


def send(
    ctx: Context,
    name: str,
    data: Any,
    options: Mapping[str, Any],
    parent: tracing.Producing | None = None,
) -> Op[uuid.UUID | None]:
    ids = yield from send_many(ctx, name, [{**options, "data": data}], "send", parent)
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
    # The clock the insert computes slots with (job_now() from 46 on).
    result = yield Call(select(func.extract("epoch", ctx.sql.clock())))
    epoch = float(result.scalar_one())
    wait = seconds - math.floor(epoch % seconds)
    if seconds > 1:
        wait += 1
    later = {**base, "singleton_offset": seconds, "start_after": timedelta(seconds=wait)}
    return (yield from send(ctx, name, data, later))


def _check_event(event: object) -> str:
    # The event is part of the subscription table's primary key; names past the
    # limit could never be subscribed to, so they are refused everywhere.
    return opt.check_text("event", event, allow_empty=False, max_bytes=limits.MAX_EVENT_BYTES)


def publish(
    ctx: Context, event: str, data: Any, options: Mapping[str, Any]
) -> Op[list[uuid.UUID | None]]:
    _check_event(event)

    def body(span: tracing.Producing) -> Op[list[uuid.UUID | None]]:
        return _publish(ctx, event, data, options, span)

    # As pg-boss: a span of its own (it counts no job), each send a child of it.
    return (yield from traced(ctx, "publish", event, 0, body, _no_ids))


def _no_ids(ids: list[uuid.UUID | None]) -> list[uuid.UUID | None]:
    return []


def _publish(
    ctx: Context, event: str, data: Any, options: Mapping[str, Any], span: tracing.Producing
) -> Op[list[uuid.UUID | None]]:
    result = yield Call(queue_sql.subscribers(), {"event": event})
    ids: list[uuid.UUID | None] = []
    for queue in result.scalars().all():
        ids.append((yield from send(ctx, queue, data, options, span)))
    return ids


def subscribe(ctx: Context, event: str, name: str) -> Op[None]:
    _check_event(event)
    yield from require_queue(ctx, name)
    yield Call(queue_sql.subscribe(), {"event": event, "qname": name})


def get_subscriptions(
    ctx: Context, name: str | None, event: str | None
) -> Op[list[EventSubscription]]:
    params: dict[str, Any] = {}
    if name is not None:
        params["qname"] = queue_ref(name)
    if event is not None:
        params["event"] = _check_event(event)
    stmt = queue_sql.get_subscriptions(by_name=name is not None, by_event=event is not None)
    result = yield Call(stmt, params)
    return [EventSubscription.from_row(r) for r in result.mappings().all()]


def unsubscribe(ctx: Context, event: str, name: str) -> Op[bool]:
    _check_event(event)
    queue_ref(name)
    result = yield Call(queue_sql.unsubscribe(), {"event": event, "qname": name})
    return bool(getattr(result, "rowcount", 0))
