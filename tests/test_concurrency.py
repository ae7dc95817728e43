"""Concurrent clients: no job is handed out twice, none is lost, policies hold.

Each client runs in its own thread with its own connections; in the async
flavour each thread drives an AsyncQueueService on its own event loop.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from alkstore_sa import AsyncQueueService, QueueService
from alkstore_sa.ops import Settlement

T = TypeVar("T")


class Client:
    """One concurrent client with its own connections, sync or async like ``env``."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.loop: asyncio.AbstractEventLoop | None = None
        if env.async_engine is not None:
            self.loop = asyncio.new_event_loop()
            self.async_engine = create_async_engine(env.async_engine.url, pool_size=1)

    def tx(self, fn: Callable[..., Any], hold: Callable[[], object] | None = None) -> Any:
        """Run ``fn(service)`` in a transaction; call ``hold()`` before committing."""
        if self.loop is None:
            with Session(self.env.engine) as session, session.begin():
                result = fn(QueueService(session, schema=self.env.schema))
                if hold is not None:
                    hold()
                return result
        return self.loop.run_until_complete(self._atx(fn, hold))

    async def _atx(self, fn: Callable[..., Any], hold: Callable[[], object] | None) -> Any:
        async with AsyncSession(self.async_engine) as session, session.begin():
            result = fn(AsyncQueueService(session, schema=self.env.schema))
            if inspect.isawaitable(result):
                result = await result
            if hold is not None:
                hold()  # blocks this thread's own loop only
            return result

    def close(self) -> None:
        if self.loop is not None:
            self.loop.run_until_complete(self.async_engine.dispose())
            self.loop.close()


def in_parallel(env: Any, count: int, body: Callable[[int, Client], T]) -> list[T]:
    """Run ``body(index, client)`` in ``count`` threads, each with its own client."""

    def run(index: int) -> T:
        client = Client(env)
        try:
            return body(index, client)
        finally:
            client.close()

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count)))


@contextmanager
def watching(env: Any, query: str, **params: Any) -> Iterator[list[int]]:
    """Sample ``query`` (one integer) in the background while the block runs."""
    seen: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        sql = text(query.replace("{s}", f'"{env.schema}"'))
        with env.engine.connect() as conn:
            while not stop.is_set():
                seen.append(int(conn.execute(sql, params).scalar() or 0))
                conn.rollback()
                time.sleep(0.002)

    watcher = threading.Thread(target=sample)
    watcher.start()
    try:
        yield seen
    finally:
        stop.set()
        watcher.join()


# ------------------------------------------------------------------ claiming


