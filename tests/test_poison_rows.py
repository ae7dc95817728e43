"""Rows no worker can activate or read fail on their own; the queue goes on.

Another client (Node pg-boss, a SQL console, an older version of us) can write rows
that the send-side limits refuse: a singleton key too large for the unique index
that activation enters, a timestamp outside Python's years 1 to 9999, JSON nested
past MAX_JSON_DEPTH. They are written here by raw SQL, as such a client would; each
test first shows the row really is poison for a plain read or claim.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

import pytest
import sqlalchemy.exc
from support.worker import Harness, send, wait_for

from alkstore_sa.limits import MAX_JSON_DEPTH, MAX_SINGLETON_KEY_BYTES
from alkstore_sa.ops.poison import POISON_ERROR
from alkstore_sa.records import Job, UnreadableJob

POISON_LOGGER = "alkstore_sa.ops.poison"

# Random hex that pglz cannot compress: 160 x 32 = 5,120 bytes, past the btree limit.
HUGE_KEY = "(SELECT string_agg(md5(random()::text), '') FROM generate_series(1, 160))"
YEAR_ZERO = "'0001-01-01T00:00:00+14:00'::timestamptz"  # stored as 0001-12-31 BC


def deep_json(depth: int) -> str:
    return f"(repeat('[', {depth}) || repeat(']', {depth}))::jsonb"


# Each poison: the columns it writes (SQL expressions) and the field it spoils.
POISONS: dict[str, tuple[dict[str, str], str]] = {
    "huge_key": ({"singleton_key": HUGE_KEY}, "singleton_key"),
    "start_after_year_0": ({"start_after": YEAR_ZERO}, "start_after"),
    "created_on_year_0": ({"created_on": YEAR_ZERO}, "created_on"),
    "keep_until_infinity": ({"keep_until": "'infinity'::timestamptz"}, "keep_until"),
    "data_1000_deep": ({"data": deep_json(1000)}, "data"),
}

# (create_queue options, policy written in the row)
QUEUES: dict[str, dict[str, Any]] = {
    "standard": {},
    "singleton": {"policy": "singleton"},
    "stately": {"policy": "stately"},
    "partitioned": {"partition": True},
    "partitioned_singleton": {"partition": True, "policy": "singleton"},
}

# A huge key only breaks activation where it enters a unique index: singleton
# queues (a stately queue refuses it at insert already, see below).
CASES = [
    pytest.param(poison, kind, id=f"{poison}-{kind}")
    for poison in POISONS
    for kind in QUEUES
    if poison != "huge_key" or kind.endswith("singleton")
]


def insert_raw(db: Any, queue: str, policy: str, **columns: str) -> uuid.UUID:
    """INSERT one job as another client would; ``columns`` are SQL expressions."""
    values = {"name": ":name", "policy": ":policy", **columns}
    [(job_id,)] = db.sql(
        f"INSERT INTO {{s}}.job ({', '.join(values)}) VALUES ({', '.join(values.values())}) "
        "RETURNING id",
        name=queue,
        policy=policy,
    )
    assert isinstance(job_id, uuid.UUID)
    return job_id


def setup(db: Any, service_tx: Any, kind: str, poison: str, **queue_options: Any) -> Any:
    """Queue "q" of ``kind`` with the poison job first and five good jobs behind it."""
    service_tx(lambda q: q.create_queue("q", **QUEUES[kind], **queue_options))
    policy = QUEUES[kind].get("policy", "standard")
    columns, field = POISONS[poison]
    bad = insert_raw(db, "q", policy, **columns)
    # Distinct keys, so that singleton and stately queues may activate them together.
    good = [
        service_tx(lambda q, i=i: q.send("q", {"n": i}, singleton_key=f"k{i}")) for i in range(5)
    ]
    return bad, good, field


def assert_poison_failed(job: Job, field: str) -> None:
    assert job.state.value == "failed"
    assert job.output["name"] == POISON_ERROR
    assert field in job.output["reasons"]
    assert field in job.output["message"]


def poison_logs(caplog: pytest.LogCaptureFixture, job_id: uuid.UUID) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.name == POISON_LOGGER and getattr(r, "job_id", None) == str(job_id)
    ]


# ------------------------------------------------------------------ the rows are poison


def test_huge_key_breaks_a_plain_activation_on_a_singleton_queue(env: Any) -> None:
    bad, _, _ = setup(env, env.tx, "singleton", "huge_key")
    with pytest.raises(sqlalchemy.exc.OperationalError, match="index row size"):
        env.sql("UPDATE {s}.job SET state = 'active' WHERE id = :id", id=bad)


def test_stately_queue_refuses_a_huge_key_at_insert_so_it_cannot_hold_one(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q", policy="stately"))
    with pytest.raises(sqlalchemy.exc.OperationalError, match="index row size"):
        insert_raw(env, "q", "stately", singleton_key=HUGE_KEY)


def test_year_zero_timestamp_cannot_be_read_by_a_plain_select(env: Any) -> None:
    bad, _, _ = setup(env, env.tx, "standard", "start_after_year_0")
    with pytest.raises(sqlalchemy.exc.DataError, match="too small"):
        env.sql("SELECT start_after FROM {s}.job WHERE id = :id", id=bad)


def test_deep_json_cannot_be_decoded_by_a_plain_select(env: Any) -> None:
    bad, _, _ = setup(env, env.tx, "standard", "data_1000_deep")
    with pytest.raises(RecursionError):
        env.sql("SELECT data FROM {s}.job WHERE id = :id", id=bad)


# ------------------------------------------------------------------ fetch


@pytest.mark.parametrize(("poison", "kind"), CASES)
def test_fetch_fails_the_poison_job_and_returns_the_good_jobs_behind_it(
    env: Any, caplog: pytest.LogCaptureFixture, poison: str, kind: str
) -> None:
    bad, good, field = setup(env, env.tx, kind, poison)
    caplog.set_level(logging.WARNING, logger=POISON_LOGGER)
    jobs = env.tx(lambda q: q.fetch("q", 10))
    assert sorted(j.id for j in jobs) == sorted(good)
    assert all(type(j) is Job for j in jobs)
    assert_poison_failed(env.tx(lambda q: q.get_job("q", bad)), field)
    [record] = poison_logs(caplog, bad)
    assert record.levelno == logging.WARNING
    extra = record.__dict__
    assert (extra["action"], extra["queue"], extra["state"]) == ("job_poisoned", "q", "failed")
    assert field in extra["reasons"]
    # Failed once for good: later fetches neither see nor log it again.
    assert env.tx(lambda q: q.fetch("q", 10)) == []
    assert len(poison_logs(caplog, bad)) == 1


@pytest.mark.parametrize(("poison", "kind"), CASES)
def test_fetch_of_one_job_skips_past_the_poison_job_in_the_same_call(
    env: Any, poison: str, kind: str
) -> None:
    bad, good, field = setup(env, env.tx, kind, poison)
    [job] = env.tx(lambda q: q.fetch("q", 1))
    assert job.id == good[0]
    assert_poison_failed(env.tx(lambda q: q.get_job("q", bad)), field)


def test_poison_job_with_retries_left_fails_for_good_without_a_retry(env: Any) -> None:
    bad, _, _ = setup(env, env.tx, "standard", "data_1000_deep")
    env.sql("UPDATE {s}.job SET retry_limit = 5 WHERE id = :id", id=bad)
    env.tx(lambda q: q.fetch("q", 10))
    [(state, retry_count, retry_limit)] = env.sql(
        "SELECT state, retry_count, retry_limit FROM {s}.job WHERE id = :id", id=bad
    )
    assert (state, retry_count, retry_limit) == ("failed", 0, 0)


@pytest.mark.parametrize("poison", ["start_after_year_0", "huge_key", "data_1000_deep"])
def test_poison_job_is_dead_lettered_like_any_failed_job(env: Any, poison: str) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    kind = "singleton" if poison == "huge_key" else "standard"
    bad, good, _ = setup(env, env.tx, kind, poison, dead_letter="dlq")
    # A row carries its dead letter queue itself (a sender copies the queue's).
    env.sql("UPDATE {s}.job SET dead_letter = 'dlq' WHERE id = :id", id=bad)
    assert len(env.tx(lambda q: q.fetch("q", 10))) == len(good)
    [(output,)] = env.sql("SELECT output FROM {s}.job WHERE name = 'dlq'")
    assert output["name"] == POISON_ERROR
    assert str(bad) in output["message"]


def test_json_at_the_depth_limit_is_fetched_and_one_level_more_is_poison(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    at_limit = insert_raw(env, "q", "standard", data=deep_json(MAX_JSON_DEPTH))
    past = insert_raw(env, "q", "standard", data=deep_json(MAX_JSON_DEPTH + 1))
    [job] = env.tx(lambda q: q.fetch("q", 10))
    assert job.id == at_limit
    depth, node = 0, job.data
    while isinstance(node, list):
        depth, node = depth + 1, node[0] if node else None
    assert depth == MAX_JSON_DEPTH
    assert_poison_failed(env.tx(lambda q: q.get_job("q", past)), "data")


def test_key_at_the_limit_is_activated_and_one_byte_more_is_poison(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q", policy="singleton"))
    at_limit = insert_raw(
        env, "q", "singleton", singleton_key=f"repeat('a', {MAX_SINGLETON_KEY_BYTES})"
    )
    past = insert_raw(
        env, "q", "singleton", singleton_key=f"repeat('b', {MAX_SINGLETON_KEY_BYTES + 1})"
    )
    [job] = env.tx(lambda q: q.fetch("q", 10))
    assert job.id == at_limit
    assert_poison_failed(env.tx(lambda q: q.get_job("q", past)), "singleton_key")


# ------------------------------------------------------------------ reading without fetching


@pytest.mark.parametrize(
    "poison", ["start_after_year_0", "created_on_year_0", "keep_until_infinity", "data_1000_deep"]
)
def test_get_job_and_list_jobs_return_an_unreadable_job_instead_of_raising(
    env: Any, poison: str
) -> None:
    bad, good, field = setup(env, env.tx, "standard", poison)
    job = env.tx(lambda q: q.get_job("q", bad))
    assert isinstance(job, UnreadableJob)
    assert list(job.unreadable) == [field]
    assert job.state.value == "created"
    listed = env.tx(lambda q: q.list_jobs("q"))
    assert sorted(j.id for j in listed) == sorted([bad, *good])
    assert [j.id for j in listed if isinstance(j, UnreadableJob)] == [bad]
    assert env.tx(lambda q: q.get_jobs("q", [bad, *good]))[0] is not None


def test_unreadable_timestamp_stands_in_as_the_nearest_readable_instant(env: Any) -> None:
    bad, _, _ = setup(env, env.tx, "standard", "start_after_year_0")
    job = env.tx(lambda q: q.get_job("q", bad))
    assert isinstance(job, UnreadableJob)
    assert job.start_after.year == 1
    assert "BC" in job.unreadable["start_after"]


# ------------------------------------------------------------------ workers


@pytest.mark.parametrize(
    ("poison", "kind"),
    [
        ("huge_key", "singleton"),
        ("start_after_year_0", "standard"),
        ("created_on_year_0", "stately"),
        ("data_1000_deep", "partitioned"),
    ],
)
def test_worker_completes_every_job_queued_behind_a_poison_job(
    harness: Harness, caplog: pytest.LogCaptureFixture, poison: str, kind: str
) -> None:
    h = harness
    caplog.set_level(logging.WARNING, logger=POISON_LOGGER)
    h.service_tx(lambda q: q.create_queue("q", **QUEUES[kind]))
    columns, field = POISONS[poison]
    bad = insert_raw(h, "q", QUEUES[kind].get("policy", "standard"), **columns)
    good = [send(h, "q", {"n": i}, singleton_key=f"k{i}") for i in range(5)]
    w = h.worker(poll_interval=0.5, batch_size=1, concurrency=1)
    w.register("q", h.handler())
    began = time.monotonic()
    h.start(w)

    def states() -> list[str]:
        return [h.job("q", i).state.value for i in good]

    wait_for(lambda: states() == ["completed"] * 5, timeout=10)
    h.stop(w)
    # Queued behind the poison job, the good jobs did not wait a poll each.
    assert time.monotonic() - began < 5
    assert bad not in h.started
    assert_poison_failed(h.job("q", bad), field)
    assert len(poison_logs(caplog, bad)) == 1


def test_redrive_leaves_an_unreadable_dead_letter_behind_and_moves_the_rest(
    env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    env.tx(lambda q: (q.create_queue("dlq"), q.create_queue("q")))
    deep = insert_raw(env, "dlq", "standard", data=deep_json(1000), state="'failed'")
    oversized = insert_raw(
        env, "dlq", "standard", data="jsonb_build_object('blob', repeat('x', 2 * 1024 * 1024))"
    )
    fine = insert_raw(env, "dlq", "standard", data="'{\"n\": 1}'::jsonb")
    with caplog.at_level(logging.WARNING):
        moved = env.tx(lambda q: q.redrive("dlq", "q"))
    assert len(moved) == 1
    [job] = env.tx(lambda q: q.list_jobs("q"))
    assert job.data == {"n": 1}
    left = {row.id for row in env.sql("SELECT id FROM {s}.job WHERE name = 'dlq'")}
    assert left == {deep, oversized} and fine not in left
    skipped = {
        getattr(r, "job_id", None)
        for r in caplog.records
        if getattr(r, "action", "") == "redrive_skipped"
    }
    assert skipped == {str(deep), str(oversized)}
