"""``update`` and ``upsert`` at schema 46 (pg-boss 12.38's, docs/how-to/upserts.md).

Sync and async services (``env46``), refusals at schema 26, the caller's transaction
kept usable through every refusal and conflict, and four processes upserting the same
keys while a worker claims them.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine
from support.blocking import run_blocked

from alkstore_sa import (
    InvalidOptionsError,
    QueueNotFoundError,
    SchemaFeatureError,
    UpdateResult,
    UpsertResult,
)


def row(env: Any, job_id: uuid.UUID, columns: str) -> Any:
    [found] = env.sql(f"SELECT {columns} FROM {{s}}.job WHERE id = :id", id=job_id)
    return found


def jobs_of(env: Any, queue: str) -> list[Any]:
    return list(
        env.sql(
            "SELECT id, state::text AS state, data, singleton_key, upsert_by_key "
            "FROM {s}.job WHERE name = :q ORDER BY created_on, id",
            q=queue,
        )
    )


# ------------------------------------------------------------------ upsert


def test_upsert_inserts_then_replaces_the_data_of_the_keys_created_job(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("u"))
    first = env46.tx(lambda q: q.upsert("u", {"v": 1}, singleton_key="k"))
    assert isinstance(first, UpsertResult)
    assert (first.updated, first.inserted, first.rejected) == (0, 1, False)
    [job_id] = first.jobs
    second = env46.tx(lambda q: q.upsert("u", {"v": 2}, singleton_key="k"))
    assert (second.jobs, second.updated, second.inserted) == ((job_id,), 1, 0)
    [job] = jobs_of(env46, "u")
    assert (job.id, job.data, job.upsert_by_key, job.state) == (job_id, {"v": 2}, True, "created")


def test_an_upsert_after_the_job_started_inserts_a_new_one(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("u"))
    env46.tx(lambda q: q.upsert("u", {"v": 1}, singleton_key="k"))
    [active] = env46.tx(lambda q: q.fetch("u"))
    later = env46.tx(lambda q: q.upsert("u", {"v": 2}, singleton_key="k"))
    assert later.inserted == 1 and later.jobs != (active.id,)
    assert row(env46, active.id, "data").data == {"v": 1}  # the running job is left alone
    assert [j.state for j in jobs_of(env46, "u")] == ["active", "created"]


def test_upsert_edits_a_job_sent_with_the_key_and_a_retry_job_too(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("u", retry_limit=3, retry_delay=60))
    sent = env46.tx(lambda q: q.send("u", {"v": 0}, singleton_key="k"))
    assert env46.tx(lambda q: q.upsert("u", {"v": 1}, singleton_key="k")).jobs == (sent,)
    [job] = env46.tx(lambda q: q.fetch("u"))
    env46.tx(lambda q: q.fail("u", job))
    assert row(env46, sent, "state::text AS s").s == "retry"
    again = env46.tx(lambda q: q.upsert("u", {"v": 2}, singleton_key="k"))
    assert (again.jobs, again.updated) == ((sent,), 1)
    assert row(env46, sent, "data, state::text AS s") == ({"v": 2}, "retry")


def test_upsert_sets_only_the_options_given(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("u", retry_limit=4))
    [job_id] = env46.tx(lambda q: q.upsert("u", 1, singleton_key="k", priority=5)).jobs
    before = row(env46, job_id, "priority, retry_limit, start_after, keep_until")
    assert (before.priority, before.retry_limit) == (5, 4)
    env46.tx(lambda q: q.upsert("u", 2, singleton_key="k", start_after=dt.timedelta(hours=1)))
    after = row(env46, job_id, "data, priority, retry_limit, start_after, keep_until")
    assert (after.data, after.priority, after.retry_limit) == (2, 5, 4)
    # keep_until moves with start_after: the job keeps its retention window.
    assert after.start_after > before.start_after
    assert after.keep_until - after.start_after == before.keep_until - before.start_after
    env46.tx(lambda q: q.upsert("u", 3, singleton_key="k", retention_seconds=60))
    last = row(env46, job_id, "keep_until - start_after AS window")
    assert last.window == dt.timedelta(seconds=60)


def test_upsert_by_id_edits_that_job_or_inserts_it_with_that_id(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("u"))
    wanted = uuid.uuid4()
    made = env46.tx(lambda q: q.upsert("u", {"v": 1}, id=wanted))
    assert (made.jobs, made.inserted) == ((wanted,), 1)
    assert row(env46, wanted, "upsert_by_key").upsert_by_key is None  # not by key
    edited = env46.tx(lambda q: q.upsert("u", {"v": 2}, id=str(wanted)))
    assert (edited.jobs, edited.updated) == ((wanted,), 1)
    assert row(env46, wanted, "data").data == {"v": 2}


def test_a_policy_that_refuses_the_new_job_is_a_rejected_result_not_an_error(
    env46: Any,
) -> None:
    env46.tx(lambda q: q.create_queue("ex", policy="exclusive"))
    env46.tx(lambda q: q.create_queue("other"))
    env46.tx(lambda q: q.send("ex", 1, singleton_key="k"))
    env46.tx(lambda q: q.fetch("ex"))  # the key is active: exclusive takes no other job
    svc = env46.service()
    earlier = svc.send("other", "written first")
    result = svc.upsert("ex", 2, singleton_key="k")
    assert result.rejected and result.jobs == ()
    assert svc.send("other", "written after") is not None  # the transaction is usable
    env46.commit()
    assert sorted(j.data for j in jobs_of(env46, "other")) == ["written after", "written first"]
    assert row(env46, earlier, "state::text AS s").s == "created"
    assert len(jobs_of(env46, "ex")) == 1


def test_key_strict_fifo_upsert_needs_a_key_before_any_sql(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("fifo", policy="key_strict_fifo"))
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match="key_strict_fifo"):
        svc.upsert("fifo", 1, id=uuid.uuid4())
    result = svc.upsert("fifo", 1, singleton_key="a")
    assert result.inserted == 1
    env46.commit()
    assert len(jobs_of(env46, "fifo")) == 1


def test_a_concurrent_upsert_of_the_key_is_waited_for_and_edited_in_the_callers_transaction(
    env46: Any, engine: Engine
) -> None:
    """Another client's upsert inserted the key's job and has not committed: ours waits
    on job_i13, finds the job once the other commits, and edits it; the write our
    transaction made before is committed with it."""
    env46.tx(lambda q: q.create_queue("u"))
    env46.tx(lambda q: q.create_queue("other"))
    other = engine.connect()
    other.exec_driver_sql(
        f'INSERT INTO "{env46.schema}".job (name, data, singleton_key, upsert_by_key, policy) '
        "VALUES ('u', '{\"by\": \"other\"}', 'k', true, 'standard')"
    )
    svc = env46.service()
    earlier = svc.send("other", "written first")
    try:
        upsert = run_blocked(
            engine, other, lambda: svc.upsert("u", {"by": "us"}, singleton_key="k")
        )
        assert upsert.waited, "our upsert never waited on the other client's job_i13 entry"
        assert upsert.error is None, upsert.error
        assert (upsert.result.updated, upsert.result.inserted) == (1, 0)
        env46.commit()
    finally:
        other.close()
    [job] = jobs_of(env46, "u")
    assert job.data == {"by": "us"}
    assert row(env46, earlier, "data").data == "written first"


def test_two_transactions_upserting_two_keys_in_opposite_orders_both_commit(
    schema46: str, engine: Engine
) -> None:
    """A deadlock between two upserting transactions: the victim's upsert is ``rejected``
    (its savepoint undone), its transaction commits what it wrote before, and the other
    upsert then edits the victim's job."""
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService

    with Session(engine) as session, session.begin():
        setup = QueueService(session, schema=schema46)
        setup.create_queue("u")
        setup.create_queue("other")
    a_session, b_session = Session(engine), Session(engine)
    a_session.begin()
    b_session.begin()
    a, b = QueueService(a_session, schema=schema46), QueueService(b_session, schema=schema46)
    a.send("other", "a wrote first")
    b.send("other", "b wrote first")
    assert a.upsert("u", "a1", singleton_key="k1").inserted == 1
    assert b.upsert("u", "b2", singleton_key="k2").inserted == 1
    a_pid = a_session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar_one()
    outcome: dict[str, Any] = {}

    def a_second() -> None:
        try:
            outcome["a"] = a.upsert("u", "a2", singleton_key="k2")
            a_session.commit()
        except BaseException as exc:  # reported below
            outcome["error"] = exc

    thread = threading.Thread(target=a_second)
    thread.start()
    blocked = 0
    try:
        with engine.connect() as probe:
            for _ in range(400):
                blocked = probe.exec_driver_sql(
                    f"SELECT cardinality(pg_blocking_pids({int(a_pid)}))"
                ).scalar_one()
                if blocked or not thread.is_alive():
                    break
                time.sleep(0.025)
        assert blocked, "a's second upsert never waited on b's job_i13 entry"
        outcome["b"] = b.upsert("u", "b1", singleton_key="k1")  # closes the cycle
        b_session.commit()
        thread.join(60)
    finally:
        thread.join(60)
        a_session.close()
        b_session.close()
    assert "error" not in outcome, outcome
    results = {outcome["a"].rejected, outcome["b"].rejected}
    assert results == {True, False}, outcome  # exactly one victim
    winner = outcome["a"] if not outcome["a"].rejected else outcome["b"]
    assert (winner.updated, winner.inserted) == (1, 0)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            f'SELECT name, singleton_key, data FROM "{schema46}".job ORDER BY 1, 2, 3'
        ).all()
    keyed = [(k, d) for n, k, d in rows if n == "u"]
    assert [k for k, _ in keyed] == ["k1", "k2"]  # one job per key
    assert sorted(d for n, _, d in rows if n == "other") == ["a wrote first", "b wrote first"]


