"""Fencing: a settlement given the fetched Job applies only to that attempt while it
is still active; one given an id is unfenced, as pg-boss's complete and fail by id.

Expiry is driven by ``supervise(now=...)``, a clock ahead of the database's, so
a job's lease runs out without waiting for it.
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from typing import Any

import pytest
from support.refusals import refused_in_transaction
from support.worker import Harness, send, wait_for

from alkstore_sa import InvalidOptionsError, Job, Settlement

TIMED_OUT = {"value": {"message": "job timed out"}}


@pytest.fixture
def queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue("q", expire_seconds=5))
    return "q"


def row(env: Any, job_id: uuid.UUID) -> Any:
    [found] = env.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    return found


def fetched(env: Any, queue: str, **options: Any) -> Job:
    job_id = env.tx(lambda q: q.send(queue, None, **options))
    [job] = env.tx(lambda q: q.fetch(queue))
    assert job.id == job_id and job.started_on is not None
    return job  # type: ignore[no-any-return]


def expire(env: Any, queue: str, expected: int = 1) -> None:
    """Run expiry with a clock past every lease (the supervisor's pass)."""
    [(now,)] = env.sql("SELECT now()")
    later = now + dt.timedelta(seconds=60)
    report = env.tx(lambda q: q.supervise(queue, force=True, now=later))
    assert report.expired == {queue: expected}


def refetch(env: Any, queue: str, stale: Job) -> Job:
    """Another worker fetches the job again after expiry moved it to retry."""
    time.sleep(0.01)  # the re-fetch runs at a later now() than the first fetch
    [again] = env.tx(lambda q: q.fetch(queue))
    assert again.id == stale.id and again.started_on != stale.started_on
    return again  # type: ignore[no-any-return]


# ------------------------------------------------------------------ complete


def test_stale_complete_by_job_after_expiry_and_refetch_changes_nothing(
    env: Any, queue: str
) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    current = refetch(env, queue, stale)
    assert env.tx(lambda q: q.complete(queue, stale, {"by": "stale"})).affected == []
    after = row(env, stale.id)
    assert (after.state, after.started_on) == ("active", current.started_on)
    assert after.output == TIMED_OUT  # what expiry wrote; the stale output is nowhere


def test_stale_complete_by_job_leaves_the_new_attempts_output_intact(env: Any, queue: str) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    current = refetch(env, queue, stale)
    assert env.tx(lambda q: q.complete(queue, current, {"by": "current"})).affected == [current.id]
    before = row(env, current.id)
    assert env.tx(lambda q: q.complete(queue, stale, {"by": "stale"})).affected == []
    assert row(env, current.id) == before
    assert before.output == {"by": "current"}


def test_fenced_complete_of_the_active_attempt_completes(env: Any, queue: str) -> None:
    job = fetched(env, queue)
    settled = env.tx(lambda q: q.complete(queue, job, {"ok": True}))
    assert (settled.requested, settled.affected) == (1, [job.id])
    after = row(env, job.id)
    assert (after.state, after.output) == ("completed", {"ok": True})


def test_fenced_complete_of_a_completed_job_changes_nothing(env: Any, queue: str) -> None:
    job = fetched(env, queue)
    env.tx(lambda q: q.complete(queue, job, "first"))
    assert env.tx(lambda q: q.complete(queue, job, "second")).affected == []
    assert row(env, job.id).output == {"value": "first"}


def test_complete_by_id_after_refetch_completes_the_current_attempt_unfenced(
    env: Any, queue: str
) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    refetch(env, queue, stale)
    # An id is not a fencing token: it completes whatever attempt is active now.
    assert env.tx(lambda q: q.complete(queue, stale.id, "admin")).affected == [stale.id]
    after = row(env, stale.id)
    assert (after.state, after.output) == ("completed", {"value": "admin"})


# ------------------------------------------------------------------ fail


def test_stale_fail_by_job_after_expiry_moved_it_to_retry_changes_nothing(
    env: Any, queue: str
) -> None:
    stale = fetched(env, queue, retry_delay=3600)
    expire(env, queue)
    before = row(env, stale.id)
    # The retry row keeps started_on: only the state tells the attempt is over.
    assert (before.state, before.started_on) == ("retry", stale.started_on)
    assert env.tx(lambda q: q.fail(queue, stale, {"by": "stale"})).affected == []
    after = row(env, stale.id)
    assert after == before
    assert (after.output, after.start_after) == (TIMED_OUT, before.start_after)


def test_stale_fail_many_by_job_after_expiry_reports_no_state(env: Any, queue: str) -> None:
    stale = fetched(env, queue, retry_delay=3600)
    expire(env, queue)
    before = row(env, stale.id)
    result = env.tx(lambda q: q.fail_many(queue, [(stale, "late")]))
    assert (result.affected, result.states, result.dead_lettered) == ([], {}, 0)
    assert row(env, stale.id) == before


def test_stale_fail_by_job_after_refetch_leaves_the_new_attempt_active(
    env: Any, queue: str
) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    current = refetch(env, queue, stale)
    assert env.tx(lambda q: q.fail(queue, stale, "late")).affected == []
    after = row(env, stale.id)
    assert (after.state, after.started_on, after.retry_count) == (
        "active",
        current.started_on,
        current.retry_count,
    )


def test_fenced_fail_of_the_active_attempt_retries(env: Any, queue: str) -> None:
    job = fetched(env, queue, retry_delay=60)
    assert env.tx(lambda q: q.fail(queue, job, {"message": "boom"})).affected == [job.id]
    after = row(env, job.id)
    assert (after.state, after.output) == ("retry", {"message": "boom"})


def test_fail_by_id_still_fails_a_job_in_retry_unfenced(env: Any, queue: str) -> None:
    stale = fetched(env, queue, retry_delay=3600)
    expire(env, queue)
    before = row(env, stale.id)
    # pg-boss's fail by id accepts any unfinished job, retry included.
    assert env.tx(lambda q: q.fail(queue, stale.id, "admin")).affected == [stale.id]
    after = row(env, stale.id)
    assert (after.state, after.output) == ("retry", {"value": "admin"})
    assert after.start_after > before.start_after  # the retry delay started again


# ------------------------------------------------------------------ many and mixed


def test_complete_many_with_jobs_completes_only_current_attempts(env: Any, queue: str) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    current = refetch(env, queue, stale)
    other = fetched(env, queue)
    settled = env.tx(
        lambda q: q.complete_many(queue, [(stale, "stale"), (other, {"n": 2}), current])
    )
    assert settled.requested == 3
    assert sorted(settled.affected) == sorted([other.id, current.id])
    assert row(env, other.id).output == {"n": 2}
    assert (row(env, current.id).state, row(env, current.id).output) == ("completed", None)


def test_complete_with_a_list_mixing_jobs_and_ids(env: Any, queue: str) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    refetch(env, queue, stale)
    by_id = fetched(env, queue)
    by_job = fetched(env, queue)
    settled = env.tx(lambda q: q.complete(queue, [stale, str(by_id.id), by_job], "done"))
    assert sorted(settled.affected) == sorted([by_id.id, by_job.id])
    assert row(env, stale.id).state == "active"


def test_complete_many_mixing_jobs_ids_pairs_and_settlements(env: Any, queue: str) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    current = refetch(env, queue, stale)
    a, b, c = (fetched(env, queue) for _ in range(3))
    items = [
        (stale, "stale"),  # fenced, stale: skipped
        (a.id, "by id"),  # unfenced
        Settlement(b.id, "settlement", b.started_on),  # fenced, current
        c,  # fenced, output None
    ]
    settled = env.tx(lambda q: q.complete_many(queue, items))
    assert sorted(settled.affected) == sorted([a.id, b.id, c.id])
    assert [row(env, j.id).output for j in (a, b, c)] == [
        {"value": "by id"},
        {"value": "settlement"},
        None,
    ]
    assert (row(env, current.id).state, row(env, current.id).started_on) == (
        "active",
        current.started_on,
    )


def test_fail_many_with_jobs_fails_only_current_attempts(env: Any, queue: str) -> None:
    stale = fetched(env, queue, retry_delay=3600)
    expire(env, queue)
    current = fetched(env, queue, retry_limit=0)
    result = env.tx(lambda q: q.fail_many(queue, [(stale, "late"), (current, "boom")]))
    assert result.affected == [current.id]
    assert result.states == {current.id: "failed"}
    assert row(env, stale.id).output == TIMED_OUT


def test_extend_leases_with_a_stale_job_extends_nothing(env: Any, queue: str) -> None:
    stale = fetched(env, queue)
    expire(env, queue)
    current = refetch(env, queue, stale)
    assert env.tx(lambda q: q.extend_leases(queue, [stale], 600)) == []
    assert row(env, current.id).expire_seconds == 5
    assert env.tx(lambda q: q.extend_leases(queue, [current], 600)) == [current.id]
    assert row(env, current.id).expire_seconds > 5


# ------------------------------------------------------------------ bad input


def _refused(env: Any, call: Any, match: str) -> None:
    """``call`` raises before any SQL and the transaction goes on."""
    svc = env.service()
    with pytest.raises(InvalidOptionsError, match=match):
        call(svc)
    assert svc.send("q", None) is not None
    env.commit()


def test_a_job_of_another_queue_is_refused(env: Any, queue: str) -> None:
    env.tx(lambda q: q.create_queue("other"))
    job = fetched(env, "other")
    _refused(env, lambda q: q.complete(queue, job), "belongs to queue 'other'")
    _refused(env, lambda q: q.fail_many(queue, [job]), "belongs to queue 'other'")
    assert row(env, job.id).state == "active"


def test_a_job_that_was_never_fetched_is_refused(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None))
    queued = env.tx(lambda q: q.get_job(queue, job_id))
    assert queued.started_on is None
    _refused(env, lambda q: q.complete(queue, queued), "no started_on")
    _refused(env, lambda q: q.fail(queue, [queued]), "no started_on")
    assert row(env, job_id).state == "created"


