"""The worker's row in the instance registry (schema 46): registered at start, a
heartbeat every ``instance_heartbeat_seconds``, ``stopped_on`` at stop.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from typing import Any, TypeVar

from ..errors import SchemaVersionError
from ..ops import observe
from ..steps import Join, Steps, Wait
from ._core import WorkerCore

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")


class InstanceRegistration(WorkerCore[B]):
    """Registration, heartbeats and deregistration."""

    def _instance_values(self) -> dict[str, Any]:
        with self._book:
            in_flight: dict[str, int] = defaultdict(int)
            for a in self._attempts.values():
                in_flight[a.job.name] += 1
        reg = self._registration
        settings = self._supervisor.settings if self._supervisor is not None else None
        return reg.values(
            supervisor_settings=settings,
            pool=getattr(self.engine, "sync_engine", self.engine).pool,
            workers=reg.workers(self._specs.values(), in_flight),
            listen=self.listen,
        )

    def _beat(self) -> Steps[None]:
        """Register, or refresh the registration (an upsert: a row pruned meanwhile,
        or a schema upgraded to 46 since the start, is registered anew). A failure
        is logged and reported; the next beat tries again."""
        reg = self._registration
        try:
            op = observe.heartbeat_instance(
                self._ctx, self._instance_values(), reg.started_on, reg.process_start
            )
            reg.started_on = yield from self._op(op, autocommit=True)
        except SchemaVersionError:
            pass  # a version this release does not speak: the fetch loops report it
        except Exception as exc:
            self._loop_error("instance_heartbeat", None, exc, float(reg.heartbeat_seconds))

    def _registering(self) -> Steps[None]:
        """The heartbeat loop, every ``instance_heartbeat_seconds`` until stop."""
        while not (yield Wait(self._registrar_stop, float(self._registration.heartbeat_seconds))):
            yield from self._beat()

    def _deregistering(self) -> Steps[None]:
        """End the heartbeats and stamp ``stopped_on`` (best effort: a worker that
        cannot reach the database goes quiet instead, as a crashed one does)."""
        with self._book:
            self._deregistered = True
            registrar = self._registrar
        self._registrar_stop.set()
        if registrar is not None:
            yield Join([registrar], 5.0)
        if self._registration.started_on is None:
            return  # never registered (schema 26, or the database was unreachable)
        try:
            yield from self._op(
                observe.stop_instance(self._ctx, self._registration.id), autocommit=True
            )
        except Exception as exc:
            log.debug(
                "instance stop not recorded: %s",
                exc,
                extra={"action": "instance_stop_error", "worker": self.name},
            )

    @property
    def instance_id(self) -> uuid.UUID:
        """This worker's id in the instance registry (schema 46; listed by
        :meth:`~alkstore_sa.QueueService.get_instances`)."""
        return self._registration.id
