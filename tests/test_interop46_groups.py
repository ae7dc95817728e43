"""Interop at schema 46, group concurrency: our sends, fetches and workers with Node pg-boss
12.38.0's ``group`` send option, ``fetch({groupConcurrency})`` and ``work({groupConcurrency})``.

- A group sent by either side is stored and read alike (``group: {id, tier}`` in Node,
  ``group_id``/``group_tier`` here).
- Each side's limited fetch counts the jobs the other side holds active, tiers included.
- A Node worker and a Python worker with the same limit on one queue: whatever one side
  holds counts for the other, and together they work every job of every group.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine
from support.interop46 import Shared46, on46, schema46_by, shared46_by, sql, states, wait_until
from support.node import in_tx, node46, node46_modules, node_url

from alkstore_sa import GroupConcurrencyConfig, Job, JobSpec
from alkstore_sa.worker import Worker

__all__ = ["node46", "node46_modules", "node_url", "on46", "schema46_by", "shared46_by"]

pytestmark = pytest.mark.interop


def active_per_group(engine: Engine, schema: str, queue: str) -> dict[str, int]:
    rows = sql(
        engine,
        schema,
        "SELECT group_id, count(*) FROM {s}.job WHERE name = :q AND state = 'active' "
        "AND group_id IS NOT NULL GROUP BY group_id",
        q=queue,
    )
    return {g: int(n) for g, n in rows}


def test_a_group_sent_by_either_side_is_read_alike(engine: Engine, on46: Shared46) -> None:
    schema, boss, q = on46.schema, on46.boss, on46.queue()
    boss.call("createQueue", q)
    from_node = boss.call("send", q, {"by": "node"}, {"group": {"id": "acme", "tier": "gold"}})
    from_python = in_tx(
        engine, schema, lambda s: s.send(q, {"by": "python"}, group_id="acme", group_tier="gold")
    )
    rows = sql(
        engine, schema, "SELECT id::text, group_id, group_tier FROM {s}.job WHERE name = :q", q=q
    )
    assert {r[0]: (r[1], r[2]) for r in rows} == {
        from_node: ("acme", "gold"),
        str(from_python): ("acme", "gold"),
    }
    job = in_tx(engine, schema, lambda s: s.get_job(q, from_node))
    assert (job.group_id, job.group_tier) == ("acme", "gold")
    seen = boss.call("getJobById", q, str(from_python))
    assert (seen["groupId"], seen["groupTier"]) == ("acme", "gold")


def test_python_fetch_counts_the_jobs_node_holds_active(engine: Engine, on46: Shared46) -> None:
    schema, boss, q = on46.schema, on46.boss, on46.queue()
    boss.call("createQueue", q)
    boss.call("insert", q, [{"data": {"n": n}, "group": {"id": "g"}} for n in range(4)])
    boss.call("insert", q, [{"data": {"n": 9}, "group": {"id": "h", "tier": "gold"}}])
    taken = boss.call("fetch", q, {"batchSize": 10, "groupConcurrency": 2})
    assert Counter(j["groupId"] for j in taken) == {"g": 2, "h": 1}
    limits: GroupConcurrencyConfig = {"default": 2, "tiers": {"gold": 1}}
    assert in_tx(engine, schema, lambda s: s.fetch(q, 10, group_concurrency=limits)) == []
    more = in_tx(engine, schema, lambda s: s.fetch(q, 10, group_concurrency=3))
    assert [j.group_id for j in more] == ["g"]


def test_node_fetch_counts_the_jobs_python_holds_active(engine: Engine, on46: Shared46) -> None:
    schema, boss, q = on46.schema, on46.boss, on46.queue()
    in_tx(engine, schema, lambda s: s.create_queue(q))
    jobs: list[JobSpec] = [{"data": n, "group_id": "g", "group_tier": "gold"} for n in range(4)]
    in_tx(engine, schema, lambda s: s.send_many(q, [*jobs, {"data": 9, "group_id": "h"}]))
    limits: GroupConcurrencyConfig = {"default": 1, "tiers": {"gold": 2}}
    taken = in_tx(engine, schema, lambda s: s.fetch(q, 10, group_concurrency=limits))
    assert Counter(j.group_id for j in taken) == {"g": 2, "h": 1}
    assert boss.call("fetch", q, {"batchSize": 10, "groupConcurrency": limits}) == []
    more = boss.call("fetch", q, {"batchSize": 10, "groupConcurrency": 3})
    assert [j["groupId"] for j in more] == ["g"]


GROUPS, PER_GROUP, LIMIT = 4, 8, 2


def test_node_and_python_workers_share_each_groups_limit(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    boss = node46(schema)
    boss.call("createQueue", "work")

    # Half of each group sent by each side; the first LIMIT of each by Node, in one
    # statement, so that they are the oldest jobs and Node's first batch takes exactly them.
    def node_sends(numbers: range) -> None:
        jobs = [
            {"data": {"n": n}, "group": {"id": f"g{g}"}} for g in range(GROUPS) for n in numbers
        ]
        boss.call("insert", "work", jobs)

    node_sends(range(LIMIT))
    python_jobs: list[JobSpec] = [
        {"data": {"n": n}, "group_id": f"g{g}"}
        for g in range(GROUPS)
        for n in range(LIMIT, PER_GROUP // 2 + LIMIT)
    ]
    in_tx(engine, schema, lambda s: s.send_many("work", python_jobs))
    node_sends(range(PER_GROUP // 2 + LIMIT, PER_GROUP))
    # First Node alone fills every group to the limit and holds it: one fetch of a batch
    # (its handler sleeps), since Node's own fetchers may overshoot when they race.
    options = {
        "groupConcurrency": LIMIT,
        "batchSize": GROUPS * LIMIT,
        "pollingIntervalSeconds": 0.5,
    }
    boss.call("work", "work", options, {"sleepMs": 6000})
    full = {f"g{g}": LIMIT for g in range(GROUPS)}
    assert wait_until(lambda: active_per_group(engine, schema, "work") == full, timeout=15)

    # A Python worker with free slots starts meanwhile: the groups are full, it takes nothing.
    ran: list[Job] = []
    lock = threading.Lock()

    def handle(job: Job) -> None:
        with lock:
            ran.append(job)
        time.sleep(0.05)

    worker = Worker(engine, schema=schema, supervise=False, poll_interval=0.1)
    worker.register("work", handle, concurrency=4, group_concurrency=LIMIT)
    worker.start()
    try:
        time.sleep(1.0)
        node_active = active_per_group(engine, schema, "work")
        assert ran == [] and node_active == full
        # As Node's jobs finish, both sides take the freed places, and every job runs.
        assert wait_until(
            lambda: states(engine, schema, "work")["completed"] == GROUPS * PER_GROUP, timeout=60
        )
    finally:
        worker.stop(5)
    by_node = Counter(e["data"]["n"] >= 0 for e in boss.events_of("job"))
    assert ran and by_node[True] > 0
    assert len(ran) + by_node[True] == GROUPS * PER_GROUP


def test_a_node_worker_takes_nothing_of_groups_a_python_worker_holds_full(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    boss = node46(schema)
    in_tx(engine, schema, lambda s: s.create_queue("work"))
    jobs: list[JobSpec] = [
        {"data": {"n": n}, "group_id": f"g{g}"} for g in range(GROUPS) for n in range(PER_GROUP)
    ]
    in_tx(engine, schema, lambda s: s.send_many("work", jobs))
    release = threading.Event()
    ran: list[Job] = []

    def handle(job: Job) -> None:
        ran.append(job)
        release.wait(30)

    worker = Worker(engine, schema=schema, supervise=False, poll_interval=0.1)
    worker.register("work", handle, concurrency=GROUPS * LIMIT + 2, group_concurrency=LIMIT)
    worker.start()
    try:
        full = {f"g{g}": LIMIT for g in range(GROUPS)}
        assert wait_until(lambda: active_per_group(engine, schema, "work") == full, timeout=15)
        options = {"groupConcurrency": LIMIT, "batchSize": 4, "pollingIntervalSeconds": 0.5}
        boss.call("work", "work", options, {"sleepMs": 20})
        time.sleep(1.5)  # Node polls three times meanwhile
        assert boss.events_of("job") == []
        assert active_per_group(engine, schema, "work") == full
        # The Python worker leaves (its held jobs are failed for retry): Node takes the
        # places and works every job, the retried ones too.
        worker.stop(0.5)
        release.set()
        assert wait_until(
            lambda: states(engine, schema, "work")["completed"] == GROUPS * PER_GROUP, timeout=60
        )
    finally:
        release.set()
        worker.stop(5)
    assert len(ran) == GROUPS * LIMIT
    assert len(boss.events_of("job")) == GROUPS * PER_GROUP
