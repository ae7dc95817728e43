"""Statements by key at schema 46 (pg-boss 12.38): ``update``/``upsert`` and blocked keys.

* :func:`update_jobs` edits jobs that have not started (``state < 'active'``,
  created or retry) in place, named by id or by ``singleton_key``; by key,
  ``match`` picks the newest, the oldest or all of them (by ``created_on``). Only
  the columns the caller gave are written. The row is checked again for
  ``state < 'active'`` when it is locked, so a job a worker activated meanwhile is
  left alone. When ``start_after`` moves without a new retention, ``keep_until``
  moves with it (the job keeps its retention window); a new
  ``retention_seconds`` counts from the (new) ``start_after``, as at send.
* the insert half of an upsert is the send statement with ``upsert_by_key``
  set (:func:`alkstore_sa.sql.v46.send.insert_jobs`); ``job_i13`` (schema 45)
  holds one such created job per key, which is what makes concurrent upserts of
  one key end on one job.
* :func:`blocked_keys` lists the keys of a key_strict_fifo queue that hold a
  ``failed`` job: those keys stay blocked until that job is retried or deleted.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Integer,
    Interval,
    Select,
    Text,
    Uuid,
    bindparam,
    cast,
    exists,
    func,
    literal_column,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP

from ...models.enums import JobState
from ...options import OPTION
from ..common.base import qname, seconds, state_text
from ..common.claim import policy_literal
from ..v26.send import _INPUT_TYPES
from . import job_now
from .tables import JOB, QUEUE

KEY_STRICT_FIFO = "key_strict_fifo"

UPDATE_OPTIONS: tuple[str, ...] = (
    "priority",
    "start_after",
    "retention_seconds",
    "expire_seconds",
    "deletion_seconds",
    "retry_limit",
    "retry_delay",
    "retry_backoff",
    "retry_delay_max",
    "dead_letter",
    "heartbeat_seconds",
)
"""The options ``update`` and ``upsert`` may change (pg-boss 12.38's UpdateOptions
but ``group``)."""

MATCHES = ("newest", "oldest", "all")
"""Which of several not-yet-active jobs of one key an update by key edits."""


@functools.cache
def update_jobs(*, by_id: bool, match: str, given: frozenset[str], notify: bool) -> Select[Any]:
    """Edit the not-yet-active jobs of queue ``:qname`` named by ``:target_id`` (``by_id``)
    or ``:target_key`` (``match`` of :data:`MATCHES`); return ``(id)`` per job edited.

    ``given`` names what is written: ``data`` (bound as JSON text ``:payload``),
    ``start_after`` (``:start_at`` or ``:start_in``) and the options of
    :data:`UPDATE_OPTIONS` (``:v_<option>``). With ``notify``, an edited job that is
    ready now is announced on ``:channel``; whatever ``notify``, on
    ``:node_channel`` too when the queue has ``notify`` set (Node's workers).
    """
    j = JOB
    key = (
        j.c.id == bindparam("target_id", type_=Uuid)
        if by_id
        else j.c.singleton_key == bindparam("target_key", type_=Text)
    )
    target = select(j.c.id).where(j.c.name == qname(), j.c.state < state_text(JobState.ACTIVE), key)
    if not by_id and match != "all":
        order = j.c.created_on.asc() if match == "oldest" else j.c.created_on.desc()
        target = target.order_by(order).limit(1)
    target_cte = target.cte("target")

    values: dict[str, Any] = {}
    if "data" in given:
        values["data"] = cast(bindparam("payload", type_=Text), JSONB)
    new_start: Any = j.c.start_after
    if "start_after" in given:
        new_start = func.coalesce(
            bindparam("start_at", type_=TIMESTAMP(timezone=True)),
            job_now()
            + func.coalesce(
                bindparam("start_in", type_=Interval),
                literal_column("interval '0'", Interval),
            ),
        )
        values["start_after"] = new_start
    if "retention_seconds" in given:
        retention = bindparam("v_retention_seconds", type_=Integer)
        values["keep_until"] = new_start + seconds(retention)
    elif "start_after" in given:
        values["keep_until"] = new_start + (j.c.keep_until - j.c.start_after)
    for name in UPDATE_OPTIONS:
        spec = OPTION[name]
        if name in given and spec.job_column is not None:
            values[spec.job_column] = bindparam(f"v_{name}", type_=_INPUT_TYPES[spec.kind])
    if not values:
        # Nothing to write: still name the jobs that would have been edited.
        values["id"] = j.c.id
    upd = (
        j.update()
        .where(
            j.c.id.in_(select(target_cte.c.id)),
            j.c.state < state_text(JobState.ACTIVE),
        )
        .values(values)
        .returning(j.c.id, j.c.start_after)
        .cte("upd")
    )
    ready = exists(select(upd.c.id).where(upd.c.start_after <= job_now()))
    columns: list[Any] = [upd.c.id]
    if notify:
        announce = (
            select(func.pg_notify(bindparam("channel", type_=Text), qname()))
            .where(ready)
            .scalar_subquery()
        )
        columns.append(announce.label("notified"))
    nq = QUEUE.alias("nq")
    node_announce = (
        select(func.pg_notify(bindparam("node_channel", type_=Text), qname()))
        .where(nq.c.name == qname(), nq.c.notify, ready)
        .scalar_subquery()
    )
    columns.append(node_announce.label("node_notified"))
    return select(*columns).select_from(upd).where(true())


@functools.cache
def blocked_keys(*, after: bool) -> Select[Any]:
    """The keys of key_strict_fifo queue ``:qname`` holding a ``failed`` job, in
    order, at most ``:limit``; with ``after``, only keys past ``:after``."""
    j = JOB
    conditions = [
        j.c.name == qname(),
        j.c.state == state_text(JobState.FAILED),
        j.c.policy == policy_literal(KEY_STRICT_FIFO),
    ]
    if after:
        conditions.append(j.c.singleton_key > bindparam("after", type_=Text))
    return (
        select(j.c.singleton_key)
        .distinct()
        .where(*conditions)
        .order_by(j.c.singleton_key)
        .limit(bindparam("limit", type_=Integer))
    )