def test_concurrent_fetches_never_hand_out_the_same_job(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    env.tx(lambda q: q.send_many("q", [{"data": n} for n in range(30)]))
    together = threading.Barrier(6, timeout=20)

    def body(_: int, client: Client) -> list[Any]:
        # Every client keeps its claim open until all have fetched.
        return client.tx(lambda q: q.fetch("q", 7), hold=together.wait)  # type: ignore[no-any-return]

    batches = in_parallel(env, 6, body)
    ids = [job.id for batch in batches for job in batch]
    assert len(ids) == len(set(ids)) == 30


@pytest.mark.slow
def test_eight_workers_drain_five_thousand_jobs_exactly_once(env: Any) -> None:
    total = 5000
    env.tx(lambda q: q.create_queue("drain"))
    env.tx(lambda q: q.send_many("drain", [{"data": n} for n in range(total)]))

    def worker(_: int, client: Client) -> list[Any]:
        done: list[Any] = []
        while jobs := client.tx(lambda q: q.fetch("drain", 50)):
            items = [Settlement(j.id, {"n": j.data}, j.started_on) for j in jobs]
            settled = client.tx(lambda q, i=items: q.complete_many("drain", i))
            assert sorted(settled.affected) == sorted(j.id for j in jobs)
            done.extend(j.id for j in jobs)
        return done

    results = in_parallel(env, 8, worker)
    completed = [i for r in results for i in r]
    assert len(completed) == len(set(completed)) == total
    counts = dict(env.sql("SELECT state, count(*) FROM {s}.job GROUP BY state"))
    assert counts == {"completed": total}
    [(bad,)] = env.sql("SELECT count(*) FROM {s}.job WHERE (output->>'n')::int <> (data)::int")
    assert bad == 0
    assert sum(1 for r in results if r) > 1, "the work was not shared"
    # How fast is bench/'s question; this test's is whether every job ran exactly once.


# ------------------------------------------------------------------ policies under load


def test_concurrent_sends_of_one_key_to_a_short_queue_create_one_job(env: Any) -> None:
    env.tx(lambda q: q.create_queue("short", policy="short"))
    start = threading.Barrier(8, timeout=20)

    def body(index: int, client: Client) -> Any:
        start.wait()
        return client.tx(lambda q: q.send("short", index, singleton_key="k"))

    ids = in_parallel(env, 8, body)
    assert sum(i is not None for i in ids) == 1
    assert env.sql("SELECT count(*) FROM {s}.job") == [(1,)]


@pytest.mark.parametrize("policy", ["singleton", "stately"])
def test_concurrent_fetchers_never_run_two_jobs_of_a_key_at_once(env: Any, policy: str) -> None:
    env.tx(lambda q: q.create_queue("p", policy=policy, retry_limit=1))
    if policy == "singleton":
        env.tx(
            lambda q: q.send_many(
                "p", [{"data": n, "singleton_key": f"k{n % 2}"} for n in range(20)]
            )
        )
    else:
        # stately holds one created and one retry job per key: queue both for each key.
        first = [{"data": n, "singleton_key": f"k{n}"} for n in range(10)]
        ids = env.tx(lambda q: q.send_many("p", first))
        env.tx(lambda q: q.fetch("p", 10))
        env.tx(lambda q: q.fail("p", ids))
        second = [{"data": 10 + n, "singleton_key": f"k{n}"} for n in range(10)]
        env.tx(lambda q: q.send_many("p", second))
    busiest = (
        "SELECT coalesce(max(c), 0) FROM (SELECT count(*) c FROM {s}.job"
        " WHERE name = 'p' AND state = 'active' GROUP BY singleton_key) t"
    )

    def worker(index: int, client: Client) -> list[Any]:
        done: list[Any] = []
        idle = 0
        while idle < 20:
            jobs = client.tx(lambda q: q.fetch("p", 5))
            keys = [j.singleton_key for j in jobs]
            assert len(keys) == len(set(keys)), "two jobs of one key in one batch"
            if not jobs:
                idle += 1
                time.sleep(0.005)
                continue
            idle = 0
            for job in jobs:
                if policy == "singleton" and index % 2 and job.retry_count == 0:
                    client.tx(lambda q, j=job: q.fail("p", j.id))  # comes back as retry
                else:
                    client.tx(lambda q, j=job: q.complete("p", j.id))
                    done.append(job.data)
        return done

    with watching(env, busiest) as samples:
        results = in_parallel(env, 6, worker)
    assert sorted(n for r in results for n in r) == list(range(20))
    assert max(samples) <= 1
    assert env.sql("SELECT DISTINCT state FROM {s}.job") == [("completed",)]


@pytest.mark.parametrize("policy", ["singleton", "stately"])
def test_concurrent_batch_fetches_over_many_keys_do_not_deadlock(env: Any, policy: str) -> None:
    # Batches that activate the same keys in different orders used to wait on
    # each other's unique index entries until PostgreSQL broke the deadlock.
    env.tx(lambda q: q.create_queue("many", policy=policy))
    rounds = 1 if policy == "stately" else 3
    for _ in range(rounds):
        env.tx(lambda q: q.send_many("many", [{"singleton_key": f"k{n}"} for n in range(60)]))
    start = threading.Barrier(8, timeout=20)

    def worker(_: int, client: Client) -> int:
        start.wait()
        done = idle = 0
        while idle < 10:
            jobs = client.tx(lambda q: q.fetch("many", 25))
            if not jobs:
                idle += 1
                time.sleep(0.002)
                continue
            idle = 0
            client.tx(lambda q, j=jobs: q.complete("many", [x.id for x in j]))
            done += len(jobs)
        return done

    assert sum(in_parallel(env, 8, worker)) == 60 * rounds
    # PostgreSQL breaks a deadlock by failing one of its transactions: a fetch or a
    # completion above would have raised DeadlockDetected (neither retries one), which
    # in_parallel passes on, and left its jobs unfinished.
    assert env.sql("SELECT DISTINCT state FROM {s}.job WHERE name = 'many'") == [("completed",)]


def test_exclusive_queue_never_holds_two_live_jobs_of_a_key(env: Any) -> None:
    env.tx(lambda q: q.create_queue("x", policy="exclusive"))
    live = "SELECT count(*) FROM {s}.job WHERE name = 'x' AND state <= 'active'"

    def body(index: int, client: Client) -> Counter[str]:
        outcome: Counter[str] = Counter()
        for n in range(15):
            sent = client.tx(lambda q, n=n: q.send("x", [index, n], singleton_key="k"))
            outcome["sent" if sent else "refused"] += 1
            for job in client.tx(lambda q: q.fetch("x")):
                client.tx(lambda q, j=job: q.complete("x", j.id))
                outcome["completed"] += 1
        return outcome

    with watching(env, live) as samples:
        outcomes = in_parallel(env, 6, body)
    total: Counter[str] = sum(outcomes, Counter())
    assert max(samples) <= 1
    assert total["sent"] >= 1
    [(stored,)] = env.sql("SELECT count(*) FROM {s}.job WHERE name = 'x'")
    assert stored == total["sent"]
    [(completed,)] = env.sql("SELECT count(*) FROM {s}.job WHERE state = 'completed'")
    assert completed == total["completed"] >= total["sent"] - 1
