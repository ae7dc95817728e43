"""Supervision: expiration, retention, queue counters and cron, beside the workers.

:class:`Supervisor` (a thread) and :class:`AsyncSupervisor` (an asyncio task) run
the supervision pass of :mod:`alkstore_sa.ops.supervision` on a timer, each unit
in a short transaction of its own. Workers run one by default; ``alkstore
maintain`` runs one from the command line; ``QueueService.supervise`` runs a pass
inline instead. See the "Supervision and cron" page.
"""

from .supervisor import AsyncSupervisor, QueueWarning, Settings, SupervisionReport, Supervisor

__all__ = ["AsyncSupervisor", "QueueWarning", "Settings", "SupervisionReport", "Supervisor"]
