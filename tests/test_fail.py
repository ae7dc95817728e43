"""fail: retries, backoff, terminal failure and dead letters (pg-boss's failJobs)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from alkstore_sa import FailResult, JobState, Settlement


def job_row(env: Any, job_id: uuid.UUID) -> Any:
    [row] = env.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    return row


def run_and_fail(env: Any, queue: str, output: Any = None) -> tuple[Any, dt.datetime]:
    """Fetch the next job (even if deferred), fail it; return the job and the fail time."""
    [job] = env.tx(lambda q: q.fetch(queue, ignore_start_after=True))
    svc = env.service()
    settled = svc.fail(queue, job.id, output)
    now = env.session.execute(text("SELECT now()")).scalar_one()
    env.commit()
    assert settled.affected == [job.id]
    return job, now


def dead_letters(env: Any, queue: str) -> list[Any]:
    return list(env.sql("SELECT * FROM {s}.job WHERE name = :q ORDER BY created_on", q=queue))


@pytest.fixture
def queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue("q"))
    return "q"


# ------------------------------------------------------------------ retry


def test_fail_with_retries_left_puts_the_job_in_retry(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, retry_limit=1))
    _, now = run_and_fail(env, queue, {"why": "flaky"})
    row = job_row(env, job_id)
    assert row.state == "retry"
    assert row.completed_on is None
    assert row.output == {"why": "flaky"}
    assert row.start_after == now


def test_fail_keeps_the_job_id_and_its_columns(env: Any, queue: str) -> None:
    job_id = env.tx(
        lambda q: q.send(queue, {"a": 1}, priority=4, singleton_key="k", expire_seconds=30)
    )
    job, _ = run_and_fail(env, queue)
    row = job_row(env, job_id)
    assert (row.id, row.data, row.priority, row.singleton_key) == (job_id, {"a": 1}, 4, "k")
    assert (row.expire_seconds, row.created_on, row.started_on) == (
        30,
        job.created_on,
        job.started_on,
    )


def test_retry_limit_n_gives_n_plus_one_runs(env: Any, queue: str) -> None:
    for limit in (0, 1, 2, 4):
        job_id = env.tx(lambda q, n=limit: q.send(queue, None, retry_limit=n))
        runs = 0
        while jobs := env.tx(lambda q: q.fetch(queue)):
            runs += 1
            env.tx(lambda q, j=jobs[0]: q.fail(queue, j.id))
        assert runs == limit + 1
        row = job_row(env, job_id)
        assert (row.state, row.retry_count) == ("failed", limit)


def test_fixed_retry_delay_defers_the_retry(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, retry_delay=30))
    _, now = run_and_fail(env, queue)
    assert job_row(env, job_id).start_after == now + dt.timedelta(seconds=30)
    assert env.tx(lambda q: q.fetch(queue)) == []


def test_backoff_is_additive_with_a_random_part(env: Any, queue: str) -> None:
    # retry_delay + 2^n/2 * (1 + random()), n = retry_count + 1
    job_id = env.tx(
        lambda q: q.send(queue, None, retry_limit=3, retry_delay=10, retry_backoff=True)
    )
    windows = [(11, 12), (12, 14), (14, 18)]
    for low, high in windows:
        _, now = run_and_fail(env, queue)
        delay = (job_row(env, job_id).start_after - now).total_seconds()
        assert low <= delay < high


def test_backoff_is_capped_by_retry_delay_max(env: Any, queue: str) -> None:
    job_id = env.tx(
        lambda q: q.send(
            queue, None, retry_limit=5, retry_delay=10, retry_backoff=True, retry_delay_max=12
        )
    )
    delays = []
    for _ in range(4):
        _, now = run_and_fail(env, queue)
        delays.append((job_row(env, job_id).start_after - now).total_seconds())
    assert 11 <= delays[0] <= 12
    assert delays[1:] == [12.0, 12.0, 12.0]


def test_backoff_without_delay_starts_at_one_second(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, retry_backoff=True))
    _, now = run_and_fail(env, queue)
    assert 1 <= (job_row(env, job_id).start_after - now).total_seconds() < 2


# ------------------------------------------------------------------ terminal failure


def test_fail_past_retry_limit_sets_failed_and_keeps_start_after(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, retry_limit=0, start_after=-1))
    before = job_row(env, job_id).start_after
    _, now = run_and_fail(env, queue, "boom")
    row = job_row(env, job_id)
    assert row.state == "failed"
    assert row.start_after == before
    assert row.completed_on == now
    assert row.output == {"value": "boom"}


def test_failed_job_is_not_fetched_again(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send(queue, None, retry_limit=0))
    run_and_fail(env, queue)
    assert env.tx(lambda q: q.fetch(queue, ignore_start_after=True)) == []


def test_fail_stores_an_exception_as_name_message_and_stack(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, retry_limit=0))
    try:
        raise KeyError("missing")
    except KeyError as exc:
        run_and_fail(env, queue, exc)
    output = job_row(env, job_id).output
    assert output["name"] == "KeyError"
    assert output["message"] == "'missing'"
    assert "raise KeyError" in output["stack"]


def test_fail_of_a_created_job_works(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, retry_limit=0))
    settled = env.tx(lambda q: q.fail(queue, job_id))
    assert settled.affected == [job_id]
    assert job_row(env, job_id).state == "failed"


def test_fail_of_a_job_waiting_in_retry_does_not_use_up_a_retry(env: Any, queue: str) -> None:
    # retry_count rises on fetch, not on failure (a pg-boss quirk we keep).
    job_id = env.tx(lambda q: q.send(queue, None, retry_limit=1, retry_delay=3600))
    run_and_fail(env, queue)
    settled = env.tx(lambda q: q.fail(queue, job_id, "again"))
    assert settled.affected == [job_id]
    row = job_row(env, job_id)
    assert (row.state, row.retry_count, row.output) == ("retry", 0, {"value": "again"})


def test_fail_of_a_finished_job_changes_nothing(env: Any, queue: str) -> None:
    for finish in ("complete", "cancel", "fail"):
        job_id = env.tx(lambda q: q.send(queue, None, retry_limit=0))
        env.tx(lambda q: q.fetch(queue))
        env.tx(lambda q, f=finish, j=job_id: getattr(q, f)(queue, j))
        before = job_row(env, job_id)
        settled = env.tx(lambda q, j=job_id: q.fail(queue, j, "again"))
        assert settled.affected == [] and settled.requested == 1, finish
        assert job_row(env, job_id) == before, finish


def test_fail_many_reports_the_state_of_each_job(env: Any, queue: str) -> None:
    retrying = env.tx(lambda q: q.send(queue, None, retry_limit=1))
    final = env.tx(lambda q: q.send(queue, None, retry_limit=0))
    result = env.tx(
        lambda q: q.fail_many(queue, [Settlement(retrying, "a"), Settlement(final, "b")])
    )
    assert result.states == {retrying: JobState.RETRY, final: JobState.FAILED}
    assert sorted(result.affected) == sorted([retrying, final])
    assert (job_row(env, retrying).output, job_row(env, final).output) == (
        {"value": "a"},
        {"value": "b"},
    )


def test_fail_returns_the_same_result_as_fail_many(env: Any, queue: str) -> None:
    retrying = env.tx(lambda q: q.send(queue, None, retry_limit=1))
    final = env.tx(lambda q: q.send(queue, None, retry_limit=0))
    result = env.tx(lambda q: q.fail(queue, [retrying, final, uuid.uuid4()], "boom"))
    assert isinstance(result, FailResult)
    assert (result.requested, sorted(result.affected)) == (3, sorted([retrying, final]))
    assert (result.retried, result.failed, result.dead_lettered) == ([retrying], [final], 0)


# ------------------------------------------------------------------ dead letters


@pytest.fixture
def dlq(env: Any) -> str:
    env.tx(
        lambda q: q.create_queue(
            "dlq",
            policy="short",
            retry_limit=5,
            retry_delay=3,
            retry_backoff=True,
            retention_seconds=100,
            deletion_seconds=50,
        )
    )
    env.tx(lambda q: q.create_queue("work", dead_letter="dlq", retry_limit=0))
    return "dlq"


def test_failed_job_is_copied_to_the_dead_letter_queue(env: Any, dlq: str) -> None:
    env.tx(lambda q: q.send("work", {"order": 1}, priority=5, singleton_key="k"))
    _, now = run_and_fail(env, "work", {"error": "x"})
    [copy] = dead_letters(env, dlq)
    assert copy.state == "created"
    assert copy.data == {"order": 1} and copy.output == {"error": "x"}
    assert copy.policy is None
    assert (copy.retry_limit, copy.retry_delay, copy.retry_backoff) == (5, 3, True)
    assert copy.keep_until == now + dt.timedelta(seconds=100)
    assert (copy.deletion_seconds, copy.expire_seconds) == (50, 900)
    assert (copy.priority, copy.singleton_key, copy.dead_letter) == (0, None, None)


def test_dead_letter_copy_gets_a_new_id_and_the_original_stays_failed(env: Any, dlq: str) -> None:
    job_id = env.tx(lambda q: q.send("work", None))
    run_and_fail(env, "work")
    [copy] = dead_letters(env, dlq)
    assert copy.id != job_id
    assert job_row(env, job_id).state == "failed"


def test_retried_job_is_not_dead_lettered(env: Any, dlq: str) -> None:
    env.tx(lambda q: q.send("work", None, retry_limit=1))
    run_and_fail(env, "work")
    assert dead_letters(env, dlq) == []


def test_every_failed_job_gets_its_own_dead_letter_copy(env: Any, dlq: str) -> None:
    # The DLQ is a `short` queue, yet copies carry policy NULL, so none is refused.
    ids = env.tx(lambda q: q.send_many("work", [{"data": n} for n in range(3)]))
    result = env.tx(lambda q: q.fail_many("work", [_settle(i) for i in ids]))
    assert result.dead_lettered == 3
    assert sorted(r.data for r in dead_letters(env, dlq)) == [0, 1, 2]


def test_per_job_dead_letter_overrides_the_queues(env: Any, dlq: str) -> None:
    env.tx(lambda q: q.create_queue("other"))
    env.tx(lambda q: q.send("work", "mine", dead_letter="other"))
    run_and_fail(env, "work")
    assert dead_letters(env, dlq) == []
    assert [r.data for r in dead_letters(env, "other")] == ["mine"]


def test_job_without_dead_letter_is_only_failed(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send(queue, None, retry_limit=0))
    run_and_fail(env, queue)
    assert env.sql("SELECT count(*) FROM {s}.job") == [(1,)]


def _settle(job_id: uuid.UUID) -> Settlement:
    return Settlement(job_id, None)
