"""Queue policies, one row of pg-boss's policy table per test, on a shared and a partitioned queue.

Each row follows pg-boss's verification sequence: send, send while the first is
queued, fetch, send while one is active, fetch while one is active. The other
tests check each case on both kinds of queue (and on each policy it concerns)
inside one test, to keep the suite quick.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from alkstore_sa.ops import Settlement

KINDS = pytest.mark.parametrize("partition", [False, True], ids=["shared", "partitioned"])


def make_queue(env: Any, policy: str, partition: bool, **options: Any) -> str:
    name = f"{policy}-{'partitioned' if partition else 'shared'}"
    env.tx(lambda q: q.create_queue(name, policy=policy, partition=partition, **options))
    return name


def each_queue(policies: tuple[str, ...], check: Callable[[str, str, bool], None]) -> None:
    """Run ``check(policy, queue_name, partition)`` on both kinds of queue of each policy."""
    for policy in policies:
        for partition in (False, True):
            check(policy, f"{policy}-{'partitioned' if partition else 'shared'}", partition)


def verification_sequence(env: Any, queue: str) -> tuple[bool, bool, int, bool, int]:
    """The five steps of the policy table, all on singleton key ``k``."""
    first = env.tx(lambda q: q.send(queue, 1, singleton_key="k"))
    while_queued = env.tx(lambda q: q.send(queue, 2, singleton_key="k"))
    fetched = env.tx(lambda q: q.fetch(queue, 10))
    while_active = env.tx(lambda q: q.send(queue, 3, singleton_key="k"))
    fetched_while_active = env.tx(lambda q: q.fetch(queue, 10))
    return (
        first is not None,
        while_queued is not None,
        len(fetched),
        while_active is not None,
        len(fetched_while_active),
    )


def active_keys(env: Any, queue: str) -> list[str | None]:
    rows = env.sql(
        "SELECT singleton_key FROM {s}.job WHERE name = :q AND state = 'active'", q=queue
    )
    return [r.singleton_key for r in rows]


def state_of(env: Any, job_id: uuid.UUID) -> str:
    [(state,)] = env.sql("SELECT state FROM {s}.job WHERE id = :id", id=job_id)
    return str(state)


QUEUED_KEY_POLICIES = ("short", "stately", "exclusive")
"""Policies that refuse a second queued job of a key."""


# ------------------------------------------------------------------ the policy table


@KINDS
def test_standard_policy_restricts_nothing(env: Any, partition: bool) -> None:
    queue = make_queue(env, "standard", partition)
    assert verification_sequence(env, queue) == (True, True, 2, True, 1)


@KINDS
def test_short_policy_allows_one_created_job_per_key(env: Any, partition: bool) -> None:
    queue = make_queue(env, "short", partition)
    assert verification_sequence(env, queue) == (True, False, 1, True, 1)


@KINDS
def test_singleton_policy_allows_one_active_job_per_key(env: Any, partition: bool) -> None:
    queue = make_queue(env, "singleton", partition)
    assert verification_sequence(env, queue) == (True, True, 1, True, 0)
    assert active_keys(env, queue) == ["k"]


@KINDS
def test_stately_policy_allows_one_job_per_state_and_key(env: Any, partition: bool) -> None:
    queue = make_queue(env, "stately", partition)
    assert verification_sequence(env, queue) == (True, False, 1, True, 0)
    assert active_keys(env, queue) == ["k"]


@KINDS
def test_exclusive_policy_allows_one_queued_or_active_job_per_key(
    env: Any, partition: bool
) -> None:
    queue = make_queue(env, "exclusive", partition)
    assert verification_sequence(env, queue) == (True, False, 1, False, 0)


# ------------------------------------------------------------------ keys and slots freed


def test_different_keys_do_not_interfere(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition)
        ids = [env.tx(lambda q, k=key: q.send(queue, None, singleton_key=k)) for key in "abc"]
        assert None not in ids, queue
        fetched = env.tx(lambda q: q.fetch(queue, 10))
        assert sorted(j.singleton_key for j in fetched) == ["a", "b", "c"], queue

    each_queue((*QUEUED_KEY_POLICIES, "singleton"), check)


def test_no_key_is_one_shared_key(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition)
        assert env.tx(lambda q: q.send(queue, None)) is not None, queue
        assert env.tx(lambda q: q.send(queue, None)) is None, queue
        assert env.tx(lambda q: q.send(queue, None, singleton_key="")) is None, queue

    each_queue(QUEUED_KEY_POLICIES, check)


def test_finished_job_frees_its_key(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition, retry_limit=0)
        for finish in ("complete", "fail", "cancel"):
            job_id = env.tx(lambda q: q.send(queue, None, singleton_key="k"))
            assert job_id is not None, f"{queue} after {finish}"
            env.tx(lambda q: q.fetch(queue))
            env.tx(lambda q, f=finish, j=job_id: getattr(q, f)(queue, j))
        assert env.tx(lambda q: q.send(queue, None, singleton_key="k")) is not None, queue

    each_queue(QUEUED_KEY_POLICIES, check)


def test_completing_the_active_job_lets_the_next_of_its_key_run(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition)
        first = env.tx(lambda q: q.send(queue, 1, singleton_key="k"))
        env.tx(lambda q: q.fetch(queue))
        second = env.tx(lambda q: q.send(queue, 2, singleton_key="k"))
        assert env.tx(lambda q: q.fetch(queue)) == [], queue
        env.tx(lambda q: q.complete(queue, first))
        assert [j.id for j in env.tx(lambda q: q.fetch(queue))] == [second], queue

    each_queue(("singleton", "stately"), check)


def test_fetch_blocked_by_an_active_key_keeps_the_transaction_usable(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition)
        env.tx(lambda q: q.send(queue, 1, singleton_key="k"))
        env.tx(lambda q: q.fetch(queue))
        env.tx(lambda q: q.send(queue, 2, singleton_key="k"))
        svc = env.service()
        assert svc.fetch(queue, 5) == [], queue
        svc.send(queue, 3, singleton_key="other")
        env.commit()
        assert active_keys(env, queue) == ["k"], queue
        assert len(env.sql("SELECT 1 FROM {s}.job WHERE name = :q", q=queue)) == 3, queue

    each_queue(("singleton", "stately"), check)


# ------------------------------------------------------------------ stately retries


@KINDS
def test_stately_job_goes_to_retry_when_the_slot_is_free(env: Any, partition: bool) -> None:
    queue = make_queue(env, "stately", partition, retry_limit=3)
    job_id = env.tx(lambda q: q.send(queue, None, singleton_key="k"))
    env.tx(lambda q: q.fetch(queue))
    env.tx(lambda q: q.fail(queue, job_id))
    assert state_of(env, job_id) == "retry"


@KINDS
def test_stately_job_whose_retry_slot_is_taken_fails_for_good(env: Any, partition: bool) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    queue = make_queue(
        env, "stately", partition, retry_limit=3, retry_delay=3600, dead_letter="dlq"
    )
    first = env.tx(lambda q: q.send(queue, "first", singleton_key="k"))
    env.tx(lambda q: q.fetch(queue))
    env.tx(lambda q: q.fail(queue, first))  # first waits in `retry` for an hour
    second = env.tx(lambda q: q.send(queue, "second", singleton_key="k"))
    [job] = env.tx(lambda q: q.fetch(queue))
    assert job.id == second
    result = env.tx(lambda q: q.fail_many(queue, [Settlement(second)]))
    assert result.states == {second: "failed"}
    assert (state_of(env, first), state_of(env, second)) == ("retry", "failed")
    # Failed for good means dead-lettered too.
    assert result.dead_lettered == 1
    assert env.sql("SELECT data FROM {s}.job WHERE name = 'dlq'") == [("second",)]


# ------------------------------------------------------------------ throttling (i4)


def test_throttle_slot_applies_on_every_policy(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition)
        first = env.tx(lambda q: q.send_throttled(queue, None, 3600, "t"))
        env.tx(lambda q: q.fetch(queue))
        env.tx(lambda q: q.complete(queue, first))
        # Even finished, the job holds its slot (i4 ignores only cancelled jobs).
        assert env.tx(lambda q: q.send_throttled(queue, None, 3600, "t")) is None, queue

    each_queue(("standard", "short", "singleton", "stately", "exclusive"), check)


@KINDS
def test_standard_throttle_allows_one_job_per_slot_and_key(env: Any, partition: bool) -> None:
    queue = make_queue(env, "standard", partition)
    svc = env.service()
    sent = [svc.send_throttled(queue, n, 3600, key) for n, key in enumerate("aab")]
    env.commit()
    assert [s is not None for s in sent] == [True, False, True]


@KINDS
def test_cancelled_job_frees_its_throttle_slot(env: Any, partition: bool) -> None:
    queue = make_queue(env, "standard", partition)
    first = env.tx(lambda q: q.send_throttled(queue, None, 3600, "t"))
    env.tx(lambda q: q.cancel(queue, first))
    assert env.tx(lambda q: q.send_throttled(queue, None, 3600, "t")) is not None


# ------------------------------------------------------------------ moving jobs back


@KINDS
def test_resuming_a_job_whose_throttle_slot_was_retaken_leaves_it_cancelled(
    env: Any, partition: bool
) -> None:
    queue = make_queue(env, "standard", partition)
    first = env.tx(lambda q: q.send_throttled(queue, None, 3600, "t"))
    other = env.tx(lambda q: q.send(queue, None))
    env.tx(lambda q: q.cancel(queue, [first, other]))
    env.tx(lambda q: q.send_throttled(queue, None, 3600, "t"))
    svc = env.service()
    assert svc.resume(queue, [first, other]).affected == [other]
    svc.send(queue, "after")  # the transaction is still usable
    env.commit()
    assert (state_of(env, first), state_of(env, other)) == ("cancelled", "created")


def test_resuming_a_job_whose_key_is_queued_again_leaves_it_cancelled(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition)
        first = env.tx(lambda q: q.send(queue, None, singleton_key="k"))
        env.tx(lambda q: q.cancel(queue, first))
        env.tx(lambda q: q.send(queue, None, singleton_key="k"))
        assert env.tx(lambda q: q.resume(queue, first)).affected == [], queue
        assert state_of(env, first) == "cancelled", queue

    each_queue(QUEUED_KEY_POLICIES, check)


def test_retrying_a_failed_job_whose_key_is_taken_leaves_it_failed(env: Any) -> None:
    def check(policy: str, queue: str, partition: bool) -> None:
        make_queue(env, policy, partition, retry_limit=0)
        first = env.tx(lambda q: q.send(queue, None, singleton_key="k"))
        env.tx(lambda q: q.fetch(queue))
        env.tx(lambda q: q.fail(queue, first))
        if policy == "stately":
            # Occupy the retry slot of key k with another job.
            second = env.tx(lambda q: q.send(queue, None, singleton_key="k", retry_limit=1))
            env.tx(lambda q: q.fetch(queue))
            env.tx(lambda q: q.fail(queue, second))
        else:
            env.tx(lambda q: q.send(queue, None, singleton_key="k"))
        assert env.tx(lambda q: q.retry(queue, first)).affected == [], queue
        assert state_of(env, first) == "failed", queue

    each_queue(("stately", "exclusive"), check)
