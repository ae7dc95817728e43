"""The key_strict_fifo policy at schema 46 (pg-boss 12.38, docs/how-to/key-strict-fifo.md).

What tests/test_runtime46_jobs.py does not already hold: a key blocked by a failed job
starves no other key, ``get_blocked_keys`` (and ``alkstore queue blocked-keys``), the
caller's earlier writes surviving a claim that collides on the policy's unique index,
refusals at schema 26, and four worker processes over 20 keys x 50 jobs.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine
from support.blocking import run_blocked

from alkstore_sa import InvalidOptionsError, QueueNotFoundError, SchemaFeatureError
from alkstore_sa.cli import main


def fifo(env: Any, name: str = "fifo", **options: Any) -> str:
    env.tx(lambda q: q.create_queue(name, policy="key_strict_fifo", **options))
    return name


def fail_for_good(env: Any, queue: str, job: Any) -> None:
    """Fail ``job`` with no retries left, so it ends ``failed`` and blocks its key."""
    env.sql("UPDATE {s}.job SET retry_limit = 0 WHERE id = :id", id=job.id)
    assert env.tx(lambda q: q.fail(queue, job)).failed == [job.id]


# ------------------------------------------------------------------ refusals


def test_a_job_without_a_key_is_refused_by_send_send_many_and_upsert(env46: Any) -> None:
    queue = fifo(env46)
    svc = env46.service()
    svc.send(queue, "kept", singleton_key="a")
    call: Callable[[], object]
    for call in (
        lambda: svc.send(queue, 1),
        lambda: svc.send(queue, 1, singleton_key=None),
        lambda: svc.send_many(queue, [{"data": 1, "singleton_key": "a"}, {"data": 2}]),
        lambda: svc.send_after(queue, 1, 60),
    ):
        with pytest.raises(InvalidOptionsError, match="every job needs a key") as refused:
            call()
        assert refused.value.option == "singleton_key"
    env46.commit()
    assert env46.sql("SELECT data FROM {s}.job WHERE name = :q", q=queue) == [("kept",)]


def test_blocked_keys_are_refused_on_other_policies_and_missing_queues(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("plain"))
    with pytest.raises(InvalidOptionsError, match="only on key_strict_fifo queues"):
        env46.tx(lambda q: q.get_blocked_keys("plain"))
    with pytest.raises(QueueNotFoundError):
        env46.tx(lambda q: q.get_blocked_keys("nope"))


def test_blocked_keys_are_refused_at_26_before_any_sql(env: Any) -> None:
    env.tx(lambda q: q.create_queue("plain"))
    svc = env.service()
    with pytest.raises(SchemaFeatureError, match=r"get_blocked_keys needs .* version 46"):
        svc.get_blocked_keys("plain")
    assert svc.send("plain", 1) is not None  # the transaction is intact
    env.commit()


@pytest.mark.parametrize(
    ("options", "option"),
    [({"limit": 0}, "limit"), ({"limit": 100_001}, "limit"), ({"after": ""}, "after")],
)
def test_bad_limits_and_cursors_are_refused(env46: Any, options: Any, option: str) -> None:
    queue = fifo(env46)
    with pytest.raises(InvalidOptionsError) as refused:
        env46.tx(lambda q: q.get_blocked_keys(queue, **options))
    assert refused.value.option == option


# ------------------------------------------------------------------ blocking


def test_a_failed_job_blocks_its_key_until_it_is_retried_or_deleted(env46: Any) -> None:
    queue = fifo(env46)
    for key in ("a", "b", "c"):
        for n in range(2):
            env46.tx(lambda q, k=key, n=n: q.send(queue, f"{k}{n}", singleton_key=k))
    heads = {j.data: j for j in env46.tx(lambda q: q.fetch(queue, 10))}
    assert set(heads) == {"a0", "b0", "c0"}
    fail_for_good(env46, queue, heads["a0"])
    fail_for_good(env46, queue, heads["c0"])
    env46.tx(lambda q: q.complete(queue, heads["b0"]))
    assert env46.tx(lambda q: q.get_blocked_keys(queue)) == ["a", "c"]
    assert [j.data for j in env46.tx(lambda q: q.fetch(queue, 10))] == ["b1"]
    # Retried: the failed job is its key's head again; deleted: the key moves on.
    env46.tx(lambda q: q.retry(queue, heads["a0"].id))
    env46.tx(lambda q: q.delete_job(queue, heads["c0"].id))
    assert env46.tx(lambda q: q.get_blocked_keys(queue)) == []
    assert sorted(j.data for j in env46.tx(lambda q: q.fetch(queue, 10))) == ["a0", "c1"]


def test_a_retrying_job_holds_its_key_but_is_not_a_blocked_key(env46: Any) -> None:
    queue = fifo(env46, retry_limit=3, retry_delay=3600)
    env46.tx(lambda q: q.send(queue, "a0", singleton_key="a"))
    env46.tx(lambda q: q.send(queue, "a1", singleton_key="a"))
    [job] = env46.tx(lambda q: q.fetch(queue))
    env46.tx(lambda q: q.fail(queue, job))  # retry, an hour from now
    assert env46.tx(lambda q: q.fetch(queue, 10)) == []  # a1 waits behind it
    assert env46.tx(lambda q: q.get_blocked_keys(queue)) == []  # pg-boss: failed only


def test_a_blocked_key_with_a_long_backlog_starves_no_other_key(env46: Any) -> None:
    """The blocked key's jobs come first by priority and age, yet every claim, even one
    job at a time, takes the other keys' heads (pg-boss 12.38's head-only claim)."""
    queue = fifo(env46)
    env46.tx(lambda q: q.send(queue, "blocker", singleton_key="stuck", priority=10))
    [blocker] = env46.tx(lambda q: q.fetch(queue))
    fail_for_good(env46, queue, blocker)
    env46.tx(
        lambda q: q.send_many(
            queue, [{"data": n, "singleton_key": "stuck", "priority": 10} for n in range(500)]
        )
    )
    env46.tx(lambda q: q.send_many(queue, [{"data": k, "singleton_key": k} for k in "xyz"]))
    taken = []
    for _ in range(3):
        [job] = env46.tx(lambda q: q.fetch(queue, 1))
        taken.append(job.data)
    assert sorted(taken) == ["x", "y", "z"]
    assert env46.tx(lambda q: q.fetch(queue, 1)) == []


def test_blocked_keys_page_in_key_order(env46: Any) -> None:
    queue = fifo(env46, retry_limit=0)
    keys = [f"k{i:02}" for i in range(7)]
    env46.tx(lambda q: q.send_many(queue, [{"singleton_key": k} for k in keys]))
    for job in env46.tx(lambda q: q.fetch(queue, 10)):
        env46.tx(lambda q, j=job: q.fail(queue, j))
    pages, after = [], None
    while True:
        page = env46.tx(lambda q, a=after: q.get_blocked_keys(queue, limit=3, after=a))
        if not page:
            break
        pages.append(page)
        after = page[-1]
    assert pages == [keys[0:3], keys[3:6], keys[6:]]


def test_the_cli_lists_blocked_keys(
    env46: Any, database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = fifo(env46, retry_limit=0)
    env46.tx(lambda q: q.send_many(queue, [{"singleton_key": k} for k in ("b", "a")]))
    for job in env46.tx(lambda q: q.fetch(queue, 10)):
        env46.tx(lambda q, j=job: q.fail(queue, j))
    common = ["--database-url", database_url, "--schema", env46.schema]
    capsys.readouterr()
    assert main(["queue", "blocked-keys", queue, "--json", *common]) == 0
    assert json.loads(capsys.readouterr().out) == ["a", "b"]
    assert main(["queue", "blocked-keys", queue, "--after", "a", *common]) == 0
    assert capsys.readouterr().out.split() == ["b"]
    env46.tx(lambda q: q.create_queue("plain"))
    assert main(["queue", "blocked-keys", "plain", *common]) != 0
    err = capsys.readouterr().err
    assert "only on key_strict_fifo queues" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------ the caller's transaction


def test_a_claim_colliding_on_the_policy_index_keeps_the_callers_earlier_writes(
    env46: Any, engine: Engine
) -> None:
    """Our claim waits on another client's activation of the same key (job_i8), loses,
    and answers with no jobs: the write our transaction made before is committed."""
    queue = fifo(env46)
    env46.tx(lambda q: q.create_queue("audit"))
    env46.tx(lambda q: q.send(queue, "a0", singleton_key="a"))
    a1 = env46.tx(lambda q: q.send(queue, "a1", singleton_key="a"))
    other = engine.connect()
    other.exec_driver_sql(
        f"UPDATE \"{env46.schema}\".job SET state = 'active', started_on = now() WHERE id = '{a1}'"
    )
    svc = env46.service()
    earlier = svc.send("audit", "written before the claim")
    try:
        claim = run_blocked(engine, other, lambda: svc.fetch(queue, 10))
        assert claim.waited, "our claim never waited on the other client's job_i8 entry"
        assert claim.error is None and claim.result == []
        env46.commit()
    finally:
        other.close()
    assert env46.sql("SELECT data FROM {s}.job WHERE id = :id", id=earlier) == [
        ("written before the claim",)
    ]


# ------------------------------------------------------------------ four processes

KEYS = 20
PER_KEY = 50


def _worker(url: str, schema: str, out: Any) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService

    engine = create_engine(url)
    done = 0
    try:
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 5:
            with Session(engine) as session, session.begin():
                q = QueueService(session, schema=schema)
                jobs = q.fetch("ordered", 5)
                for job in jobs:
                    if job.data["n"] % 7 == 3 and job.retry_count == 0:
                        q.fail("ordered", job)  # back to retry: still its key's head
                        continue
                    session.execute(
                        text(f'INSERT INTO "{schema}".fifo_log (key, n) VALUES (:k, :n)'),
                        {"k": job.singleton_key, "n": job.data["n"]},
                    )
                    q.complete("ordered", job)
                    done += 1
            if jobs:
                idle_since = time.monotonic()
            else:
                time.sleep(0.02)
        out.put(("ok", done))
    except BaseException as exc:  # reported to the parent
        out.put(("error", repr(exc)))
    finally:
        engine.dispose()


@pytest.mark.subprocess
def test_four_worker_processes_run_each_key_in_send_order_one_at_a_time(
    schema46: str, engine: Engine, database_url: str
) -> None:
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService

    with engine.begin() as conn:
        conn.exec_driver_sql(
            f'CREATE TABLE "{schema46}".fifo_log (key text, n int, seq bigserial PRIMARY KEY)'
        )
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue(
            "ordered", policy="key_strict_fifo", retry_limit=2, retry_delay=0
        )
    # Interleaved keys, each key's jobs sent in order n = 0..49, one transaction per n
    # (jobs of one transaction share created_on: see docs/how-to/key-strict-fifo.md).
    for n in range(PER_KEY):
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema46).send_many(
                "ordered", [{"data": {"n": n}, "singleton_key": f"k{k}"} for k in range(KEYS)]
            )
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(database_url, schema46, out)) for _ in range(4)]
    for p in procs:
        p.start()
    doubles: list[Any] = []
    samples = 0
    deadline = time.monotonic() + 300
    with engine.connect() as conn:
        while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
            doubles += conn.exec_driver_sql(
                f'SELECT singleton_key, count(*) FROM "{schema46}".job '
                "WHERE name = 'ordered' AND state = 'active' GROUP BY 1 HAVING count(*) > 1"
            ).all()
            conn.commit()
            samples += 1
            time.sleep(0.02)
    for p in procs:
        p.join(30)
    reports = [out.get(timeout=10) for _ in procs]
    assert [r[0] for r in reports] == ["ok"] * 4, reports
    assert sum(r[1] for r in reports) == KEYS * PER_KEY
    assert doubles == [] and samples > 0
    with engine.connect() as conn:
        states = conn.exec_driver_sql(
            f'SELECT state::text, count(*) FROM "{schema46}".job '
            "WHERE name = 'ordered' GROUP BY 1"
        ).all()
        log = conn.exec_driver_sql(f'SELECT key, n FROM "{schema46}".fifo_log ORDER BY seq').all()
    assert states == [("completed", KEYS * PER_KEY)]
    by_key: dict[str, list[int]] = {}
    for key, n in log:
        by_key.setdefault(key, []).append(n)
    assert by_key == {f"k{k}": list(range(PER_KEY)) for k in range(KEYS)}