def test_upsert_without_data_keeps_the_jobs_data_and_inserts_none(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("u"))
    [job_id] = env46.tx(lambda q: q.upsert("u", {"v": 1}, singleton_key="k")).jobs
    assert env46.tx(lambda q: q.upsert("u", singleton_key="k", priority=2)).updated == 1
    assert tuple(row(env46, job_id, "data, priority")) == ({"v": 1}, 2)
    [new_id] = env46.tx(lambda q: q.upsert("u", singleton_key="other")).jobs
    assert row(env46, new_id, "data").data is None


# ------------------------------------------------------------------ update


def test_update_edits_by_key_newest_oldest_or_all_and_keeps_data_when_omitted(
    env46: Any,
) -> None:
    env46.tx(lambda q: q.create_queue("u"))
    ids = [env46.tx(lambda q, i=i: q.send("u", i, singleton_key="k")) for i in range(3)]
    newest = env46.tx(lambda q: q.update("u", "new", singleton_key="k"))
    assert isinstance(newest, UpdateResult) and newest.jobs == (ids[2],)
    oldest = env46.tx(lambda q: q.update("u", "old", singleton_key="k", match="oldest"))
    assert oldest.jobs == (ids[0],)
    every = env46.tx(lambda q: q.update("u", singleton_key="k", match="all", priority=9))
    assert sorted(every.jobs) == sorted(ids) and every.updated == 3
    assert [tuple(row(env46, i, "data, priority")) for i in ids] == [
        ("old", 9),
        (1, 9),
        ("new", 9),
    ]


