"""Dead-letter provenance and redrive at schema 46, as pg-boss 12.38 does them.

A job that fails for good is copied into its dead letter queue with where it came from
(``source_name``, ``source_id``, ``source_created_on``, ``source_retry_count``,
``source_output``) and the first job of its chain (``source_root_id``). ``redrive`` creates
each waiting copy again in the queue it failed in (or the one named), keeping its identity
columns and its root, and fails in place a copy its queue refuses. Node pg-boss 12.38.0 and we
redrive each other's dead letters alike.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Env
from sqlalchemy import text
from support.node import NodeBoss46, node46, node46_modules, node_url

from alkstore_sa import InvalidOptionsError, Job, JobState, QueueNotFoundError, SchemaFeatureError
from alkstore_sa.names import notify_channel

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below


@pytest.fixture
def env46(env46_or_split: Env) -> Env:
    """Every test here runs split as well (``noMultiMutationCte``, conftest)."""
    return env46_or_split


def queues(env: Any, **source: Any) -> None:
    """``dlq`` and ``orders`` (dead-lettering into it, no retries) with ``source`` options."""
    env.tx(lambda q: q.create_queue("dlq", retry_limit=0))
    env.tx(
        lambda q: q.create_queue(
            "orders", **{"retry_limit": 0, "dead_letter": "dlq", "expire_seconds": 77, **source}
        )
    )


def dead_lettered(env: Any, queue: str = "orders", **send: Any) -> uuid.UUID:
    """Send a job, fetch it and fail it for good; return its id."""
    env.tx(lambda q: q.send(queue, {"order": 1}, **send))
    [job] = env.tx(lambda q: q.fetch(queue))
    assert env.tx(lambda q: q.fail(queue, job, {"why": "boom"})).failed == [job.id]
    return job.id  # type: ignore[no-any-return]


def copy_in(env: Any, dlq: str = "dlq") -> Job:
    [copy] = env.tx(lambda q: q.list_jobs(dlq))
    return copy  # type: ignore[no-any-return]


def row(env: Any, job_id: uuid.UUID) -> Any:
    [r] = env.sql("SELECT * FROM {s}.job WHERE id = :i", i=job_id)
    return r


# ------------------------------------------------------------------ provenance


def test_a_dead_letter_copy_exposes_its_provenance_on_the_job_record(env46: Any) -> None:
    queues(env46)
    original = dead_lettered(env46, singleton_key="k1", priority=4)
    created_on = row(env46, original).created_on
    copy = copy_in(env46)
    assert (copy.source_name, copy.source_id, copy.source_created_on) == (
        "orders",
        original,
        created_on,
    )
    assert (copy.source_retry_count, copy.source_output, copy.source_root_id) == (
        0,
        {"why": "boom"},
        original,
    )
    assert (copy.output, copy.priority, copy.singleton_key) == (None, 4, "k1")
    # A fetched copy carries them too.
    [fetched] = env46.tx(lambda q: q.fetch("dlq"))
    assert (fetched.source_id, fetched.source_root_id) == (original, original)


# ------------------------------------------------------------------ redrive


def test_redrive_sends_each_copy_back_to_the_queue_it_failed_in(env46: Any) -> None:
    queues(env46)
    original = dead_lettered(env46, singleton_key="k1", priority=4)
    copy = copy_in(env46)
    [new_id] = env46.tx(lambda q: q.redrive("dlq"))
    assert new_id not in (original, copy.id)  # a new job, as pg-boss makes it
    assert env46.sql("SELECT id FROM {s}.job WHERE name = 'dlq'") == []
    new = env46.tx(lambda q: q.get_job("orders", new_id))
    assert (new.state, new.data, new.priority, new.singleton_key) == (
        JobState.CREATED,
        {"order": 1},
        4,
        "k1",
    )
    # Settings from the queue as it is now; the chain's root recorded.
    assert (new.retry_limit, new.expire_seconds, new.dead_letter, new.policy) == (
        0,
        77,
        "dlq",
        "standard",
    )
    assert (new.source_root_id, new.source_name, new.source_id, new.output) == (
        original,
        None,
        None,
        None,
    )
    assert (new.retry_count, new.started_on) == (0, None)


def test_a_redriven_job_failing_again_keeps_the_first_job_as_its_root(env46: Any) -> None:
    queues(env46)
    original = dead_lettered(env46)
    env46.tx(lambda q: q.redrive("dlq"))
    [again] = env46.tx(lambda q: q.fetch("orders"))
    env46.tx(lambda q: q.fail("orders", again, {"why": "twice"}))
    copy = copy_in(env46)
    assert (copy.source_id, copy.source_root_id, copy.source_output) == (
        again.id,
        original,
        {"why": "twice"},
    )
    [third] = env46.tx(lambda q: q.redrive("dlq"))
    assert env46.tx(lambda q: q.get_job("orders", third)).source_root_id == original


def test_redrive_to_a_named_queue_takes_that_queues_settings(env46: Any) -> None:
    queues(env46)
    env46.tx(lambda q: q.create_queue("replay", retry_limit=5, expire_seconds=33))
    dead_lettered(env46)
    [new_id] = env46.tx(lambda q: q.redrive("dlq", "replay"))
    new = env46.tx(lambda q: q.get_job("replay", new_id))
    assert (new.retry_limit, new.expire_seconds, new.dead_letter) == (5, 33, None)


def test_redrive_moves_the_oldest_first_at_most_limit_and_only_ids_given(env46: Any) -> None:
    queues(env46)
    for _ in range(3):
        dead_lettered(env46)
    copies = env46.sql("SELECT id FROM {s}.job WHERE name = 'dlq' ORDER BY created_on, id")
    picked = copies[2].id
    assert len(env46.tx(lambda q: q.redrive("dlq", ids=[picked]))) == 1
    assert picked not in {r.id for r in env46.sql("SELECT id FROM {s}.job WHERE name = 'dlq'")}
    assert len(env46.tx(lambda q: q.redrive("dlq", limit=1))) == 1
    left = env46.sql("SELECT id FROM {s}.job WHERE name = 'dlq'")
    assert [r.id for r in left] == [copies[1].id]


def test_redrive_filters_by_source_queue_data_and_creation_time(env46: Any) -> None:
    queues(env46)
    env46.tx(lambda q: q.create_queue("invoices", retry_limit=0, dead_letter="dlq"))
    dead_lettered(env46, "orders")
    env46.tx(lambda q: q.send("invoices", {"invoice": 7, "region": "eu"}))
    [job] = env46.tx(lambda q: q.fetch("invoices"))
    env46.tx(lambda q: q.fail("invoices", job))
    [(cut,)] = env46.sql("SELECT max(created_on) + interval '1 microsecond' FROM {s}.job")
    assert env46.tx(lambda q: q.redrive("dlq", created_before=cut - dt.timedelta(days=1))) == []
    assert env46.tx(lambda q: q.redrive("dlq", data={"region": "us"})) == []
    [moved] = env46.tx(lambda q: q.redrive("dlq", data={"region": "eu"}, created_before=cut))
    assert env46.tx(lambda q: q.get_job("invoices", moved)).data["invoice"] == 7
    [moved] = env46.tx(lambda q: q.redrive("dlq", source_name="orders"))
    assert env46.tx(lambda q: q.get_job("orders", moved)).data == {"order": 1}


@pytest.mark.parametrize(
    "bad",
    [
        {"source_name": ""},
        {"data": ["not", "an", "object"]},
        {"data": {"bad": float("nan")}},
        {"created_before": dt.datetime(2030, 1, 1)},  # naive
        {"created_before": "2030-01-01"},
    ],
    ids=["empty-source", "data-list", "data-nan", "naive-time", "text-time"],
)
def test_bad_redrive_filters_are_refused_before_any_statement(
    env46: Any, bad: dict[str, Any]
) -> None:
    queues(env46)
    dead_lettered(env46)
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match=next(iter(bad))):
        svc.redrive("dlq", **bad)
    assert len(svc.redrive("dlq")) == 1  # the transaction is intact
    env46.commit()


def test_a_copy_its_queue_refuses_is_failed_in_place_with_the_reason(
    env46: Any, caplog: pytest.LogCaptureFixture
) -> None:
    queues(env46, policy="short")
    dead_lettered(env46, singleton_key="k1")
    copy = copy_in(env46)
    env46.tx(lambda q: q.send("orders", {"newer": True}, singleton_key="k1"))  # holds the key
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        assert env46.tx(lambda q: q.redrive("dlq")) == []
    failed = row(env46, copy.id)
    assert (failed.state, failed.completed_on is not None) == ("failed", True)
    assert failed.output == {
        "message": "Not redriven: queue orders already has a job with singletonKey k1 "
        "under its short policy",
        "reason": "redrive_conflict",
        "destination": "orders",
        "policy": "short",
        "singletonKey": "k1",
    }
    assert failed.source_output == {"why": "boom"}
    assert any("redrive_conflict" in r.getMessage() for r in caplog.records)
    # A failed copy is not a candidate again.
    assert env46.tx(lambda q: q.redrive("dlq")) == []


def test_two_copies_with_one_key_in_one_batch_move_the_oldest_and_fail_the_other(
    env46: Any,
) -> None:
    queues(env46, policy="short")
    first = dead_lettered(env46, singleton_key="k1")
    dead_lettered(env46, singleton_key="k1")
    [moved] = env46.tx(lambda q: q.redrive("dlq"))
    assert env46.tx(lambda q: q.get_job("orders", moved)).source_root_id == first
    [left] = env46.sql(
        "SELECT state::text, output->>'reason' AS why FROM {s}.job WHERE name = 'dlq'"
    )
    assert (left.state, left.why) == ("failed", "redrive_conflict")


def test_key_strict_fifo_conflicts_fail_only_the_oldest_of_a_key(env46: Any) -> None:
    # Jobs sent to a key_strict_fifo dead letter queue by hand carry its policy; its unique
    # index allows one failed job per key, so only the oldest refused one is failed.
    env46.tx(lambda q: q.create_queue("kq", policy="key_strict_fifo"))
    env46.tx(lambda q: q.create_queue("orders", policy="short"))
    older = env46.tx(lambda q: q.send("kq", {"n": 1}, singleton_key="k"))
    newer = env46.tx(lambda q: q.send("kq", {"n": 2}, singleton_key="k"))
    env46.tx(lambda q: q.send("orders", {"holds": "k"}, singleton_key="k"))
    assert env46.tx(lambda q: q.redrive("kq", "orders")) == []
    states = dict(env46.sql("SELECT id, state::text FROM {s}.job WHERE name = 'kq'"))
    assert states == {older: "failed", newer: "created"}
    # The key is held by the failed one: the newer waits behind it, as a fetch would.
    assert env46.tx(lambda q: q.redrive("kq", "orders")) == []
    assert row(env46, newer).state == "created"


def test_a_keyless_copy_redriven_into_key_strict_fifo_is_failed_in_place(env46: Any) -> None:
    # key_strict_fifo requires a key (a CHECK on the job table): a copy without one is a
    # conflict, failed in place, while a keyed copy of the same batch moves and the
    # caller's transaction goes on.
    queues(env46)
    env46.tx(lambda q: q.create_queue("kq", policy="key_strict_fifo"))
    keyless = env46.tx(lambda q: q.send("dlq", {"n": 1}))
    keyed = env46.tx(lambda q: q.send("dlq", {"n": 2}, singleton_key="k"))
    svc = env46.service()
    mine = svc.send("orders", {"mine": 1})
    [moved] = svc.redrive("dlq", "kq")
    env46.commit()
    assert env46.tx(lambda q: q.get_job("kq", moved)).data == {"n": 2}
    assert env46.sql("SELECT id FROM {s}.job WHERE name = 'dlq'") == [(keyless,)]
    failed = row(env46, keyless)
    assert failed.state == "failed"
    assert failed.output == {
        "message": "Not redriven: queue kq requires a singletonKey under its "
        "key_strict_fifo policy",
        "reason": "redrive_conflict",
        "destination": "kq",
        "policy": "key_strict_fifo",
        "singletonKey": None,
    }
    assert row(env46, mine).state == "created"
    assert keyed != moved


def test_a_copy_without_a_source_stays_unless_a_queue_is_named(env46: Any) -> None:
    queues(env46)
    sent = env46.tx(lambda q: q.send("dlq", {"by": "hand"}))
    assert env46.tx(lambda q: q.redrive("dlq")) == []
    assert row(env46, sent).state == "created"
    [moved] = env46.tx(lambda q: q.redrive("dlq", "orders"))
    assert env46.tx(lambda q: q.get_job("orders", moved)).data == {"by": "hand"}


def test_a_copy_running_or_failed_in_the_dead_letter_queue_stays(env46: Any) -> None:
    queues(env46)
    dead_lettered(env46)
    dead_lettered(env46)
    running, failing = env46.tx(lambda q: q.fetch("dlq", 2))
    env46.tx(lambda q: q.fail("dlq", failing))
    assert env46.tx(lambda q: q.redrive("dlq")) == []
    states = dict(env46.sql("SELECT id, state::text FROM {s}.job WHERE name = 'dlq'"))
    assert states == {running.id: "active", failing.id: "failed"}


def test_redrive_bad_input_is_refused_before_any_statement(env46: Any) -> None:
    queues(env46)
    dead_lettered(env46)
    svc = env46.service()
    call: Callable[[], object]
    error: type[Exception]
    for call, error in (
        (lambda: svc.redrive("dlq", "dlq"), InvalidOptionsError),
        (lambda: svc.redrive("dlq", limit=0), InvalidOptionsError),
        (lambda: svc.redrive("dlq", ids=["nope"]), InvalidOptionsError),
        (lambda: svc.redrive("dlq", ""), InvalidOptionsError),
        (lambda: svc.redrive("dlq", "missing"), QueueNotFoundError),
        (lambda: svc.redrive("missing"), QueueNotFoundError),
    ):
        with pytest.raises(error):
            call()
    # The transaction is intact: the redrive still runs in it.
    assert len(svc.redrive("dlq")) == 1
    env46.commit()


def test_redrive_without_a_destination_at_schema_26_is_refused(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("orders"))
    svc = env.service()
    with pytest.raises(InvalidOptionsError, match="required at schema 26"):
        svc.redrive("dlq")
    with pytest.raises(SchemaFeatureError, match="redrive by source_name"):
        svc.redrive("dlq", "orders", source_name="orders")
    assert svc.send("dlq", {}) is not None  # transaction intact
    env.commit()


def test_redrive_in_the_callers_transaction_rolls_back_with_it(env46: Any) -> None:
    queues(env46)
    dead_lettered(env46)
    svc = env46.service()
    assert len(svc.redrive("dlq")) == 1
    env46.rollback()
    assert len(env46.sql("SELECT id FROM {s}.job WHERE name = 'dlq'")) == 1


@pytest.mark.postgres_only
def test_redrive_wakes_listening_workers_of_the_destination(env46: Any) -> None:
    queues(env46)
    dead_lettered(env46)
    svc = env46.service()
    channel = notify_channel(env46.schema)
    with env46.engine.connect() as listener:
        listener.execute(text(f'LISTEN "{channel}"'))
        listener.commit()
        svc.redrive("dlq")
        env46.commit()
        raw = listener.connection.driver_connection
        notices = list(raw.notifies(timeout=5, stop_after=1))
    assert [(n.channel, n.payload) for n in notices] == [(channel, "orders")]


# ------------------------------------------------------------------ with Node


NEW_JOB = (
    "name, data, priority, state::text, retry_limit, retry_count, retry_delay, retry_backoff, "
    "expire_seconds, deletion_seconds, policy, singleton_key, dead_letter, heartbeat_seconds, "
    "source_name, source_id, source_created_on, source_retry_count, source_output, output, "
    "group_id, group_tier, trace_context, start_after <= now() AS due, "
    "round(extract(epoch FROM keep_until - created_on)) AS retained_for"
)


@pytest.mark.interop
def test_node_and_python_redrive_each_others_dead_letters_alike(
    env46_sync: Any, node46: Callable[..., NodeBoss46]
) -> None:
    queues(env46_sync, retry_delay=3, retention_seconds=600, heartbeat_seconds=30)
    boss = node46(env46_sync.schema)
    originals = {}
    # Python dead-letters the first two, Node the other two.
    for side in ("py-a", "py-b", "node-a", "node-b"):
        originals[side] = env46_sync.tx(lambda q, s=side: q.send("orders", {"side": s}, priority=2))
    for _ in ("py-a", "py-b"):  # fetched oldest first
        [job] = env46_sync.tx(lambda q: q.fetch("orders"))
        env46_sync.tx(lambda q, j=job: q.fail("orders", j, {"by": "python"}))
    for _ in ("node-a", "node-b"):
        [job] = env46_sync.tx(lambda q: q.fetch("orders"))
        boss.call("fail", "orders", str(job.id), {"by": "node"})
    copies = {c.data["side"]: c for c in env46_sync.tx(lambda q: q.list_jobs("dlq"))}
    assert {c.source_id for c in copies.values()} == set(originals.values())

    # Each side redrives one copy of each.
    ours = env46_sync.tx(lambda q: q.redrive("dlq", ids=[copies["py-a"].id, copies["node-a"].id]))
    moved = boss.call("redrive", "dlq", {"ids": [str(copies["py-b"].id), str(copies["node-b"].id)]})
    assert (len(ours), moved) == (2, 2)
    assert env46_sync.sql("SELECT id FROM {s}.job WHERE name = 'dlq'") == []

    rows = {
        r.data["side"]: r
        for r in env46_sync.sql(
            f"SELECT id, source_root_id, {NEW_JOB} FROM {{s}}.job "
            "WHERE name = 'orders' AND state = 'created'"
        )
    }
    assert set(rows) == set(originals)
    for side, r in rows.items():
        assert r.source_root_id == originals[side]
        assert r.id not in (originals[side], copies[side].id)
    comparable = [
        {k: v for k, v in r._asdict().items() if k not in ("id", "source_root_id", "data")}
        for r in rows.values()
    ]
    assert all(c == comparable[0] for c in comparable), comparable
    assert comparable[0]["dead_letter"] == "dlq" and comparable[0]["source_name"] is None
