"""Queue reads at schema 46: the schema-26 settings and counters plus the
settings pg-boss 12 added that shape a queue's jobs (``heartbeat_seconds``,
``notify``)."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Select, Text, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY

from .._common import QUEUE as QUEUE26
from ..tables46 import QUEUE

READ_COLUMNS = (*(c.name for c in QUEUE26.c), "heartbeat_seconds", "notify")
"""The queue columns :class:`alkstore_sa.records.QueueInfo` holds at 46."""


@functools.cache
def get_queues(*, by_name: bool) -> Select[Any]:
    """All queues, or those in ``:names``, ordered by name."""
    stmt = select(*(QUEUE.c[name] for name in READ_COLUMNS)).order_by(QUEUE.c.name)
    if by_name:
        stmt = stmt.where(QUEUE.c.name == func.any(bindparam("names", type_=ARRAY(Text))))
    return stmt