def test_update_never_touches_a_started_job_and_says_so(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("u"))
    job_id = env46.tx(lambda q: q.send("u", 1, singleton_key="k"))
    env46.tx(lambda q: q.fetch("u"))
    assert env46.tx(lambda q: q.update("u", 2, id=job_id)) == UpdateResult((), 0)
    assert env46.tx(lambda q: q.update("u", 2, singleton_key="k")).updated == 0
    assert row(env46, job_id, "data").data == 1


# ------------------------------------------------------------------ refusals


BAD_CALLS = [
    ("neither id nor key", lambda q: q.upsert("u", 1), "id"),
    ("both id and key", lambda q: q.upsert("u", 1, id=uuid.uuid4(), singleton_key="k"), "id"),
    ("match with an id", lambda q: q.update("u", 1, id=uuid.uuid4(), match="all"), "match"),
    ("unknown match", lambda q: q.update("u", 1, singleton_key="k", match="last"), "match"),
    ("unknown option", lambda q: q.upsert("u", 1, singleton_key="k", singleton_seconds=5), ""),
    ("bad priority", lambda q: q.upsert("u", 1, singleton_key="k", priority="high"), "priority"),
    ("data JSON cannot hold", lambda q: q.upsert("u", {1, 2}, singleton_key="k"), "data"),
    ("bad id", lambda q: q.update("u", 1, id="not-a-uuid"), "id"),
    ("missing dead letter", lambda q: q.upsert("u", 1, singleton_key="k", dead_letter="x"), ""),
]


@pytest.mark.parametrize(("what", "call", "option"), BAD_CALLS, ids=[b[0] for b in BAD_CALLS])
def test_bad_input_is_refused_naming_the_problem_and_the_transaction_stays_usable(
    env46: Any, what: str, call: Any, option: str
) -> None:
    env46.tx(lambda q: q.create_queue("u"))
    svc = env46.service()
    svc.send("u", "before", singleton_key="b")
    with pytest.raises(InvalidOptionsError) as refused:
        call(svc)
    if option:
        assert refused.value.option == option
    assert svc.upsert("u", "after", singleton_key="a").inserted == 1
    env46.commit()
    assert sorted(j.data for j in jobs_of(env46, "u")) == ["after", "before"]


