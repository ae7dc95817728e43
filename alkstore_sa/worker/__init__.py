"""Workers: run handlers for queued jobs (threads or asyncio).

Example::

    from alkstore_sa import Worker
    worker = Worker(engine, schema="pgboss")
    @worker.handler("emails", concurrency=5)
    def send_email(job):
        mailer.send(**job.data)
    worker.run()

See ``the "Run workers" page`` for the full picture: wake-ups, fencing,
leases, timeouts and graceful shutdown.
"""

from ._attempt import QueueCounts, shutdown_output, timeout_output
from .aio import AsyncWorker
from .config import HandlerSpec
from .listener import Listener
from .threaded import Worker

__all__ = [
    "AsyncWorker",
    "HandlerSpec",
    "Listener",
    "QueueCounts",
    "Worker",
    "shutdown_output",
    "timeout_output",
]
