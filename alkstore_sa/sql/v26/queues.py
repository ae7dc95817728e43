"""Queue, schedule and subscription statements (pg-boss's
create_queue(), queue operations and cron schedules)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import (
    Select,
    Text,
    Update,
    bindparam,
    delete,
    func,
    select,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, insert

from ...models.enums import JobState
from ..common.base import (
    JOB,
    QUEUE,
    SCHEDULE,
    SUBSCRIPTION,
    create_queue_fn,
    delete_queue_fn,
    state_text,
)
from ..common.reading import readable_columns, readable_schedules


@functools.cache
def create_queue() -> Select[Any]:
    """Call the schema's ``create_queue(:qname, :options)``, as Node pg-boss does."""
    return select(
        create_queue_fn(
            bindparam("qname", type_=Text), func.cast(bindparam("options", type_=Text), JSONB)
        )
    )


@functools.cache
def delete_queue() -> Select[Any]:
    """Call the schema's ``delete_queue(:qname)``."""
    return select(delete_queue_fn(bindparam("qname", type_=Text)))


@functools.cache
def get_queues(*, by_name: bool) -> Select[Any]:
    """All queues, or those in ``:names``, ordered by name; read through
    ``readable_columns``, so a time another client wrote that Python cannot hold
    (``infinity``) is that row's ``unreadable``, not the read's failure."""
    stmt = select(*readable_columns(QUEUE.c, QUEUE)).order_by(QUEUE.c.name)
    if by_name:
        stmt = stmt.where(QUEUE.c.name == func.any(bindparam("names", type_=ARRAY(Text))))
    return stmt


@functools.cache
def update_queue(columns: tuple[str, ...]) -> Update:
    """Set ``columns`` (bound by their own names) and ``updated_on`` on queue ``:qname``."""
    values: dict[str, Any] = {c: bindparam(f"v_{c}", type_=QUEUE.c[c].type) for c in columns}
    values["updated_on"] = func.now()
    return (
        QUEUE.update()
        .where(QUEUE.c.name == bindparam("qname", type_=Text))
        .values(values)
        .returning(QUEUE.c.name)
    )


@functools.cache
def queue_references() -> Select[Any]:
    """Queues that name ``:qname`` as dead letter queue (``queues``, NULL for none).

    Jobs that do are left to the foreign key's check at the delete: nothing
    indexes ``job.dead_letter``, and asking here would read the job table once
    more (the "Limits" page)."""
    other = QUEUE.alias("other")
    uses = (
        select(func.array_agg(other.c.name))
        .where(other.c.dead_letter == bindparam("qname", type_=Text))
        .scalar_subquery()
    )
    return select(uses.label("queues"))


@functools.cache
def live_stats(*, by_name: bool) -> Select[Any]:
    """Live counts per queue (all queues, or ``:names``); zero for a queue with no jobs.

    Counts: deferred = ``start_after > now()``, queued = created/retry,
    active, total, and the keys of active singleton/stately jobs.
    """
    j = JOB
    names = bindparam("names", type_=ARRAY(Text))
    counts_query = select(
        j.c.name,
        func.count().filter(j.c.start_after > func.now()).label("deferred_count"),
        func.count().filter(j.c.state < state_text(JobState.ACTIVE)).label("queued_count"),
        func.count().filter(j.c.state == state_text(JobState.ACTIVE)).label("active_count"),
        func.count().label("total_count"),
        func.array_remove(
            func.array_agg(func.distinct(j.c.singleton_key)).filter(
                j.c.state == state_text(JobState.ACTIVE),
                j.c.policy.in_(("singleton", "stately")),
            ),
            None,
        ).label("singletons_active"),
    ).group_by(j.c.name)
    if by_name:
        counts_query = counts_query.where(j.c.name == func.any(names))
    counts = counts_query.subquery("counts")
    q = QUEUE
    stmt = (
        select(
            q.c.name,
            func.coalesce(counts.c.deferred_count, 0).label("deferred_count"),
            func.coalesce(counts.c.queued_count, 0).label("queued_count"),
            func.coalesce(counts.c.active_count, 0).label("active_count"),
            func.coalesce(counts.c.total_count, 0).label("total_count"),
            counts.c.singletons_active,
        )
        .select_from(q.outerjoin(counts, counts.c.name == q.c.name))
        .order_by(q.c.name)
    )
    if by_name:
        stmt = stmt.where(q.c.name == func.any(names))
    return stmt


@functools.cache
def upsert_schedule() -> Any:
    """Insert or replace the schedule ``(:qname, :key)``."""
    stmt = insert(SCHEDULE).values(
        name=bindparam("qname", type_=Text),
        key=bindparam("key", type_=Text),
        cron=bindparam("cron", type_=Text),
        timezone=bindparam("timezone", type_=Text),
        data=func.cast(bindparam("data", type_=Text), JSONB),
        options=func.cast(bindparam("options", type_=Text), JSONB),
    )
    return stmt.on_conflict_do_update(
        index_elements=[SCHEDULE.c.name, SCHEDULE.c.key],
        set_={
            "cron": stmt.excluded.cron,
            "timezone": stmt.excluded.timezone,
            "data": stmt.excluded.data,
            "options": stmt.excluded.options,
            "updated_on": func.now(),
        },
    )


@functools.cache
def delete_schedule() -> Any:
    return delete(SCHEDULE).where(
        SCHEDULE.c.name == bindparam("qname", type_=Text),
        SCHEDULE.c.key == bindparam("key", type_=Text),
    )


@functools.cache
def get_schedules(*, by_name: bool, by_key: bool) -> Select[Any]:
    return readable_schedules(SCHEDULE, by_name=by_name, by_key=by_key)


@functools.cache
def subscribe() -> Any:
    stmt = insert(SUBSCRIPTION).values(
        event=bindparam("event", type_=Text), name=bindparam("qname", type_=Text)
    )
    return stmt.on_conflict_do_update(
        index_elements=[SUBSCRIPTION.c.event, SUBSCRIPTION.c.name],
        set_={"updated_on": func.now()},
    )


@functools.cache
def unsubscribe() -> Any:
    return delete(SUBSCRIPTION).where(
        SUBSCRIPTION.c.event == bindparam("event", type_=Text),
        SUBSCRIPTION.c.name == bindparam("qname", type_=Text),
    )


@functools.cache
def get_subscriptions(*, by_name: bool, by_event: bool) -> Select[Any]:
    """Subscriptions by event and queue, through ``readable_columns`` (a time Python
    cannot hold is the row's ``unreadable``); of ``:qname`` / ``:event`` when asked."""
    stmt = select(*readable_columns(SUBSCRIPTION.c, SUBSCRIPTION)).order_by(
        SUBSCRIPTION.c.event, SUBSCRIPTION.c.name
    )
    if by_name:
        stmt = stmt.where(SUBSCRIPTION.c.name == bindparam("qname", type_=Text))
    if by_event:
        stmt = stmt.where(SUBSCRIPTION.c.event == bindparam("event", type_=Text))
    return stmt


@functools.cache
def subscribers() -> Select[Any]:
    return (
        select(SUBSCRIPTION.c.name)
        .where(SUBSCRIPTION.c.event == bindparam("event", type_=Text))
        .order_by(SUBSCRIPTION.c.name)
    )