def test_a_pair_of_the_wrong_length_is_refused(env: Any, queue: str) -> None:
    job = fetched(env, queue)
    _refused(env, lambda q: q.complete_many(queue, [(job, "out", "extra")]), "pair")
    _refused(env, lambda q: q.complete(queue, 42), "jobs")
    assert row(env, job.id).state == "active"


# ------------------------------------------------------------------ workers


def _db_later(h: Harness, seconds: float) -> dt.datetime:
    [(now,)] = h.sql("SELECT now()")
    return now + dt.timedelta(seconds=seconds)  # type: ignore[no-any-return]


def test_stale_worker_attempt_cannot_fail_a_job_expiry_moved_to_retry(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", expire_seconds=5, retry_delay=3600))
    job_id = send(h, "q")
    retry_rows: list[Any] = []

    def expire_then_raise(job: Job) -> None:
        h.service_tx(lambda q: q.supervise("q", force=True, now=_db_later(h, 60)))
        retry_rows.extend(h.sql("SELECT * FROM {s}.job WHERE id = :id", id=job.id))
        raise RuntimeError("too late")

    w = h.worker(poll_interval=30)
    w.register("q", h.handler(body=expire_then_raise))
    h.start(w)
    wait_for(lambda: w.stats()["q"].lost == 1)
    h.stop(w)
    [before] = retry_rows
    assert (before.state, before.output) == ("retry", TIMED_OUT)
    [after] = h.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    assert after == before  # the worker's failure did not overwrite the timeout
    assert w.stats()["q"].failed == 0


@pytest.mark.parametrize("late", ["complete", "fail"])
def test_stale_worker_attempt_cannot_settle_a_refetched_job(harness: Harness, late: str) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", expire_seconds=5))
    job_id = send(h, "q")
    second: list[Job] = []

    def expire_and_refetch(job: Job) -> None:
        # What a supervisor and a second worker do while this handler still runs.
        h.service_tx(lambda q: q.supervise("q", force=True, now=_db_later(h, 60)))
        time.sleep(0.01)
        second.extend(h.service_tx(lambda q: q.fetch("q")))

    def body(job: Job) -> Any:
        if late == "fail":
            raise RuntimeError("late")
        return {"late": True}

    w = h.worker(poll_interval=30)
    w.register("q", h.handler(body=body, on_start=expire_and_refetch))
    h.start(w)
    wait_for(lambda: w.stats()["q"].lost == 1)
    h.stop(w)
    [again] = second
    assert again.id == job_id
    [now] = h.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    assert (now.state, now.started_on, now.output) == ("active", again.started_on, TIMED_OUT)
    stats = w.stats()["q"]
    assert (stats.completed, stats.failed) == (0, 0)


def test_drain_does_not_settle_a_job_refetched_while_its_handler_ran(
    engine: Any, schema: str
) -> None:
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService
    from alkstore_sa.testing import drain

    def tx(fn: Any) -> Any:
        with Session(engine) as session, session.begin():
            return fn(QueueService(session, schema=schema))

    tx(lambda q: q.create_queue("q", expire_seconds=5))
    job_id = tx(lambda q: q.send("q", None))
    second: list[Job] = []

    def handler(job: Job) -> Any:
        with engine.connect() as conn:
            [(db_now,)] = conn.exec_driver_sql("SELECT now()").all()
        tx(lambda q: q.supervise("q", force=True, now=db_now + dt.timedelta(seconds=60)))
        time.sleep(0.01)
        second.extend(tx(lambda q: q.fetch("q")))
        return {"late": True}

    drain(engine, {"q": handler}, schema=schema)
    [again] = second
    job = tx(lambda q: q.get_job("q", job_id))
    assert (job.state.value, job.started_on, job.output) == ("active", again.started_on, TIMED_OUT)


@pytest.mark.parametrize(
    "now",
    [
        dt.datetime(9999, 12, 31, tzinfo=dt.UTC),
        dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        dt.datetime.now(dt.UTC) + dt.timedelta(hours=2),
    ],
    ids=["year-9999", "epoch", "two-hours-ahead"],
)
def test_supervise_now_is_a_test_clock_not_a_delete_everything_knob(
    env: Any, queue: str, now: dt.datetime
) -> None:
    started = fetched(env, queue)
    queued = env.tx(lambda q: q.send(queue, {"keep": True}))
    refused = refused_in_transaction(env, queue, lambda q: q.supervise(queue, force=True, now=now))
    assert refused.option == "now" and "within 1:00:00 of the current time" in refused.problem
    # Nothing expired or deleted.
    assert row(env, queued).state == "created" and row(env, started.id).state == "active"
