"""Workers at schema 46: Node pg-boss's NOTIFY channel wakes them, and heartbeats stay fresh.

- At 46 a worker LISTENs on Node 12's channel (``pgboss_`` + sha224(schema)[:24], the
  queue name as payload) besides ours, from the start or from the moment a live
  schema is seen at 46; at 26 it does not.
- A job with ``heartbeat_seconds`` is touched (``heartbeat_on`` stamped) at least every
  half heartbeat while its handler runs, lease extension or not, so Node's monitor never
  fails it for a heartbeat timeout.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from support.worker import Harness, claims, settled_claims, state_of, wait_for

from alkstore_sa import migrate, names
from alkstore_sa.records import Job
from alkstore_sa.sql.v46 import node_channel
from alkstore_sa.worker._attempt import Attempt
from alkstore_sa.worker.config import HandlerSpec

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def insert_quietly(h: Harness, queue: str) -> uuid.UUID:
    """A job inserted without any NOTIFY (as a raw insert would)."""
    [(job_id,)] = h.sql("INSERT INTO {s}.job (name, data) VALUES (:q, '{}') RETURNING id", q=queue)
    assert isinstance(job_id, uuid.UUID)
    return job_id


def notify_like_node(h: Harness, queue: str) -> None:
    h.sql("SELECT pg_notify(:c, :q)", c=node_channel(h.schema), q=queue)


def test_a_notification_on_node_channel_wakes_an_idle_worker_at_46(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q"))
    h.sql("UPDATE {s}.queue SET notify = true WHERE name = 'q'")
    w = h.start(h.worker(poll_interval=60, handlers={"q": h.handler()}))
    assert w.listener.wait_listening(node_channel(h.schema), 3)
    # The start's claims (one before the LISTEN, one after) are over; no poll for a minute.
    looked = settled_claims(w, "q")
    job_id = insert_quietly(h, "q")
    time.sleep(0.3)  # time to claim, were anything to wake the worker (nothing should)
    assert (claims(w, "q"), state_of(h, "q", job_id)) == (looked, "created")
    notify_like_node(h, "q")
    # Within 5 s, with polls 60 s apart: the notification woke it.
    wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=5)
    h.stop(w)


def test_a_node_notification_for_another_queue_does_not_wake_this_one(
    harness46: Harness,
) -> None:
    h = harness46
    h.service_tx(lambda q: (q.create_queue("q"), q.create_queue("other")))
    w = h.start(h.worker(poll_interval=60, handlers={"q": h.handler()}))
    assert w.listener.wait_listening(node_channel(h.schema), 3)
    looked = settled_claims(w, "q")
    quiet = insert_quietly(h, "q")
    notify_like_node(h, "other")
    # Proof the notification arrived and was read: one for "q" itself, sent after it on
    # the same channel, wakes the worker; "other"'s did not make it claim before that.
    time.sleep(0.3)
    assert (claims(w, "q"), state_of(h, "q", quiet)) == (looked, "created")
    notify_like_node(h, "q")
    wait_for(lambda: state_of(h, "q", quiet) == "completed", timeout=5)
    h.stop(w)


def test_a_worker_at_26_does_not_listen_on_node_channel(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    done: list[Any] = []
    w = h.start(h.worker(poll_interval=0.2, handlers={"q": h.handler(done.append)}))
    insert_quietly(h, "q")
    wait_for(lambda: done)  # the worker has read the version and fetched
    assert w.listener.wait_listening(w.channel, 1)
    assert not w.listener.wait_listening(node_channel(h.schema), 0.5)
    h.stop(w)


def test_an_idle_worker_listens_on_node_channel_once_its_schema_moves_to_46(
    harness: Harness, spoken46: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(names, "SCHEMA_RECHECK_SECONDS", 0.5)
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.start(h.worker(poll_interval=60, handlers={"q": h.handler()}))
    settled_claims(w, "q")  # the first (empty) claim is over; no other for a minute
    assert not w.listener.wait_listening(node_channel(h.schema), 0.1)
    migrate.upgrade(h.engine, h.schema, schema_version=46)
    assert w.listener.wait_listening(node_channel(h.schema), 10)
    assert w.listener.wait_listening(w.channel, 1)  # ours is kept
    settled_claims(w, "q", 2)  # the claim that follows the LISTEN is over
    job_id = insert_quietly(h, "q")
    notify_like_node(h, "q")
    # Within 5 s, with polls 60 s apart: Node's channel woke it.
    wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=5)
    assert w._ctx.version == 46
    h.stop(w)


def heartbeat_ages(h: Harness, job_id: uuid.UUID, seconds: float) -> list[tuple[float, Any, int]]:
    """Samples of (age of heartbeat_on in seconds, heartbeat_on, expire_seconds) while
    the job runs."""
    samples = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        [(age, beat, expire)] = h.sql(
            "SELECT extract(epoch FROM {s}.job_now() - heartbeat_on)::float, heartbeat_on, "
            "expire_seconds FROM {s}.job WHERE id = :i",
            i=job_id,
        )
        samples.append((age, beat, expire))
        time.sleep(0.2)
    return samples


@pytest.mark.parametrize("extend_lease", [True, False])
def test_a_running_job_with_heartbeat_seconds_is_touched_every_half_heartbeat(
    harness46: Harness, extend_lease: bool
) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("slow", expire_seconds=60))
    # heartbeat_seconds as Node sets it on the queue; sends copy it onto the job.
    h.sql("UPDATE {s}.queue SET heartbeat_seconds = 2 WHERE name = 'slow'")
    job_id = h.service_tx(lambda q: q.send("slow", {}))
    assert h.sql("SELECT heartbeat_seconds FROM {s}.job WHERE id = :i", i=job_id) == [(2,)]
    w = h.worker(
        poll_interval=0.2,
        extend_lease=extend_lease,
        handlers={"slow": h.handler(sleep=4.5)},
    )
    h.start(w)
    wait_for(lambda: state_of(h, "slow", job_id) == "active")
    samples = heartbeat_ages(h, job_id, 4.0)
    wait_for(lambda: state_of(h, "slow", job_id) == "completed", timeout=10)
    h.stop(w)
    ages = [age for age, _, _ in samples]
    assert max(ages) < 1.6, ages  # touched every second (half of 2 s), never near 2 s old
    assert len({beat for _, beat, _ in samples}) >= 4  # heartbeat_on moved, again and again
    expires = {expire for _, _, expire in samples}
    if extend_lease:
        assert max(expires) > 60  # the lease is pushed out with the touch
    else:
        assert max(expires) <= 60  # the lease keeps (at most) its original end
    assert w.stats()["slow"].lost == 0


def test_a_job_without_heartbeat_seconds_is_not_touched_before_half_its_lease(
    harness46: Harness,
) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("slow", expire_seconds=60))
    job_id = h.service_tx(lambda q: q.send("slow", {}))
    w = h.start(h.worker(poll_interval=0.2, handlers={"slow": h.handler(sleep=2.5)}))
    wait_for(lambda: state_of(h, "slow", job_id) == "active")
    samples = heartbeat_ages(h, job_id, 2.0)
    wait_for(lambda: state_of(h, "slow", job_id) == "completed", timeout=10)
    h.stop(w)
    assert len({beat for _, beat, _ in samples}) == 1  # stamped by the fetch only
    assert {expire for _, _, expire in samples} == {60}


def _attempt(heartbeat: int | None, expire: int, extend_lease: bool) -> Attempt:
    job = Job.__new__(Job)
    object.__setattr__(job, "heartbeat_seconds", heartbeat)
    object.__setattr__(job, "expire_seconds", expire)
    spec = HandlerSpec("q", lambda job: None, extend_lease=extend_lease)
    attempt = Attempt(job, spec, lease_start=100.0, deadline=None, lease_seconds=float(expire))
    attempt.start(100.0)
    return attempt


def test_a_touch_is_due_at_half_the_heartbeat_or_half_the_lease_whichever_comes_first() -> None:
    assert not _attempt(None, 60, True).lease_due(129.9)
    assert _attempt(None, 60, True).lease_due(130.0)
    assert not _attempt(10, 60, True).lease_due(104.9)
    assert _attempt(10, 60, True).lease_due(105.0)
    assert _attempt(100, 6, True).lease_due(103.0)  # the lease first
    assert not _attempt(None, 60, False).lease_due(1000.0)  # nothing to keep
    assert _attempt(10, 60, False).lease_due(105.0)  # the heartbeat, lease extension or not


def test_a_buffered_job_is_never_touched() -> None:
    """Claimed ahead and not started: a touch would raise the expire_seconds it is
    given back with, and it waits about a second at most (AHEAD_SECONDS)."""
    attempt = _attempt(10, 60, True)
    attempt.started = None
    assert not attempt.lease_due(1000.0)


def test_a_heartbeat_touch_without_lease_extension_keeps_the_lease_end() -> None:
    with_extension = _attempt(10, 60, True)
    without = _attempt(10, 60, False)
    assert with_extension.extend_by(105.0) == 60
    assert without.extend_by(105.0) == 55
    assert without.extend_by(105.5) == 54
    assert without.extend_by(1000.0) == 1
