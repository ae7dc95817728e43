"""Every service operation, written once as a generator of statements.

An operation yields :class:`Call` objects and receives each one's buffered
``Result``; it never touches a session. ``QueueService`` drives it with a
``Session`` and ``AsyncQueueService`` with an ``AsyncSession``, so the two cannot
drift apart: they run the very same code.
"""

from . import attempts, flows, heartbeats, inspect, keys, observe, supervision
from ._core import (
    Call,
    Conflict,
    Context,
    Op,
    PolicyCache,
    check_schema,
    is_conflict,
    read_version,
)
from .queues import (
    create_queue,
    delete_queue,
    ensure_queue,
    get_queue,
    get_queue_stats,
    get_queues,
    update_queue,
)
from .schedules import get_schedules, schedule, unschedule
from .sending import (
    get_subscriptions,
    publish,
    send,
    send_debounced,
    send_many,
    subscribe,
    unsubscribe,
)
from .working import (
    FailResult,
    Settlement,
    cancel,
    complete_many,
    delete_by_state,
    delete_jobs,
    extend_leases,
    fail_many,
    fetch,
    get_jobs,
    give_back,
    redrive,
    resume,
    retry,
)

__all__ = [
    "Call",
    "Conflict",
    "Context",
    "FailResult",
    "Op",
    "PolicyCache",
    "Settlement",
    "attempts",
    "cancel",
    "check_schema",
    "complete_many",
    "create_queue",
    "delete_by_state",
    "delete_jobs",
    "delete_queue",
    "ensure_queue",
    "extend_leases",
    "fail_many",
    "fetch",
    "flows",
    "get_jobs",
    "get_queue",
    "get_queue_stats",
    "get_queues",
    "get_schedules",
    "get_subscriptions",
    "give_back",
    "heartbeats",
    "inspect",
    "is_conflict",
    "keys",
    "observe",
    "publish",
    "read_version",
    "redrive",
    "resume",
    "retry",
    "schedule",
    "send",
    "send_debounced",
    "send_many",
    "subscribe",
    "supervision",
    "unschedule",
    "unsubscribe",
    "update_queue",
]
