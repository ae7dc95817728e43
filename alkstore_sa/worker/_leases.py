"""The keeper: leases renewed (and heartbeats stamped) before they run out, jobs past
their timeout abandoned, fetch-loop runs that ran long handed off (the "Architecture" page).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TypeVar

from .. import ops
from .._engine_cache import version_due
from ..steps import Run, Steps, Wait
from ._attempt import Attempt
from ._core import monotonic
from ._fetching import Fetching

log = logging.getLogger("alkstore_sa.worker")

B = TypeVar("B")

TICK = 0.2
"""Seconds between checks of leases and deadlines."""

RESCUE_FRACTION = 0.5
"""A worker sweeps its queues for jobs whose heartbeat stopped (schema 46), or whose
claimer stopped renewing (26), every this fraction of its ``liveness_seconds``."""

RENEW_FRACTION = 0.25
"""Schema 26: a worker renews its claimer row every this fraction of its
``liveness_seconds``, so a live worker's claims lapse only after four missed renewals."""


class Leases(Fetching[B]):
    """The keeper loop."""

    def _keeping(self) -> Steps[None]:
        """Renew leases of long jobs, keep heartbeats fresh, abandon jobs past their timeout.

        One statement touches a job for both: ``extend_leases`` also stamps
        ``heartbeat_on`` at schema 46 (pg-boss's ``touch``), so a job is touched
        at half its lease or half its ``heartbeat_seconds``, whichever comes first.
        """
        rescue_at = renew_at = monotonic()
        while not (yield Wait(self._keeper_stop, TICK)):
            if self._listener is not None and self._node_subscription is None:
                yield from self._watching_version()
            now = monotonic()
            if self.liveness_seconds is not None and now >= renew_at:
                renew_at = now + self.liveness_seconds * RENEW_FRACTION
                yield from self._renewing_claims(self.liveness_seconds)
            if self.liveness_seconds is not None and now >= rescue_at:
                rescue_at = now + self.liveness_seconds * RESCUE_FRACTION
                yield from self._rescuing()
            for state in self._queues.values():
                self._dispatch(state)  # one more runner for a job that runs long
                late = state.take_late(now)
                if late:
                    # Waited in the buffer behind a long job: back before the
                    # lease (or heartbeat) could run out, never started here.
                    yield from self._give_back(state, late, "unstarted (waited too long)")
            due: dict[tuple[str, int], list[Attempt]] = defaultdict(list)
            for attempt in self._running():
                if attempt.deadline is not None and now >= attempt.deadline:
                    self._abandon(attempt, "timeout")
                elif attempt.lease_due(now):
                    due[(attempt.job.name, attempt.extend_by(now))].append(attempt)
            for (queue, extend_by), attempts in due.items():
                yield from self._extending(queue, extend_by, attempts)

    def _renewing_claims(self, lapse: int) -> Steps[None]:
        """Schema 26: this worker is alive (its claimer row, one statement for all its
        claims, see sql/v26/claims.py); nothing at 46 or without the claim tables."""
        if self._ctx.has("touch"):
            return
        try:
            renewed = yield from self._op(
                ops.heartbeats.renew_claims(self._ctx, self._claimer_id, lapse), autocommit=True
            )
        except Exception as exc:
            self._loop_error("claim_renewal", None, exc, TICK)
            return
        if not renewed and not self._claims_off_said:
            self._claims_off_said = True
            log.info(
                "schema %r has no usable claim tables (alkstore_claim, alkstore_claimer): "
                "a crashed worker's jobs come back when their lease runs out; "
                "`alkstore db upgrade` makes and grants them",
                self.schema,
                extra={"action": "claims_unavailable", "worker": self.name},
            )
        elif renewed:
            self._claims_off_said = False

    def _rescuing(self) -> Steps[None]:
        """Fail for retry the jobs of our queues whose worker died or froze: at 46 their
        heartbeat stopped (``liveness_seconds``), at 26 their claimer stopped renewing, so
        they come back within about a minute, not after their lease or the supervision
        interval (see ops/heartbeats.py)."""
        names = [state.spec.queue for state in self._queues.values()]
        sweep = ops.heartbeats.rescue26 if not self._ctx.has("touch") else ops.heartbeats.rescue
        try:
            counts = yield from self._op(sweep(self._ctx, names))
        except Exception as exc:
            self._loop_error("rescue", None, exc, TICK)
            return
        for queue, n in counts.items():
            log.warning(
                "%d job(s) of %r failed for retry: the worker running them stopped "
                "answering (no heartbeat for its heartbeat_seconds)",
                n,
                queue,
                extra={"action": "jobs_rescued", "worker": self.name, "queue": queue, "count": n},
            )
            state = self._queues.get(queue)
            if state is not None:
                state.wake.set()

    def _watching_version(self) -> Steps[None]:
        """Read the schema version when the engine's reading is stale, so that an idle
        worker (a long ``poll_interval``, nothing due) whose schema moves to 46 starts
        listening on Node's channel within SCHEMA_RECHECK_SECONDS, not at its next poll."""
        due = version_due(self._ctx, self._engine_state)
        if due is not None:
            try:
                yield Run(due)
            except Exception as exc:
                # The fetch loops meet the same error on their next claim and report it.
                log.debug(
                    "version check failed: %s",
                    exc,
                    extra={"action": "version_check_error", "worker": self.name},
                )
                return
        if self._ctx.has("Node's notify channel"):
            yield from self._listening_to_node()

    def _extending(self, queue: str, extend_by: int, attempts: list[Attempt]) -> Steps[None]:
        started = monotonic()
        items = [a.settlement() for a in attempts]
        try:
            kept = set(
                (
                    yield from self._op(
                        ops.extend_leases(self._ctx, queue, items, extend_by), autocommit=True
                    )
                )
            )
        except Exception as exc:
            self._loop_error("lease", queue, exc, TICK)
            return
        for attempt in attempts:
            if attempt.job.id in kept:
                attempt.lease_start, attempt.lease_seconds = started, float(extend_by)
                log.debug(
                    "lease of job %s extended by %d s",
                    attempt.job.id,
                    extend_by,
                    extra=self._extra("lease_extended", attempt),
                )
            else:
                # Expired and failed, cancelled or deleted: no longer ours. The
                # attempt is abandoned as a timed-out one is, without a settlement.
                self._abandon(attempt, "lost")
