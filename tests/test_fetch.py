"""fetch: claiming jobs in order, once, with pg-boss's columns (pg-boss's fetchNextJob)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

import pytest
from sqlalchemy import text

from alkstore_sa import Job, JobState


@pytest.fixture
def queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue("q"))
    return "q"


def send_each(env: Any, queue: str, specs: list[dict[str, Any]]) -> list[uuid.UUID]:
    """Send each job in its own transaction, so their created_on differ."""
    return [env.tx(lambda q, s=spec: q.send(queue, **s)) for spec in specs]


def state_of(env: Any, job_id: uuid.UUID) -> str:
    [(value,)] = env.sql("SELECT state FROM {s}.job WHERE id = :id", id=job_id)
    return str(value)


# ------------------------------------------------------------------ batch and order


def test_fetch_from_an_empty_queue_returns_no_jobs(env: Any, queue: str) -> None:
    assert env.tx(lambda q: q.fetch(queue)) == []


def test_fetch_returns_at_most_batch_size_jobs(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send_many(queue, [{"data": n} for n in range(5)]))
    assert len(env.tx(lambda q: q.fetch(queue, 3))) == 3
    assert len(env.tx(lambda q: q.fetch(queue, 3))) == 2
    assert env.tx(lambda q: q.fetch(queue, 3)) == []


def test_fetch_defaults_to_one_job(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send_many(queue, [{"data": n} for n in range(3)]))
    assert len(env.tx(lambda q: q.fetch(queue))) == 1


def test_fetch_orders_by_priority_then_oldest_first(env: Any, queue: str) -> None:
    ids = send_each(env, queue, [{"priority": p} for p in (0, 5, 0, 10, 5)])
    jobs = env.tx(lambda q: q.fetch(queue, 10))
    assert [j.id for j in jobs] == [ids[3], ids[1], ids[4], ids[0], ids[2]]


def test_fetch_breaks_created_on_ties_by_id(env: Any, queue: str) -> None:
    given = sorted(uuid.uuid4() for _ in range(6))
    shuffled = [given[i] for i in (3, 0, 5, 1, 4, 2)]
    env.tx(lambda q: q.send_many(queue, [{"id": i} for i in shuffled]))
    assert [j.id for j in env.tx(lambda q: q.fetch(queue, 10))] == given


def test_jobs_of_one_send_many_are_fetched_in_input_order(env: Any, queue: str) -> None:
    ids = env.tx(lambda q: q.send_many(queue, [{"data": n} for n in range(30)]))
    assert [j.id for j in env.tx(lambda q: q.fetch(queue, 30))] == ids


def test_fetch_one_at_a_time_is_fifo(env: Any, queue: str) -> None:
    ids = send_each(env, queue, [{} for _ in range(4)])
    fetched = [env.tx(lambda q: q.fetch(queue))[0].id for _ in ids]
    assert fetched == ids


def test_fetch_with_priority_false_ignores_priority(env: Any, queue: str) -> None:
    ids = send_each(env, queue, [{"priority": p} for p in (0, 5, 10)])
    jobs = env.tx(lambda q: q.fetch(queue, 10, priority=False))
    assert [j.id for j in jobs] == ids


def test_fetch_only_takes_jobs_of_its_queue(env: Any, queue: str) -> None:
    env.tx(lambda q: q.create_queue("other"))
    env.tx(lambda q: q.send("other", None))
    mine = env.tx(lambda q: q.send(queue, None))
    assert [j.id for j in env.tx(lambda q: q.fetch(queue, 10))] == [mine]


# ------------------------------------------------------------------ start_after


def test_fetch_skips_deferred_jobs(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send(queue, None, start_after=3600))
    due = env.tx(lambda q: q.send(queue, None))
    assert [j.id for j in env.tx(lambda q: q.fetch(queue, 10))] == [due]


def test_fetch_with_ignore_start_after_takes_deferred_jobs(env: Any, queue: str) -> None:
    later = env.tx(lambda q: q.send(queue, None, start_after=3600))
    [job] = env.tx(lambda q: q.fetch(queue, ignore_start_after=True))
    assert job.id == later


def test_job_sent_in_the_same_transaction_is_not_fetched(env: Any, queue: str) -> None:
    svc = env.service()
    svc.send(queue, None)
    assert svc.fetch(queue) == []
    env.commit()
    assert len(env.tx(lambda q: q.fetch(queue))) == 1


def test_start_after_must_be_strictly_before_now(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, start_after=3600))
    svc = env.service()
    move = text(f'UPDATE "{env.schema}".job SET start_after = now() - :d WHERE id = :id')
    env.session.execute(move, {"d": dt.timedelta(0), "id": job_id})
    assert svc.fetch(queue) == []
    env.session.execute(move, {"d": dt.timedelta(microseconds=1), "id": job_id})
    assert [j.id for j in svc.fetch(queue)] == [job_id]
    env.commit()


# ------------------------------------------------------------------ the returned records


def test_fetch_returns_frozen_job_records_with_every_column(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, {"a": 1}, priority=2, singleton_key="k", retry_limit=4))
    [job] = env.tx(lambda q: q.fetch(queue))
    columns = [
        c
        for (c,) in env.sql(
            "SELECT attname FROM pg_attribute WHERE attrelid = '{s}.job'::regclass "
            "AND attnum > 0 ORDER BY attnum"
        )
    ]
    assert isinstance(job, Job)
    assert set(columns) <= {f.name for f in dataclasses.fields(Job)}
    # The fields of the columns schema 46 adds keep their defaults at 26.
    extra = [f for f in dataclasses.fields(Job) if f.name not in columns]
    assert len(extra) == 15 and all(getattr(job, f.name) == f.default for f in extra)
    assert (job.id, job.name, job.data, job.priority) == (job_id, queue, {"a": 1}, 2)
    assert (job.singleton_key, job.retry_limit, job.policy) == ("k", 4, "standard")
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = JobState.CREATED  # type: ignore[misc]


def test_fetched_job_is_active_with_started_on_set(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None))
    svc = env.service()
    [job] = svc.fetch(queue)
    now = env.session.execute(text("SELECT now()")).scalar_one()
    env.commit()
    assert job.state == JobState.ACTIVE
    assert job.started_on == now
    [row] = env.sql("SELECT state, started_on FROM {s}.job WHERE id = :id", id=job_id)
    assert (row.state, row.started_on) == ("active", now)


def test_first_fetch_leaves_retry_count_at_zero(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send(queue, None))
    [job] = env.tx(lambda q: q.fetch(queue))
    assert job.retry_count == 0


def test_retry_count_rises_when_a_job_is_fetched_again(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None, retry_limit=3))
    counts = []
    for _ in range(3):
        [job] = env.tx(lambda q: q.fetch(queue))
        counts.append(job.retry_count)
        env.tx(lambda q: q.fail(queue, job_id))
    assert counts == [0, 1, 2]


def test_resumed_job_that_never_ran_starts_at_retry_count_zero(env: Any, queue: str) -> None:
    job_id = env.tx(lambda q: q.send(queue, None))
    env.tx(lambda q: q.cancel(queue, job_id))
    env.tx(lambda q: q.resume(queue, job_id))
    [job] = env.tx(lambda q: q.fetch(queue))
    assert job.retry_count == 0


def test_fetch_never_returns_the_same_job_twice(env: Any, queue: str) -> None:
    env.tx(lambda q: q.send_many(queue, [{"data": n} for n in range(10)]))
    seen = [j.id for _ in range(6) for j in env.tx(lambda q: q.fetch(queue, 3))]
    assert len(seen) == len(set(seen)) == 10


# ------------------------------------------------------------------ singleton and stately


GROUPED = ("singleton", "stately")


def test_batch_fetch_activates_at_most_one_job_per_key(env: Any) -> None:
    def check(policy: str, partition: bool) -> None:
        g = f"{policy}-{partition}"
        env.tx(lambda q: q.create_queue(g, policy=policy, partition=partition))
        env.tx(lambda q: q.send(g, None, singleton_key="a"))
        env.tx(lambda q: q.send(g, None, singleton_key="b"))
        env.tx(lambda q: q.send_after(g, None, 0, singleton_key="a"))
        jobs = env.tx(lambda q: q.fetch(g, 10))
        assert sorted(j.singleton_key for j in jobs) == ["a", "b"], g
        active = env.sql("SELECT count(*) FROM {s}.job WHERE name = :g AND state = 'active'", g=g)
        assert active == [(2,)], g

    for policy in GROUPED:
        for partition in (False, True):
            check(policy, partition)


def test_batch_fetch_picks_each_keys_first_job_in_fetch_order(env: Any) -> None:
    def check(g: str) -> None:
        env.tx(lambda q: q.create_queue(g, policy=g))
        # Many keys, so that an unordered pick would show up.
        keys = [f"k{n}" for n in range(12)]
        env.tx(lambda q: q.send_many(g, [{"data": "low", "singleton_key": k} for k in keys]))
        if g == "stately":
            # stately allows one queued job per key: park the first ones in `retry`.
            low = env.tx(lambda q: q.fetch(g, 100))
            env.tx(lambda q: q.fail(g, [j.id for j in low]))
        high = [{"data": "high", "singleton_key": k, "priority": 9} for k in keys]
        env.tx(lambda q: q.send_many(g, high))
        jobs = env.tx(lambda q: q.fetch(g, 100))
        assert [j.data for j in jobs] == ["high"] * len(keys), g

    for policy in GROUPED:
        check(policy)


def test_no_key_and_empty_key_are_the_same_key(env: Any) -> None:
    def check(g: str) -> None:
        env.tx(lambda q: q.create_queue(g, policy=g))
        env.tx(lambda q: q.send(g, None))
        if g == "stately":
            [first] = env.tx(lambda q: q.fetch(g))
            env.tx(lambda q: q.fail(g, first.id))
        env.tx(lambda q: q.send(g, None, singleton_key=""))
        assert len(env.tx(lambda q: q.fetch(g, 10))) == 1, g

    for policy in GROUPED:
        check(policy)


def test_fetch_skips_a_key_that_already_has_an_active_job(env: Any) -> None:
    def check(g: str) -> None:
        env.tx(lambda q: q.create_queue(g, policy=g))
        env.tx(lambda q: q.send(g, 1, singleton_key="a"))
        env.tx(lambda q: q.fetch(g))
        env.tx(lambda q: q.send(g, 2, singleton_key="a"))
        other = env.tx(lambda q: q.send(g, 3, singleton_key="b"))
        assert [j.id for j in env.tx(lambda q: q.fetch(g, 10))] == [other], g

    for policy in GROUPED:
        check(policy)


def test_batch_fetch_of_other_policies_takes_several_jobs(env: Any) -> None:
    def check(g: str) -> None:
        env.tx(lambda q: q.create_queue(g, policy=g))
        # standard: one key for all; short and exclusive allow one queued job per key.
        keys = ["a"] * 3 if g == "standard" else ["a", "b", "c"]
        env.tx(lambda q: q.send_many(g, [{"singleton_key": k} for k in keys]))
        assert len(env.tx(lambda q: q.fetch(g, 10))) == 3, g

    for policy in ("standard", "short", "exclusive"):
        check(policy)


# ------------------------------------------------------------------ the policy cache


def test_fetch_notices_a_queue_recreated_without_grouping(env: Any) -> None:
    env.tx(lambda q: q.create_queue("x", policy="singleton"))
    assert env.tx(lambda q: q.fetch("x", 10)) == []  # caches "singleton"
    # Another client (Node pg-boss, say) replaces the queue behind our back.
    env.sql("SELECT {s}.delete_queue('x')")
    env.sql("""SELECT {s}.create_queue('x', '{"policy": "standard"}')""")
    env.tx(lambda q: q.send_many("x", [{"singleton_key": "k"}, {"singleton_key": "k"}]))
    assert len(env.tx(lambda q: q.fetch("x", 10))) == 2


def test_fetch_notices_a_queue_recreated_with_grouping(env: Any) -> None:
    env.tx(lambda q: q.create_queue("x"))
    assert env.tx(lambda q: q.fetch("x", 10)) == []  # caches "standard"
    env.sql("SELECT {s}.delete_queue('x')")
    env.sql("""SELECT {s}.create_queue('x', '{"policy": "singleton"}')""")
    env.tx(lambda q: q.send_many("x", [{"singleton_key": "k"}, {"singleton_key": "k"}]))
    assert len(env.tx(lambda q: q.fetch("x", 10))) == 1


def test_fetch_from_a_queue_deleted_elsewhere_raises_queue_not_found(env: Any) -> None:
    from alkstore_sa import QueueNotFoundError

    env.tx(lambda q: q.create_queue("x"))
    env.tx(lambda q: q.fetch("x"))
    env.sql("SELECT {s}.delete_queue('x')")
    with pytest.raises(QueueNotFoundError, match="'x'"):
        env.tx(lambda q: q.fetch("x"))
