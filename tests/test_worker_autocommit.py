"""The workers claim and settle in autocommit: one statement, one round trip each.

Outside a transactional handler, a claim of a queue whose policy takes no key locks
and every batch of completions or failures runs on a pooled connection in
autocommit. What needs a transaction keeps one: a singleton or stately claim (its
advisory key locks last until COMMIT), the first claim of a queue whose policy is
not known yet, and a transactional handler with its completion.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event
from support.worker import Harness, send, wait_for

from alkstore_sa.ops import Context, driver, fetch
from alkstore_sa.ops.working import NeedsTransaction, claims_in_autocommit
from alkstore_sa.records import Job

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@contextmanager
def statements_and_modes(engine: Engine) -> Iterator[list[tuple[str, bool]]]:
    """``(statement, ran in autocommit)`` for every statement ``engine`` sends."""
    seen: list[tuple[str, bool]] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append((statement, bool(conn.connection.driver_connection.autocommit)))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def sync_engine_of(h: Harness) -> Engine:
    return h.async_engine.sync_engine if h.async_engine is not None else h.engine


def is_claim(sql: str) -> bool:
    """A claim locks rows ``SKIP LOCKED`` and deletes nothing; the worker's rescue sweep
    (a fail of the jobs of a worker that stopped answering, in a transaction under its
    advisory lock) locks them too, and deletes them to insert them again."""
    return "SKIP LOCKED" in sql and "DELETE" not in sql.upper()


def claims(seen: list[tuple[str, bool]]) -> list[bool]:
    return [auto for sql, auto in seen if is_claim(sql)]


def test_claims_and_completions_run_in_autocommit(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    h.service_tx(lambda q: q.send_many("q", [{"data": i} for i in range(30)]))
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(), concurrency=3, batch_size=3)
    with statements_and_modes(sync_engine_of(h)) as seen:
        h.start(w)
        wait_for(lambda: w.stats()["q"].completed == 30)
        h.stop(w)
    modes = claims(seen)
    assert len(modes) >= 10
    # The first claim may read the policy in a transaction; then the cache knows it.
    assert all(modes[1:]), modes
    # A claim alone in autocommit does not wait for the WAL flush; in a transaction
    # it would change the transaction's commit, so it never does there.
    relaxed = [("synchronous_commit" in sql, auto) for sql, auto in seen if is_claim(sql)]
    assert all(flag == auto for flag, auto in relaxed), relaxed
    completes = [auto for sql, auto in seen if "'completed'" in sql and "UPDATE" in sql]
    assert completes and all(completes)


def test_a_failing_handler_is_failed_in_autocommit(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    job_id = send(h, "q")

    def boom(job: Job) -> None:
        raise ValueError("boom")

    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(boom))
    with statements_and_modes(sync_engine_of(h)) as seen:
        h.start(w)
        wait_for(lambda: h.job("q", job_id).state.value == "failed")
        h.stop(w)
    fails = [auto for sql, auto in seen if sql.lstrip().startswith("WITH deleted AS")]
    assert fails and all(fails)


@pytest.mark.parametrize("policy", ["singleton", "stately"])
def test_a_claim_that_locks_keys_keeps_its_transaction(harness: Harness, policy: str) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", policy=policy))
    ids = [send(h, "q", singleton_key=f"k{i}") for i in range(4)]
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(), concurrency=2, batch_size=2)
    with statements_and_modes(sync_engine_of(h)) as seen:
        h.start(w)
        wait_for(lambda: w.stats()["q"].completed == len(ids))
        h.stop(w)
    modes = claims(seen)
    locks = [auto for sql, auto in seen if "advisory_xact_lock" in sql]
    assert modes and not any(modes)
    assert locks and not any(locks)


def test_a_transactional_handler_completes_in_its_own_transaction(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = send(h, "q")
    w = h.worker(poll_interval=0.1)

    async def async_handler(job: Job, session: Any) -> str:
        return "done"

    def sync_handler(job: Job, session: Any) -> str:
        return "done"

    w.register("q", async_handler if h.is_async else sync_handler, transactional=True)
    with statements_and_modes(sync_engine_of(h)) as seen:
        h.start(w)
        wait_for(lambda: h.job("q", job_id).state.value == "completed")
        h.stop(w)
    completes = [auto for sql, auto in seen if "'completed'" in sql and "UPDATE" in sql]
    assert completes == [False]
    assert h.job("q", job_id).output == {"value": "done"}


def test_an_autocommit_claim_of_a_key_locking_queue_asks_for_a_transaction(
    engine: Engine, schema: str
) -> None:
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService
    from alkstore_sa._engine_cache import execution_options

    with Session(engine) as session, session.begin():
        svc = QueueService(session, schema=schema)
        svc.create_queue("plain")
        svc.create_queue("single", policy="singleton")
        svc.send("single", None, singleton_key="k")
    ctx = Context(schema)
    options = execution_options(schema)
    assert not claims_in_autocommit(ctx, "plain")  # policy not known yet
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    with auto.connect() as conn:
        assert (
            driver.run(
                conn, fetch(ctx, "plain", 5, priority=True, ignore_start_after=False), options
            )
            == []
        )
        assert claims_in_autocommit(ctx, "plain")
        with pytest.raises(NeedsTransaction):
            driver.run(
                conn,
                fetch(ctx, "single", 5, priority=True, ignore_start_after=False, autocommit=True),
                options,
                autocommit=True,
            )
    assert not claims_in_autocommit(ctx, "single")
    with engine.connect() as conn:
        state = conn.exec_driver_sql(f'SELECT state::text FROM "{schema}".job').scalar_one()
    assert state == "created"  # nothing was claimed


def test_an_autocommit_key_strict_fifo_conflict_is_an_empty_fetch(
    engine: Engine, schema46: str
) -> None:
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService
    from alkstore_sa._engine_cache import execution_options

    # Separate transactions: a1 is created first, so it is the key's head.
    with Session(engine) as session, session.begin():
        svc = QueueService(session, schema=schema46)
        svc.create_queue("fifo", policy="key_strict_fifo")
        svc.send("fifo", "a1", singleton_key="a")
    with Session(engine) as session, session.begin():
        a2 = QueueService(session, schema=schema46).send("fifo", "a2", singleton_key="a")
    ctx = Context(schema46, version=46)
    options = execution_options(schema46)
    auto = engine.execution_options(isolation_level="AUTOCOMMIT")
    # Another client (no key locks, as Node) activates the key's second job and
    # commits while our claim waits on that job_i8 entry.
    other = engine.connect()
    other.exec_driver_sql(
        f"UPDATE \"{schema46}\".job SET state = 'active', started_on = now() WHERE id = '{a2}'"
    )
    timer = threading.Timer(0.5, other.commit)
    with auto.connect() as conn:
        timer.start()
        try:
            started = time.monotonic()
            got = driver.run(
                conn,
                fetch(ctx, "fifo", 10, priority=True, ignore_start_after=False, autocommit=True),
                options,
                autocommit=True,
            )
            assert got == []
            assert time.monotonic() - started >= 0.3
        finally:
            timer.join()
            other.close()
        # The connection is still usable.
        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1


@pytest.mark.parametrize("version", [26, 46])
def test_only_the_relaxed_claim_turns_synchronous_commit_off(
    engine: Engine, schema: str, schema46: str, version: int
) -> None:
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from alkstore_sa import QueueService
    from alkstore_sa._engine_cache import execution_options

    name = schema46 if version == 46 else schema
    with Session(engine) as session, session.begin():
        svc = QueueService(session, schema=name)
        svc.create_queue("q")
        svc.send_many("q", [{"data": i} for i in range(4)])
    ctx = Context(name, version=version)
    options = execution_options(name)

    def setting_after(**kw: Any) -> str:
        with engine.connect() as conn:  # one transaction, rolled back
            got = driver.run(
                conn, fetch(ctx, "q", 1, priority=True, ignore_start_after=False, **kw), options
            )
            assert len(got) == 1
            value = str(conn.execute(text("SHOW synchronous_commit")).scalar_one())
            conn.rollback()
            return value

    assert setting_after() == "on"
    assert setting_after(autocommit=True) == "off"
    # The services' fetch joins the caller's transaction and leaves it as it was.
    with Session(engine) as session, session.begin():
        assert len(QueueService(session, schema=name).fetch("q", 1)) == 1
        assert session.execute(text("SHOW synchronous_commit")).scalar_one() == "on"
        session.rollback()
