"""The documented limits (docs/concepts/limits.md): a value at a limit works end to end,
one past it is refused before any SQL, naming the option and the limit, and the
caller's other writes in the same transaction still commit."""

from __future__ import annotations

import datetime as dt
import random
import string
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from support.statements import recorded

from alkstore_sa import InvalidNameError, InvalidOptionsError, limits
from alkstore_sa import options as opt
from alkstore_sa.worker import AsyncWorker, Worker
from alkstore_sa.worker._attempt import prepare_output

Bad = Callable[[Any, str], Any]

WITNESS = "witness"

# The longest queue name leaves the least room in every index a key enters.
LONG = "q" * 200
POLICIES = ["standard", "short", "singleton", "stately", "exclusive"]


def incompressible(n_bytes: int, *, wide: bool = False) -> str:
    """Random text of exactly ``n_bytes`` in UTF-8 that PostgreSQL cannot compress.

    ``wide`` uses three-byte characters, so the byte count is three times the length.
    """
    rng = random.Random(n_bytes * 2 + wide)
    if not wide:
        return "".join(rng.choice(string.ascii_letters + string.digits) for _ in range(n_bytes))
    head = "".join(chr(rng.randrange(0x4E00, 0x9FFF)) for _ in range(n_bytes // 3))
    return head + "x" * (n_bytes % 3)


def nested(depth: int) -> Any:
    """``depth`` arrays, one inside the other, around a number."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def statements(env: Any) -> Any:
    return recorded(env.async_engine.sync_engine if env.async_engine is not None else env.engine)


def refused_in_a_transaction(env: Any, queue: str, bad: Bad, option: str) -> InvalidOptionsError:
    """``bad`` raises InvalidOptionsError naming ``option`` before any SQL, writes no
    job, and the writes made before it in the same transaction commit."""
    [(before,)] = env.sql("SELECT count(*) FROM {s}.job WHERE name <> :w", w=WITNESS)
    svc = env.service()
    # Earlier writes of the caller: a queue and a job on it (a standard queue, so
    # that no policy of ``queue`` can turn the job away).
    svc.create_queue(WITNESS, exist_ok=True)
    earlier = svc.send(WITNESS, {"written": "before the error"})
    with statements(env) as seen, pytest.raises(InvalidOptionsError) as caught:
        bad(svc, queue)
    env.commit()
    assert seen == [], f"SQL ran before the error: {seen}"
    assert caught.value.option == option
    assert repr(option) in str(caught.value)
    rows = env.sql("SELECT data FROM {s}.job WHERE id = :id", id=earlier)
    assert rows == [({"written": "before the error"},)]
    assert env.sql("SELECT count(*) FROM {s}.job WHERE name <> :w", w=WITNESS) == [(before,)]
    return caught.value


@pytest.fixture
def long_queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue(LONG))
    return LONG


# ------------------------------------------------------------------ singleton_key


@pytest.mark.parametrize("throttled", [False, True], ids=["plain", "singleton_seconds"])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_singleton_key_at_the_byte_limit_sends_activates_retries_and_completes(
    env: Any, policy: str, throttled: bool
) -> None:
    name = (policy + "-" + LONG)[:200]
    env.tx(lambda q: q.create_queue(name, policy=policy, retry_limit=1))
    key = incompressible(limits.MAX_SINGLETON_KEY_BYTES)
    extra = {"singleton_seconds": 60} if throttled else {}
    job_id = env.tx(lambda q: q.send(name, {"n": 1}, singleton_key=key, **extra))
    assert job_id is not None
    [job] = env.tx(lambda q: q.fetch(name))
    assert (job.id, job.singleton_key) == (job_id, key)
    env.tx(lambda q: q.fail(name, job_id, {"once": True}))  # back to retry, then active again
    [again] = env.tx(lambda q: q.fetch(name))
    assert again.id == job_id
    env.tx(lambda q: q.complete(name, job_id, {"done": True}))
    assert env.sql("SELECT state::text FROM {s}.job WHERE id = :id", id=job_id) == [("completed",)]


def test_a_singleton_key_of_three_byte_characters_at_the_limit_works(
    env: Any, long_queue: str
) -> None:
    key = incompressible(limits.MAX_SINGLETON_KEY_BYTES, wide=True)
    assert len(key) < limits.MAX_SINGLETON_KEY_BYTES
    job_id = env.tx(lambda q: q.send(long_queue, None, singleton_key=key, singleton_seconds=60))
    [job] = env.tx(lambda q: q.fetch(long_queue))
    assert (job.id, job.singleton_key) == (job_id, key)


def test_a_singleton_key_one_byte_over_the_limit_is_refused(env: Any, long_queue: str) -> None:
    key = incompressible(limits.MAX_SINGLETON_KEY_BYTES + 1)
    error = refused_in_a_transaction(
        env, long_queue, lambda q, n: q.send(n, None, singleton_key=key), "singleton_key"
    )
    assert f"at most {limits.MAX_SINGLETON_KEY_BYTES} bytes" in str(error)


def test_the_singleton_key_limit_counts_utf8_bytes_not_characters(
    env: Any, long_queue: str
) -> None:
    key = "é" * (limits.MAX_SINGLETON_KEY_BYTES // 2 + 1)  # fewer characters than the limit
    error = refused_in_a_transaction(
        env, long_queue, lambda q, n: q.send(n, None, singleton_key=key), "singleton_key"
    )
    assert f"not {limits.MAX_SINGLETON_KEY_BYTES + 2} bytes" in str(error)


@pytest.mark.parametrize("policy", POLICIES)
def test_an_oversized_singleton_key_is_refused_on_every_policy(env: Any, policy: str) -> None:
    env.tx(lambda q: q.create_queue(policy, policy=policy))
    key = incompressible(5000)
    refused_in_a_transaction(
        env, policy, lambda q, n: q.send(n, None, singleton_key=key), "singleton_key"
    )
    refused_in_a_transaction(
        env,
        policy,
        lambda q, n: q.send(n, None, singleton_key=key, singleton_seconds=10),
        "singleton_key",
    )


def test_oversized_keys_of_throttled_debounced_and_batched_sends_are_refused(
    env: Any, long_queue: str
) -> None:
    key = incompressible(limits.MAX_SINGLETON_KEY_BYTES + 1)
    cases: list[tuple[Bad, str]] = [
        (lambda q, n: q.send_throttled(n, None, 60, key), "singleton_key"),
        (lambda q, n: q.send_debounced(n, None, 60, key), "singleton_key"),
        (lambda q, n: q.send_many(n, [{}, {"singleton_key": key}]), "jobs[1].singleton_key"),
    ]
    for bad, option in cases:
        refused_in_a_transaction(env, long_queue, bad, option)


def test_a_singleton_key_with_a_lone_surrogate_is_refused(env: Any, long_queue: str) -> None:
    refused_in_a_transaction(
        env, long_queue, lambda q, n: q.send(n, None, singleton_key="a\ud800"), "singleton_key"
    )


def test_a_schedule_key_past_its_limit_is_refused(env: Any, long_queue: str) -> None:
    key = "k" * (limits.MAX_SCHEDULE_KEY_BYTES + 1)
    refused_in_a_transaction(
        env, long_queue, lambda q, n: q.schedule(n, "* * * * *", key=key), "key"
    )
    assert env.sql("SELECT count(*) FROM {s}.schedule") == [(0,)]


def test_a_schedule_key_at_its_limit_is_stored(env: Any, long_queue: str) -> None:
    key = incompressible(limits.MAX_SCHEDULE_KEY_BYTES)
    env.tx(lambda q: q.schedule(long_queue, "* * * * *", key=key))
    assert [s.key for s in env.tx(lambda q: q.get_schedules(long_queue))] == [key]


def test_an_event_name_past_its_limit_is_refused(env: Any, long_queue: str) -> None:
    event = "e" * (limits.MAX_EVENT_BYTES + 1)
    refused_in_a_transaction(env, long_queue, lambda q, n: q.subscribe(event, n), "event")
    refused_in_a_transaction(env, long_queue, lambda q, n: q.publish(event, None), "event")


def test_an_event_name_at_its_limit_can_be_subscribed_and_published(
    env: Any, long_queue: str
) -> None:
    event = incompressible(limits.MAX_EVENT_BYTES)
    env.tx(lambda q: q.subscribe(event, long_queue))
    [job_id] = env.tx(lambda q: q.publish(event, {"hello": 1}))
    [job] = env.tx(lambda q: q.fetch(long_queue))
    assert job.id == job_id


# ------------------------------------------------------------------ start_after

EAST = dt.timezone(dt.timedelta(hours=14))


@pytest.mark.parametrize(
    "when",
    [dt.datetime(1, 1, 1, tzinfo=EAST), "0001-01-01T00:00:00+14:00", "0001-01-01T23:59:59Z"],
    ids=["datetime", "text", "one second early"],
)
def test_start_after_before_year_1_in_utc_is_refused(env: Any, long_queue: str, when: Any) -> None:
    error = refused_in_a_transaction(
        env, long_queue, lambda q, n: q.send(n, None, start_after=when), "start_after"
    )
    assert "0001-01-02" in str(error)


def test_start_after_before_year_1_is_refused_in_schedules_too(env: Any, long_queue: str) -> None:
    refused_in_a_transaction(
        env,
        long_queue,
        lambda q, n: q.schedule(n, "* * * * *", start_after="0001-01-01T00:00:00+14:00"),
        "start_after",
    )


def test_the_earliest_start_after_reads_back_in_a_time_zone_west_of_utc(
    env: Any, long_queue: str
) -> None:
    job_id = env.tx(lambda q: q.send(long_queue, None, start_after=limits.EARLIEST_START))
    svc = env.service()
    env.session.execute(text("SET LOCAL TIME ZONE 'Etc/GMT+12'"))  # UTC-12
    assert svc.get_job(long_queue, job_id).start_after == limits.EARLIEST_START
    assert [j.id for j in svc.list_jobs(long_queue)] == [job_id]
    [job] = svc.fetch(long_queue)
    assert job.start_after == limits.EARLIEST_START
    env.commit()


def test_the_latest_start_after_with_the_longest_retention_reads_back_east_of_utc(
    env: Any, long_queue: str
) -> None:
    latest = limits.LATEST_START - dt.timedelta(seconds=1)
    job_id = env.tx(
        lambda q: q.send(long_queue, None, start_after=latest, retention_seconds=opt.INT32_MAX)
    )
    svc = env.service()
    env.session.execute(text("SET LOCAL TIME ZONE 'Etc/GMT-14'"))  # UTC+14
    job = svc.get_job(long_queue, job_id)
    assert job.start_after == latest
    assert job.keep_until == latest + dt.timedelta(seconds=opt.INT32_MAX)
    env.commit()


@pytest.mark.parametrize(
    "when",
    [
        limits.LATEST_START,
        dt.datetime(8999, 12, 31, 10, tzinfo=dt.timezone(-dt.timedelta(hours=14))),
    ],
    ids=["utc", "west of utc"],
)
def test_start_after_at_the_upper_bound_is_refused(
    env: Any, long_queue: str, when: dt.datetime
) -> None:
    refused_in_a_transaction(
        env, long_queue, lambda q, n: q.send(n, None, start_after=when), "start_after"
    )


# ------------------------------------------------------------------ JSON depth


def test_data_nested_to_the_depth_limit_is_sent_and_fetched(env: Any, long_queue: str) -> None:
    data = {"deep": nested(limits.MAX_JSON_DEPTH - 1)}
    job_id = env.tx(lambda q: q.send(long_queue, data))
    [job] = env.tx(lambda q: q.fetch(long_queue))
    assert (job.id, job.data) == (job_id, data)


def test_data_one_level_past_the_depth_limit_is_refused(env: Any, long_queue: str) -> None:
    data = {"deep": nested(limits.MAX_JSON_DEPTH)}
    error = refused_in_a_transaction(env, long_queue, lambda q, n: q.send(n, data), "data")
    assert str(limits.MAX_JSON_DEPTH) in str(error)


def test_data_nested_far_past_the_recursion_limit_is_refused_by_the_depth_walk(
    env: Any, long_queue: str
) -> None:
    # json.dumps itself would raise RecursionError here; the walk never recurses.
    data = nested(100_000)
    refused_in_a_transaction(env, long_queue, lambda q, n: q.send(n, data), "data")


def test_data_that_contains_itself_is_refused(env: Any, long_queue: str) -> None:
    loop: dict[str, Any] = {}
    loop["self"] = [loop]
    refused_in_a_transaction(env, long_queue, lambda q, n: q.send(n, loop), "data")


@pytest.mark.parametrize("method", ["complete", "fail"])
def test_output_past_the_depth_limit_is_refused(env: Any, long_queue: str, method: str) -> None:
    job_id = env.tx(lambda q: q.send(long_queue, None))
    env.tx(lambda q: q.fetch(long_queue))
    deep = {"deep": nested(limits.MAX_JSON_DEPTH)}
    refused_in_a_transaction(
        env, long_queue, lambda q, n: getattr(q, method)(n, job_id, deep), "output"
    )
    assert env.sql("SELECT state::text FROM {s}.job WHERE id = :id", id=job_id) == [("active",)]


def test_depth_counts_arrays_objects_and_tuples_but_not_scalars() -> None:
    assert not opt.json_depth_exceeds("text", 0)
    assert not opt.json_depth_exceeds({"a": [1, (2,)]}, 3)
    assert opt.json_depth_exceeds({"a": [1, (2,)]}, 2)
    assert not opt.json_depth_exceeds([[], [[]], {"x": {}}], 3)
    assert opt.json_depth_exceeds([[], [[[]]]], 3)


# ------------------------------------------------------------------ payload size


def json_of_bytes(n: int) -> str:
    """A JSON string value whose compact encoding is exactly ``n`` bytes."""
    return "x" * (n - 2)


def test_data_of_exactly_the_payload_limit_is_sent_and_fetched(env: Any, long_queue: str) -> None:
    data = json_of_bytes(limits.MAX_PAYLOAD_BYTES)
    job_id = env.tx(lambda q: q.send(long_queue, data))
    [job] = env.tx(lambda q: q.fetch(long_queue))
    assert (job.id, job.data) == (job_id, data)


def test_data_one_byte_over_the_payload_limit_is_refused(env: Any, long_queue: str) -> None:
    data = json_of_bytes(limits.MAX_PAYLOAD_BYTES + 1)
    error = refused_in_a_transaction(env, long_queue, lambda q, n: q.send(n, data), "data")
    assert f"limit of {limits.MAX_PAYLOAD_BYTES}" in str(error)


def test_the_payload_limit_counts_utf8_bytes(env: Any, long_queue: str) -> None:
    data = "é" * (limits.MAX_PAYLOAD_BYTES // 2)  # half as many characters as bytes
    refused_in_a_transaction(env, long_queue, lambda q, n: q.send(n, data), "data")


def test_the_payload_limit_is_read_when_each_job_is_sent(
    env: Any, long_queue: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(limits, "MAX_PAYLOAD_BYTES", 100)
    refused_in_a_transaction(env, long_queue, lambda q, n: q.send(n, json_of_bytes(101)), "data")
    assert env.tx(lambda q: q.send(long_queue, json_of_bytes(100))) is not None


def test_output_over_the_payload_limit_is_refused(env: Any, long_queue: str) -> None:
    job_id = env.tx(lambda q: q.send(long_queue, None))
    env.tx(lambda q: q.fetch(long_queue))
    big = {"text": "x" * limits.MAX_PAYLOAD_BYTES}
    refused_in_a_transaction(env, long_queue, lambda q, n: q.complete(n, job_id, big), "output")
    assert env.sql("SELECT state::text FROM {s}.job WHERE id = :id", id=job_id) == [("active",)]


def test_a_handler_result_over_a_limit_fails_the_job_with_the_reason() -> None:
    kind, output = prepare_output("complete", {"text": "x" * limits.MAX_PAYLOAD_BYTES})
    assert kind == "fail"
    assert output["name"] == "InvalidOptionsError"
    assert f"limit of {limits.MAX_PAYLOAD_BYTES}" in output["message"]
    kind, output = prepare_output("complete", nested(limits.MAX_JSON_DEPTH + 1))
    assert kind == "fail" and str(limits.MAX_JSON_DEPTH) in output["message"]


# ------------------------------------------------------------------ types


BAD_TYPES: list[tuple[str, Bad, str]] = [
    ("exist_ok text", lambda q, n: q.create_queue("new", exist_ok="no"), "exist_ok"),
    ("exist_ok int", lambda q, n: q.create_queue(n, exist_ok=1), "exist_ok"),
    ("exist_ok None", lambda q, n: q.create_queue(n, exist_ok=None), "exist_ok"),
    ("send_many None", lambda q, n: q.send_many(n, None), "jobs"),
    ("send_many text", lambda q, n: q.send_many(n, "abc"), "jobs"),
    ("send_many one job", lambda q, n: q.send_many(n, {"data": 1}), "jobs"),
    ("send_many number", lambda q, n: q.send_many(n, 5), "jobs"),
    ("get_queues number", lambda q, n: q.get_queues(5), "names"),
    ("get_queues mapping", lambda q, n: q.get_queues({n: 1}), "names"),
    ("retry_limit bool", lambda q, n: q.send(n, None, retry_limit=True), "retry_limit"),
    ("retry_delay fraction", lambda q, n: q.send(n, None, retry_delay=1.5), "retry_delay"),
    ("priority float", lambda q, n: q.send(n, None, priority=1.0), "priority"),
    ("retry_backoff int", lambda q, n: q.send(n, None, retry_backoff=1), "retry_backoff"),
    ("singleton_key bytes", lambda q, n: q.send(n, None, singleton_key=b"k"), "singleton_key"),
    (
        "singleton_seconds bool",
        lambda q, n: q.send(n, None, singleton_seconds=True),
        "singleton_seconds",
    ),
    ("queue retry_limit bool", lambda q, n: q.create_queue("x", retry_limit=False), "retry_limit"),
    ("update partition", lambda q, n: q.update_queue(n, retry_backoff="no"), "retry_backoff"),
]


@pytest.mark.parametrize(("label", "bad", "option"), BAD_TYPES, ids=[c[0] for c in BAD_TYPES])
def test_options_of_the_wrong_type_are_refused_naming_them(
    env: Any, long_queue: str, label: str, bad: Bad, option: str
) -> None:
    refused_in_a_transaction(env, long_queue, bad, option)
    assert sorted(q.name for q in env.tx(lambda q: q.get_queues())) == [long_queue, WITNESS]


def test_a_worker_with_an_empty_schema_name_is_refused(engine: Engine) -> None:
    with pytest.raises(InvalidNameError) as caught:
        Worker(engine, schema="")
    assert caught.value.option == "schema"


def test_an_async_worker_with_an_empty_schema_name_is_refused(database_url: str) -> None:
    with pytest.raises(InvalidNameError) as caught:
        AsyncWorker(create_async_engine(database_url), schema="")
    assert caught.value.option == "schema"


def test_a_worker_without_a_schema_uses_pgboss(engine: Engine) -> None:
    assert Worker(engine).schema == "pgboss"


@pytest.mark.parametrize("flag", ["listen", "supervise"])
def test_worker_flags_must_be_booleans(engine: Engine, flag: str) -> None:
    with pytest.raises(InvalidOptionsError) as caught:
        options: dict[str, Any] = {flag: "no"}
        Worker(engine, **options)
    assert caught.value.option == flag
