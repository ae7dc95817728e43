"""The statement behind the queue metrics (:mod:`alkstore_sa.metrics`) at schema 46.

As at 26 (the "Export Prometheus metrics" page): the counts come from the queue
rows, and the only reads of the jobs are index probes for the oldest ready job.
"""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, and_, false, func, select

from ...models.enums import JobState
from ..common.base import state_text
from ..v26.metrics import age, counters
from . import tables as t46


@functools.cache
def queue_metrics() -> Select[Any]:
    """As :func:`alkstore_sa.sql.v26.metrics.queue_metrics`, at schema 46, with its extra counters.

    Columns: ``name, queued, deferred, active, total, failed, ready, blocked,
    counted_age, oldest_ready_age``. A ready job is ``created`` or ``retry``, not
    ``blocked`` (a flow's job waiting for its parents) and due. One ``min()`` per
    state, each an equality prefix of ``job_i14`` ``(name, state, blocked,
    start_after)``, so each is one index probe; ``state < 'active'`` would be a
    range on ``state`` and could not take the first entry.
    """
    q, j = t46.QUEUE.alias("q"), t46.JOB.alias("j")

    def oldest(state: JobState) -> Any:
        return (
            select(func.min(j.c.start_after))
            .where(
                and_(
                    j.c.name == q.c.name,
                    j.c.state == state_text(state),
                    j.c.blocked == false(),
                    j.c.start_after <= func.now(),
                )
            )
            .scalar_subquery()
        )

    # least() ignores NULLs: a queue with ready jobs in one state only still has an age.
    first = func.least(oldest(JobState.CREATED), oldest(JobState.RETRY))
    return select(
        *counters(q, "failed", "ready", "blocked"), age(first).label("oldest_ready_age")
    ).order_by(q.c.name)
