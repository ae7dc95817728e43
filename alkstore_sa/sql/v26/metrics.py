"""The statement behind the queue metrics (:mod:`alkstore_sa.metrics`) at schema 26.

A scrape must stay cheap on a job table of millions of rows, so nothing here counts
jobs. The counts come from the queue rows, where supervision's monitor caches them
(and stamps ``monitor_on``); the one number read from the jobs is the oldest ready
job's ``start_after``, a ``min()`` the planner answers from the front of a partial
index, one probe per queue and state. See the "Export Prometheus metrics" page.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Float, Select, cast, func, select

from ...models.enums import JobState
from ..common.base import JOB, QUEUE, state_text


def age(expr: Any) -> Any:
    """Seconds from ``expr`` to the statement's ``now()`` (NULL stays NULL)."""
    return cast(func.extract("epoch", func.now() - expr), Float)


@functools.cache
def queue_metrics() -> Select[Any]:
    """Per queue: the cached counters and the oldest ready job's age, at schema 26.

    Columns: ``name, queued, deferred, active, total, counted_age, oldest_ready_age``.
    ``state < 'active'`` with ``start_after`` as the ordered column is the predicate
    and key of ``job_i5`` (the fetch index), so the correlated ``min()`` is a single
    index probe per queue, on the queue's own partition when it has one.
    """
    q, j = QUEUE.alias("q"), JOB.alias("j")
    oldest = (
        select(func.min(j.c.start_after))
        .where(
            j.c.name == q.c.name,
            j.c.state < state_text(JobState.ACTIVE),
            j.c.start_after <= func.now(),
        )
        .scalar_subquery()
    )
    return select(*counters(q), age(oldest).label("oldest_ready_age")).order_by(q.c.name)


def counters(q: Any, *extra: str) -> list[Any]:
    """The queue row's cached counters every version reads (and ``<name>_count`` for
    each of ``extra``), with the age of the count: the columns before the oldest
    ready job's age."""
    return [
        q.c.name,
        q.c.queued_count.label("queued"),
        q.c.deferred_count.label("deferred"),
        q.c.active_count.label("active"),
        q.c.total_count.label("total"),
        *(q.c[f"{name}_count"].label(name) for name in extra),
        age(q.c.monitor_on).label("counted_age"),
    ]
