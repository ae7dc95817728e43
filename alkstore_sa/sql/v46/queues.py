"""Queue reads at schema 46: the schema-26 settings and counters plus the
settings pg-boss 12 added that shape a queue's jobs (``heartbeat_seconds``,
``notify``), and the update that can change them."""

from __future__ import annotations

import functools
from typing import Any

from sqlalchemy import Column, MetaData, Select, Table, Text, Update, bindparam, func, select
from sqlalchemy.dialects.postgresql import ARRAY

from ..common.base import QUEUE as QUEUE26
from ..common.reading import readable_columns
from . import job_now
from .tables import QUEUE

READ_COLUMNS = (*(c.name for c in QUEUE26.c), "heartbeat_seconds", "notify")
"""The queue columns :class:`alkstore_sa.records.QueueInfo` holds at 46."""

_READ = Table("queue", MetaData(), *(Column(n, QUEUE.c[n].type) for n in READ_COLUMNS))
"""Those columns, as :func:`~alkstore_sa.sql.common.reading.readable_columns` takes them."""


@functools.cache
def get_queues(*, by_name: bool) -> Select[Any]:
    """All queues, or those in ``:names``, ordered by name; read through
    ``readable_columns``, so a time another client wrote that Python cannot hold
    (``infinity``) is that row's ``unreadable``, not the read's failure."""
    stmt = select(*readable_columns(QUEUE.c, _READ)).order_by(QUEUE.c.name)
    if by_name:
        stmt = stmt.where(QUEUE.c.name == func.any(bindparam("names", type_=ARRAY(Text))))
    return stmt


@functools.cache
def update_queue(columns: tuple[str, ...]) -> Update:
    """Set ``columns`` (bound as ``:v_<column>``) on queue ``:qname`` at schema 46.

    As :func:`alkstore_sa.sql.v26.queues.update_queue`, on the table of 46: the columns
    include ``heartbeat_seconds`` (``None`` clears it, as pg-boss's updateQueue
    does for a null ``heartbeatSeconds``) and ``notify``; ``updated_on`` comes from
    ``job_now()``, the clock pg-boss 12.38 stamps queues with.
    """
    values: dict[str, Any] = {c: bindparam(f"v_{c}", type_=QUEUE.c[c].type) for c in columns}
    values["updated_on"] = job_now()
    return (
        QUEUE.update()
        .where(QUEUE.c.name == bindparam("qname", type_=Text))
        .values(values)
        .returning(QUEUE.c.name)
    )
