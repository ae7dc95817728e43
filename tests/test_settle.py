"""complete, cancel, resume, retry, delete, get and redrive; fencing
(pg-boss's job operations)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from alkstore_sa import Job, JobState, Settlement


def job_row(env: Any, job_id: uuid.UUID) -> Any:
    rows = env.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    return rows[0] if rows else None


def states(env: Any, queue: str) -> dict[uuid.UUID, str]:
    return {
        r.id: r.state for r in env.sql("SELECT id, state FROM {s}.job WHERE name = :q", q=queue)
    }


@pytest.fixture
def queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue("q"))
    return "q"


def started(job: Job) -> dt.datetime:
    assert job.started_on is not None
    return job.started_on


def active_job(env: Any, queue: str, **options: Any) -> Job:
    job_id = env.tx(lambda q: q.send(queue, None, **options))
    [job] = env.tx(lambda q: q.fetch(queue))
    assert job.id == job_id
    return job  # type: ignore[no-any-return]


# ------------------------------------------------------------------ complete


def test_complete_marks_an_active_job_completed(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    svc = env.service()
    settled = svc.complete(queue, job.id, {"ok": True})
    now = env.session.execute(text("SELECT now()")).scalar_one()
    env.commit()
    assert (settled.requested, settled.affected, settled.count) == (1, [job.id], 1)
    row = job_row(env, job.id)
    assert (row.state, row.completed_on, row.output) == ("completed", now, {"ok": True})


def test_complete_only_changes_active_jobs(env: Any, queue: str) -> None:
    created = env.tx(lambda q: q.send(queue, None, priority=-1))
    completed = active_job(env, queue).id
    env.tx(lambda q: q.complete(queue, completed))
    cancelled = env.tx(lambda q: q.send(queue, None, priority=-1))
    env.tx(lambda q: q.cancel(queue, cancelled))
    ids = [created, completed, cancelled]
    before = [job_row(env, i) for i in ids]
    settled = env.tx(lambda q: q.complete(queue, ids, "late"))
    assert settled.affected == []
    assert [job_row(env, i) for i in ids] == before


OUTPUTS: list[tuple[Any, Any]] = [
    (None, None),
    ({"a": [1, {"b": None}]}, {"a": [1, {"b": None}]}),
    ({}, {}),
    ([1, 2], {"value": [1, 2]}),
    ("done", {"value": "done"}),
    (42, {"value": 42}),
    (0, {"value": 0}),
    (False, {"value": False}),
    (2.5, {"value": 2.5}),
]


def test_complete_output_mapping(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send_many(queue, [{} for _ in OUTPUTS]))
    jobs = env.tx(lambda q: q.fetch(queue, len(OUTPUTS)))
    for job, (output, stored) in zip(jobs, OUTPUTS, strict=True):
        env.tx(lambda q, j=job, o=output: q.complete(queue, j.id, o))
        [(value, is_null)] = env.sql(
            "SELECT output, output IS NULL FROM {s}.job WHERE id = :id", id=job.id
        )
        assert value == stored, output
        assert is_null is (stored is None), output


def test_complete_stores_an_exception_as_name_message_and_stack(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    env.tx(lambda q: q.complete(queue, job.id, ValueError("odd")))
    output = job_row(env, job.id).output
    assert (output["name"], output["message"]) == ("ValueError", "odd")
    assert "ValueError: odd" in output["stack"]


def test_complete_many_stores_each_jobs_output(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send_many(queue, [{"data": n} for n in range(3)]))
    jobs = env.tx(lambda q: q.fetch(queue, 3))
    items = [Settlement(j.id, {"n": j.data}) for j in jobs]
    settled = env.tx(lambda q: q.complete_many(queue, items))
    assert sorted(settled.affected) == sorted(j.id for j in jobs)
    assert {job_row(env, j.id).output["n"] for j in jobs} == {0, 1, 2}


def test_complete_accepts_several_ids(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send_many(queue, [{}, {}]))
    jobs = env.tx(lambda q: q.fetch(queue, 2))
    missing = uuid.uuid4()
    settled = env.tx(lambda q: q.complete(queue, [str(j.id) for j in jobs] + [missing]))
    assert settled.requested == 3
    assert sorted(settled.affected) == sorted(j.id for j in jobs)


def test_complete_ignores_a_job_of_another_queue(env: Any, queue: str) -> None:
    env.tx(lambda q: q.create_queue("other"))
    job = active_job(env, "other")
    assert env.tx(lambda q: q.complete(queue, job.id)).affected == []
    assert job_row(env, job.id).state == "active"


# ------------------------------------------------------------------ fencing


def test_complete_with_a_stale_fence_changes_nothing(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    stale = started(job) - dt.timedelta(seconds=1)
    settled = env.tx(lambda q: q.complete_many(queue, [Settlement(job.id, "x", stale)]))
    assert settled.affected == []
    assert job_row(env, job.id).state == "active"


def test_complete_with_the_current_fence_completes(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    item = Settlement(job.id, "x", job.started_on)
    assert env.tx(lambda q: q.complete_many(queue, [item])).affected == [job.id]


def test_fail_with_a_stale_fence_changes_nothing(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    before = job_row(env, job.id)
    stale = started(job) + dt.timedelta(microseconds=1)
    result = env.tx(lambda q: q.fail_many(queue, [Settlement(job.id, "x", stale)]))
    assert result.affected == [] and result.states == {}
    assert job_row(env, job.id) == before


def test_worker_of_an_earlier_attempt_cannot_settle_the_next_one(env: Any, queue: str) -> None:
    first = active_job(env, queue, retry_limit=1)
    env.tx(lambda q: q.fail(queue, first.id))  # e.g. expired and failed by the supervisor
    [second] = env.tx(lambda q: q.fetch(queue))
    old = Settlement(first.id, "late", first.started_on)
    assert env.tx(lambda q: q.complete_many(queue, [old])).affected == []
    assert env.tx(lambda q: q.fail_many(queue, [old])).affected == []
    row = job_row(env, first.id)
    assert (row.state, row.started_on) == ("active", second.started_on)


def test_extend_leases_pushes_expiry_of_the_fenced_attempt(env: Any, queue: str) -> None:
    job = active_job(env, queue, expire_seconds=10)
    stale = Settlement(job.id, None, started(job) - dt.timedelta(seconds=1))
    assert env.tx(lambda q: q.extend_leases(queue, [stale], 600)) == []
    assert job_row(env, job.id).expire_seconds == 10
    current = Settlement(job.id, None, job.started_on)
    assert env.tx(lambda q: q.extend_leases(queue, [current], 600)) == [job.id]
    row = job_row(env, job.id)
    [(now,)] = env.sql("SELECT now()")
    lease_end = row.started_on + dt.timedelta(seconds=row.expire_seconds)
    assert now + dt.timedelta(seconds=599) <= lease_end <= now + dt.timedelta(seconds=602)


# ------------------------------------------------------------------ cancel, resume, retry


def test_cancel_finishes_unfinished_jobs(env: Any, queue: str) -> None:
    created = env.tx(lambda q: q.send(queue, None, priority=-1))
    active = active_job(env, queue).id
    retrying = active_job(env, queue, retry_delay=3600).id
    env.tx(lambda q: q.fail(queue, retrying))
    settled = env.tx(lambda q: q.cancel(queue, [created, active, retrying]))
    assert sorted(settled.affected) == sorted([created, active, retrying])
    for job_id in (created, active, retrying):
        row = job_row(env, job_id)
        assert row.state == "cancelled" and row.completed_on is not None


def test_cancel_leaves_finished_jobs_alone(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    env.tx(lambda q: q.complete(queue, job.id))
    assert env.tx(lambda q: q.cancel(queue, job.id)).affected == []
    assert job_row(env, job.id).state == "completed"


def test_cancelled_job_is_not_fetched(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None))
    env.tx(lambda q: q.cancel(queue, job_id))
    assert env.tx(lambda q: q.fetch(queue)) == []


def test_resume_puts_a_cancelled_job_back_unchanged(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, start_after=-1))
    start_after = job_row(env, job_id).start_after
    env.tx(lambda q: q.cancel(queue, job_id))
    assert env.tx(lambda q: q.resume(queue, job_id)).affected == [job_id]
    row = job_row(env, job_id)
    assert (row.state, row.completed_on, row.start_after) == ("created", None, start_after)
    assert [j.id for j in env.tx(lambda q: q.fetch(queue))] == [job_id]


def test_resume_only_changes_cancelled_jobs(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    assert env.tx(lambda q: q.resume(queue, job.id)).affected == []
    assert job_row(env, job.id).state == "active"


def test_retry_gives_a_failed_job_exactly_one_more_run(env: Any, queue: str) -> None:
    job = active_job(env, queue, retry_limit=0)
    env.tx(lambda q: q.fail(queue, job.id))
    assert env.tx(lambda q: q.retry(queue, job.id)).affected == [job.id]
    row = job_row(env, job.id)
    assert (row.state, row.retry_limit, row.completed_on) == ("retry", 1, None)
    [again] = env.tx(lambda q: q.fetch(queue))
    assert (again.id, again.retry_count) == (job.id, 1)
    env.tx(lambda q: q.fail(queue, job.id))
    assert job_row(env, job.id).state == "failed"
    assert env.tx(lambda q: q.fetch(queue)) == []


def test_retry_only_changes_failed_jobs(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    assert env.tx(lambda q: q.retry(queue, job.id)).affected == []
    assert job_row(env, job.id).retry_limit == 2


# ------------------------------------------------------------------ delete and get


def test_delete_job_removes_it_whatever_its_state(env: Any, queue: str) -> None:
    job = active_job(env, queue)
    deleted = env.tx(lambda q: q.delete_job(queue, job.id))
    assert (deleted.requested, deleted.affected) == (1, [job.id])
    assert job_row(env, job.id) is None
    again = env.tx(lambda q: q.delete_job(queue, job.id))
    assert (again.requested, again.affected) == (1, [])


def test_delete_jobs_removes_the_listed_jobs(env: Any, queue: str) -> None:
    ids = env.tx(lambda q: q.send_many(queue, [{}, {}, {}]))
    settled = env.tx(lambda q: q.delete_jobs(queue, ids[:2]))
    assert sorted(settled.affected) == sorted(ids[:2])
    assert list(states(env, queue)) == [ids[2]]


@pytest.fixture
def mixed(env: Any, queue: str) -> dict[str, uuid.UUID]:
    """One job in each state of the queue."""
    out = {"created": env.tx(lambda q: q.send(queue, None, priority=-1))}
    out["retry"] = active_job(env, queue, retry_delay=3600).id
    env.tx(lambda q: q.fail(queue, out["retry"]))
    out["active"] = active_job(env, queue).id
    out["completed"] = active_job(env, queue).id
    env.tx(lambda q: q.complete(queue, out["completed"]))
    out["cancelled"] = env.tx(lambda q: q.send(queue, None))
    env.tx(lambda q: q.cancel(queue, out["cancelled"]))
    out["failed"] = active_job(env, queue, retry_limit=0).id
    env.tx(lambda q: q.fail(queue, out["failed"]))
    env.tx(lambda q: q.send(queue, None, priority=-1))
    assert {v: k for k, v in states(env, queue).items() if k in out.values()} == {
        s: out[s] for s in out
    }
    return out


def test_delete_queued_jobs_removes_created_and_retry(
    env: Any, queue: str, mixed: dict[str, uuid.UUID]
) -> None:
    assert env.tx(lambda q: q.delete_queued_jobs(queue)) == 3
    assert sorted(states(env, queue).values()) == ["active", "cancelled", "completed", "failed"]


def test_delete_stored_jobs_removes_finished_ones(
    env: Any, queue: str, mixed: dict[str, uuid.UUID]
) -> None:
    assert env.tx(lambda q: q.delete_stored_jobs(queue)) == 3
    assert sorted(states(env, queue).values()) == ["active", "created", "created", "retry"]


def test_delete_all_jobs_empties_the_queue_only(
    env: Any, queue: str, mixed: dict[str, uuid.UUID]
) -> None:
    env.tx(lambda q: q.create_queue("other"))
    env.tx(lambda q: q.send("other", None))
    assert env.tx(lambda q: q.delete_all_jobs(queue)) == 7
    assert states(env, queue) == {}
    assert len(states(env, "other")) == 1


def test_delete_all_jobs_of_a_partitioned_queue(env: Any) -> None:
    env.tx(lambda q: q.create_queue("p", partition=True))
    env.tx(lambda q: q.send_many("p", [{}, {}]))
    assert env.tx(lambda q: q.delete_all_jobs("p")) == 2
    assert states(env, "p") == {}


def test_get_job_returns_the_record_or_none(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, {"x": 1}))
    job = env.tx(lambda q: q.get_job(queue, job_id))
    assert isinstance(job, Job)
    assert (job.id, job.state, job.data) == (job_id, JobState.CREATED, {"x": 1})
    assert env.tx(lambda q: q.get_job(queue, uuid.uuid4())) is None


def test_get_jobs_leaves_out_missing_ids(env: Any, queue: str) -> None:
    ids = env.tx(lambda q: q.send_many(queue, [{}, {}]))
    found = env.tx(lambda q: q.get_jobs(queue, [*ids, uuid.uuid4()]))
    assert sorted(j.id for j in found) == sorted(ids)


# ------------------------------------------------------------------ redrive


@pytest.fixture
def dead(env: Any) -> str:
    env.tx(lambda q: q.create_queue("dead"))
    env.tx(lambda q: q.create_queue("target", retry_limit=7))
    return "dead"


def test_redrive_moves_waiting_and_failed_jobs_as_new_jobs(env: Any, dead: str) -> None:
    waiting = env.tx(lambda q: q.send(dead, {"n": 1}, priority=-1))
    failed = active_job(env, dead, retry_limit=0).id
    env.tx(lambda q: q.fail(dead, failed, "bad"))
    active = active_job(env, dead).id
    moved = env.tx(lambda q: q.redrive(dead, "target"))
    assert len(moved) == 2
    assert list(states(env, dead)) == [active]
    rows = [job_row(env, i) for i in moved]
    assert {r.id for r in rows}.isdisjoint({waiting, failed})
    assert all(r.state == "created" and r.retry_limit == 7 for r in rows)
    assert sorted(r.data["n"] if r.data else 0 for r in rows) == [0, 1]


def test_redrive_takes_the_oldest_first_and_respects_the_limit(env: Any, dead: str) -> None:
    for n in range(5):
        env.tx(lambda q, n=n: q.send(dead, n))
    moved = env.tx(lambda q: q.redrive(dead, "target", limit=3))
    assert [job_row(env, i).data for i in moved] == [0, 1, 2]
    left = env.sql("SELECT data FROM {s}.job WHERE name = 'dead' ORDER BY data")
    assert [r.data for r in left] == [3, 4]


def test_redriven_jobs_are_fetched_oldest_first(env: Any, dead: str) -> None:
    for n in range(6):
        env.tx(lambda q, n=n: q.send(dead, n))
    env.tx(lambda q: q.redrive(dead, "target"))
    assert [j.data for j in env.tx(lambda q: q.fetch("target", 10))] == list(range(6))


def test_redrive_by_id_moves_only_those(env: Any, dead: str) -> None:
    ids = env.tx(lambda q: q.send_many(dead, [{"data": 0}, {"data": 1}]))
    moved = env.tx(lambda q: q.redrive(dead, "target", ids[1]))
    assert [job_row(env, i).data for i in moved] == [1]
    assert list(states(env, dead)) == [ids[0]]


def test_redrive_into_a_queue_that_refuses_some_jobs_loses_none(env: Any, dead: str) -> None:
    env.tx(lambda q: q.create_queue("one-at-a-time", policy="short"))
    env.tx(lambda q: q.send_many(dead, [{"data": n} for n in range(3)]))
    moved = env.tx(lambda q: q.redrive(dead, "one-at-a-time"))
    assert len(moved) == 1
    total = env.sql("SELECT count(*) FROM {s}.job")
    assert total == [(3,)]
    assert len(states(env, dead)) == 2
