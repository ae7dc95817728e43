"""Per-job results of batch settles: ``complete_many``/``fail_many(..., per_job=True)`` say, for
each item, whether the job was settled and why not (pg-boss's ``perJobResults`` idea, for the
service's batch settles), at schema 26 and at 46, sync and async.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Env
from sqlalchemy import Engine

from alkstore_sa import FailResult, InvalidOptionsError, Job, JobOutcome, JobState, NotSettled


@pytest.fixture(params=["sync-26", "async-26", "sync-46", "async-46"])
def anyenv(request: pytest.FixtureRequest, engine: Engine, database_url: str) -> Iterator[Env]:
    """The service suite (``env``/``env46``) at schema 26 and at 46, sync and async."""
    flavour, version = request.param.split("-")
    schema = request.getfixturevalue("schema" if version == "26" else "schema46")
    e = Env(flavour, engine, schema, database_url)
    yield e
    e.close()


def fetched(env: Any, queue: str, n: int) -> list[Job]:
    env.tx(lambda q: q.send_many(queue, [{"data": {"i": i}} for i in range(n)]))
    jobs = env.tx(lambda q: q.fetch(queue, n))
    assert len(jobs) == n
    return sorted(jobs, key=lambda j: j.data["i"])


def reattempt(env: Any, job: Job) -> None:
    """Another worker claimed the job again after its lease lapsed: a new attempt."""
    env.sql(
        "UPDATE {s}.job SET started_on = started_on + interval '5 minutes' WHERE id = :i",
        i=job.id,
    )


def setup(env: Any) -> tuple[list[Job], uuid.UUID, uuid.UUID]:
    """Jobs of ``q`` (fetched), a finished job of ``q`` and a job of ``other``."""
    env.tx(lambda q: q.create_queue("q", retry_limit=1))
    env.tx(lambda q: q.create_queue("other"))
    jobs = fetched(env, "q", 3)
    done = fetched(env, "q", 1)[0]
    env.tx(lambda q: q.complete("q", done))
    elsewhere = env.tx(lambda q: q.send("other", {}))
    return jobs, done.id, elsewhere


def test_complete_many_per_job_says_why_each_job_was_left(anyenv: Any) -> None:
    (ours, stale, by_id), done, elsewhere = setup(anyenv)
    reattempt(anyenv, stale)
    unknown = uuid.uuid4()
    result = anyenv.tx(
        lambda q: q.complete_many(
            "q",
            [(ours, {"ok": 1}), stale, (by_id.id, {"ok": 2}), done, unknown, str(elsewhere)],
            per_job=True,
        )
    )
    assert (result.requested, sorted(result.affected)) == (6, sorted([ours.id, by_id.id]))
    assert result.outcomes == [
        JobOutcome(ours.id, True, None, JobState.COMPLETED, "q"),
        JobOutcome(stale.id, False, NotSettled.NOT_OURS, JobState.ACTIVE, "q"),
        JobOutcome(by_id.id, True, None, JobState.COMPLETED, "q"),
        JobOutcome(done, False, NotSettled.NOT_ACTIVE, JobState.COMPLETED, "q"),
        JobOutcome(unknown, False, NotSettled.NOT_FOUND, None, None),
        JobOutcome(elsewhere, False, NotSettled.WRONG_QUEUE, JobState.CREATED, "other"),
    ]
    # What the outcomes say is what happened.
    states = dict(anyenv.sql("SELECT id, state::text FROM {s}.job WHERE name = 'q'"))
    assert (states[ours.id], states[stale.id], states[by_id.id]) == (
        "completed",
        "active",
        "completed",
    )


def test_fail_many_per_job_gives_each_failed_job_its_new_state(anyenv: Any) -> None:
    (first, second, stale), done, _ = setup(anyenv)
    anyenv.sql("UPDATE {s}.job SET retry_count = 1 WHERE id = :i", i=second.id)  # its last try
    reattempt(anyenv, stale)
    result = anyenv.tx(
        lambda q: q.fail_many("q", [first, (second, "boom"), stale, done], per_job=True)
    )
    assert isinstance(result, FailResult)
    assert result.outcomes == [
        JobOutcome(first.id, True, None, JobState.RETRY, "q"),
        JobOutcome(second.id, True, None, JobState.FAILED, "q"),
        JobOutcome(stale.id, False, NotSettled.NOT_OURS, JobState.ACTIVE, "q"),
        JobOutcome(done, False, NotSettled.NOT_ACTIVE, JobState.COMPLETED, "q"),
    ]
    assert result.states == {first.id: JobState.RETRY, second.id: JobState.FAILED}


def test_a_fenced_settle_of_a_job_that_expired_to_retry_is_not_active(anyenv: Any) -> None:
    (job, _, _), _, _ = setup(anyenv)
    anyenv.sql("UPDATE {s}.job SET state = 'retry' WHERE id = :i", i=job.id)
    result = anyenv.tx(lambda q: q.complete_many("q", [job], per_job=True))
    assert result.outcomes == [
        JobOutcome(job.id, False, NotSettled.NOT_ACTIVE, JobState.RETRY, "q")
    ]


def test_an_unfenced_fail_applies_to_a_queued_job(anyenv: Any) -> None:
    anyenv.tx(lambda q: q.create_queue("q", retry_limit=0))
    queued = anyenv.tx(lambda q: q.send("q", {}))
    result = anyenv.tx(lambda q: q.fail_many("q", [queued], per_job=True))
    assert result.outcomes == [JobOutcome(queued, True, None, JobState.FAILED, "q")]


def test_outcomes_are_none_unless_asked_and_empty_for_no_items(anyenv: Any) -> None:
    (job, other, _), _, _ = setup(anyenv)
    assert anyenv.tx(lambda q: q.complete_many("q", [job])).outcomes is None
    assert anyenv.tx(lambda q: q.fail_many("q", [other])).outcomes is None
    assert anyenv.tx(lambda q: q.complete_many("q", [], per_job=True)).outcomes == []
    assert anyenv.tx(lambda q: q.fail_many("q", [], per_job=True)).outcomes == []


def test_a_repeated_item_gets_an_outcome_each_time(anyenv: Any) -> None:
    (job, _, _), _, _ = setup(anyenv)
    result = anyenv.tx(lambda q: q.complete_many("q", [job, job.id], per_job=True))
    assert [o.settled for o in result.outcomes] == [True, True]
    assert result.affected == [job.id]


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_a_bad_per_job_flag_is_refused_before_any_statement(anyenv: Any, flag: Any) -> None:
    (job, _, _), _, _ = setup(anyenv)
    svc = anyenv.service()
    with pytest.raises(InvalidOptionsError, match="per_job"):
        svc.complete_many("q", [job], per_job=flag)
    with pytest.raises(InvalidOptionsError, match="per_job"):
        svc.fail_many("q", [job], per_job=flag)
    # Nothing was written and the transaction is usable.
    assert svc.complete_many("q", [job], per_job=True).outcomes[0].settled
    anyenv.commit()


def test_per_job_outcomes_of_a_missing_queue_raise_as_without(anyenv: Any) -> None:
    with pytest.raises(Exception, match="missing"):
        anyenv.tx(lambda q: q.complete_many("missing", [uuid.uuid4()], per_job=True))