def test_a_missing_queue_is_queue_not_found(env46: Any) -> None:
    svc = env46.service()
    with pytest.raises(QueueNotFoundError):
        svc.upsert("nope", 1, singleton_key="k")
    with pytest.raises(QueueNotFoundError):
        svc.update("nope", 1, singleton_key="k")


def test_update_and_upsert_are_refused_at_schema_26_before_any_sql(env: Any) -> None:
    env.tx(lambda q: q.create_queue("u"))
    svc = env.service()
    call: Callable[[], object]
    for call in (
        lambda: svc.upsert("u", 1, singleton_key="k"),
        lambda: svc.update("u", 1, singleton_key="k"),
    ):
        with pytest.raises(SchemaFeatureError, match="version 46") as refused:
            call()
        assert (refused.value.found, refused.value.needed) == (26, 46)
    assert svc.send("u", 1) is not None  # the transaction is intact
    env.commit()


# ------------------------------------------------------------------ four processes

KEYS = [f"key-{i}" for i in range(5)]
ROUNDS = 40


def _upserter(url: str, schema: str, proc: int, out: Any) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService

    engine = create_engine(url)
    results: list[tuple[str, str, int, int, list[str]]] = []
    try:
        for i in range(ROUNDS):
            for key in KEYS:
                value = f"p{proc}-{i}"
                with Session(engine) as session, session.begin():
                    r = QueueService(session, schema=schema).upsert(
                        "burst", {"v": value}, singleton_key=key
                    )
                results.append((key, value, r.updated, r.inserted, [str(j) for j in r.jobs]))
        out.put(("ok", proc, results))
    except BaseException as exc:  # reported to the parent
        out.put(("error", proc, repr(exc)))
    finally:
        engine.dispose()


@pytest.mark.subprocess
def test_four_processes_upserting_the_same_keys_while_a_worker_claims(
    schema46: str, engine: Engine, database_url: str
) -> None:
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService

    def tx(fn: Any) -> Any:
        with Session(engine) as session, session.begin():
            return fn(QueueService(session, schema=schema46))

    tx(lambda q: q.create_queue("burst"))
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_upserter, args=(database_url, schema46, p, out)) for p in range(4)]
    for p in procs:
        p.start()
    reports: list[Any] = []
    duplicates: list[Any] = []
    claimed = 0
    deadline = time.monotonic() + 180
    while len(reports) < 4 and time.monotonic() < deadline:
        # The worker: claim and complete what is there, and sample the created jobs per key.
        jobs = tx(lambda q: q.fetch("burst", 3))
        if jobs:
            tx(lambda q, js=jobs: q.complete("burst", js))
            claimed += len(jobs)
        with engine.connect() as conn:
            duplicates += conn.exec_driver_sql(
                f'SELECT singleton_key, count(*) FROM "{schema46}".job '
                "WHERE name = 'burst' AND state = 'created' GROUP BY 1 HAVING count(*) > 1"
            ).all()
        while not out.empty():
            reports.append(out.get())
        time.sleep(0.01)
    for p in procs:
        p.join(60)
    while not out.empty():
        reports.append(out.get())
    assert len(reports) == 4, reports
    errors = [r for r in reports if r[0] != "ok"]
    assert errors == []
    assert duplicates == []
    results = [r for report in reports for r in report[2]]
    assert len(results) == 4 * ROUNDS * len(KEYS)
    # Every upsert either edited a job or inserted one: none rejected, none lost.
    odd = [r for r in results if (r[2], r[3]) not in ((1, 0), (0, 1))]
    assert odd == [], f"{len(odd)} of {len(results)}: {odd[:5]}"
    inserted = {jobs[0] for _, _, _, ins, jobs in results if ins}
    with engine.connect() as conn:
        stored = conn.exec_driver_sql(
            f"SELECT id::text, state::text, singleton_key, data->>'v' FROM \"{schema46}\".job "
            "WHERE name = 'burst'"
        ).all()
    assert {r[0] for r in stored} == inserted  # every inserted job is there, and no other
    assert claimed > 0
    written = {(key, value) for key, value, *_ in results}
    for job_id, _state, key, value in stored:
        assert (key, value) in written, (job_id, key, value)
    created = [r for r in stored if r[1] == "created"]
    assert len({r[2] for r in created}) == len(created)  # one created job per key at the end
