"""Group concurrency at schema 46 (pg-boss 12's ``group`` send option and ``groupConcurrency``).

- ``send(..., group_id=, group_tier=)`` and ``send_many`` store the job's group; bad
  groups are refused before any SQL; schema 26 refuses them.
- ``fetch(..., group_concurrency=)`` activates a grouped job only while its group has
  fewer active jobs in the queue than its limit (an int, or ``default`` + ``tiers``),
  counting every client's active jobs, and never more than the room left in one batch.
- Two transactions claiming at once never exceed a limit together (group locks), and
  four worker processes on one queue never do either, while every group completes.
- A worker's ``local_group_concurrency`` limits its own running jobs per group.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.worker import Harness, wait_for

from alkstore_sa import HandlerSpec, InvalidOptionsError, Job, JobSpec, QueueService, limits
from alkstore_sa import options as opt
from alkstore_sa.groups import GroupLimits, group_limits

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent


def groups_of(jobs: list[Job]) -> Counter[str | None]:
    return Counter(j.group_id for j in jobs)


def active_per_group(engine: Engine, schema: str, queue: str) -> dict[str, int]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f'SELECT group_id, count(*) FROM "{schema}".job '
                "WHERE name = :q AND state = 'active' AND group_id IS NOT NULL GROUP BY group_id"
            ),
            {"q": queue},
        ).all()
    return {r[0]: int(r[1]) for r in rows}


def send_grouped(env: Any, queue: str, per_group: dict[str, int], tier: Any = None) -> None:
    jobs: list[dict[str, Any]] = []
    for group, n in per_group.items():
        for i in range(n):
            job: dict[str, Any] = {"data": {"g": group, "i": i}, "group_id": group}
            if tier is not None and tier(group) is not None:
                job["group_tier"] = tier(group)
            jobs.append(job)
    env.tx(lambda q: q.send_many(queue, jobs))


# ------------------------------------------------------------- sending


def test_send_and_send_many_store_the_group_and_its_tier(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    one = env46.tx(lambda q: q.send("q", None, group_id="acme", group_tier="gold"))
    two, three = env46.tx(lambda q: q.send_many("q", [{"group_id": "beta"}, {"data": 1}]))
    rows = {
        r.id: (r.group_id, r.group_tier)
        for r in env46.sql("SELECT id, group_id, group_tier FROM {s}.job")
    }
    assert rows == {one: ("acme", "gold"), two: ("beta", None), three: (None, None)}
    job = env46.tx(lambda q: q.get_job("q", one))
    assert (job.group_id, job.group_tier) == ("acme", "gold")


def test_a_schedule_stores_the_group_where_node_reads_it(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    env46.tx(lambda q: q.schedule("q", "* * * * *", None, group_id="acme", group_tier="gold"))
    [(options,)] = env46.sql("SELECT options FROM {s}.schedule WHERE name = 'q'")
    assert options["group"] == {"id": "acme", "tier": "gold"}
    [info] = env46.tx(lambda q: q.get_schedules("q"))
    assert opt.from_pgboss_send_options(info.options) == {"group_id": "acme", "group_tier": "gold"}


def test_a_failed_job_keeps_its_group_and_still_counts_when_retried(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", retry_limit=1))
    send_grouped(env46, "q", {"a": 2}, tier=lambda g: "gold")
    [first] = env46.tx(lambda q: q.fetch("q", 5, group_concurrency=1))
    env46.tx(lambda q: q.fail("q", first))
    [(group, tier, state)] = env46.sql(
        "SELECT group_id, group_tier, state::text FROM {s}.job WHERE id = :i", i=first.id
    )
    assert (group, tier, state) == ("a", "gold", "retry")
    [again] = env46.tx(lambda q: q.fetch("q", 5, group_concurrency=1))
    assert again.group_id == "a"
    assert env46.tx(lambda q: q.fetch("q", 5, group_concurrency=1)) == []
    env46.tx(lambda q: q.complete("q", again))
    [last] = env46.tx(lambda q: q.fetch("q", 5, group_concurrency=1))
    assert first.id in {again.id, last.id} and again.id != last.id  # the retry ran too


def test_a_group_too_large_for_its_index_does_not_stop_the_queue(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    ok = env46.tx(lambda q: q.send("q", {"ok": True}, group_id="g"))
    # Written by another client, older than ours and incompressible: activating it
    # would overflow job_i7 and fail every claim of the queue.
    big = os.urandom(3000).hex()
    env46.sql(
        "INSERT INTO {s}.job (name, data, group_id, created_on) "
        "VALUES ('q', '{}', :g, now() - interval '1 hour')",
        g=big,
    )
    assert [j.id for j in env46.tx(lambda q: q.fetch("q", 5))] == [ok]
    assert env46.tx(lambda q: q.fetch("q", 5, group_concurrency=1)) == []
    [(state,)] = env46.sql("SELECT state::text FROM {s}.job WHERE group_id = :g", g=big)
    assert state == "created"


BAD_SENDS: list[tuple[dict[str, Any], str, str]] = [
    ({"group_id": ""}, "group_id", "non-empty"),
    ({"group_id": 7}, "group_id", "must be a string"),
    ({"group_id": "a\x00b"}, "group_id", r"U\+0000"),
    ({"group_id": "x" * (limits.MAX_GROUP_ID_BYTES + 1)}, "group_id", "at most"),
    ({"group_id": "g", "group_tier": ""}, "group_tier", "non-empty"),
    ({"group_id": "g", "group_tier": ["gold"]}, "group_tier", "must be a string"),
    ({"group_tier": "gold"}, "group_tier", "only allowed with a group_id"),
    ({"group_id": None, "group_tier": "gold"}, "group_tier", "only allowed with a group_id"),
]


def test_a_bad_group_is_refused_before_any_sql(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))

    def attempt(q: Any) -> None:
        for options, option, problem in BAD_SENDS:
            with pytest.raises(InvalidOptionsError, match=problem) as caught:
                q.send("q", None, **options)
            assert caught.value.option == option, options
            with pytest.raises(InvalidOptionsError, match=problem) as caught:
                q.send_many("q", [{"data": 1}, options])
            assert caught.value.option == f"jobs[1].{option}", options
        q.send("q", {"after": True})  # the transaction is still usable

    env46.tx(attempt)
    assert [r.data for r in env46.sql("SELECT data FROM {s}.job")] == [{"after": True}]


def test_the_longest_group_is_stored_and_claimed(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    group = "é" * (limits.MAX_GROUP_ID_BYTES // 2)
    env46.tx(lambda q: q.send("q", None, group_id=group, group_tier="t" * 2048))
    [job] = env46.tx(lambda q: q.fetch("q", 5, group_concurrency=1))
    assert job.group_id == group


def test_schema_26_refuses_groups_without_touching_the_transaction(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))

    def attempt(q: Any) -> list[str]:
        caught = []
        calls: list[Callable[[], Any]] = [
            lambda: q.send("q", None, group_id="g"),
            lambda: q.send_many("q", [{"group_id": "g", "group_tier": "t"}]),
            lambda: q.fetch("q", 1, group_concurrency=2),
        ]
        for call in calls:
            with pytest.raises(InvalidOptionsError, match="needs pg-boss schema 46") as caught_:
                call()
            assert "this schema is at 26" in str(caught_.value)
            caught.append(caught_.value.option)
        q.send("q", {"after": True})
        return caught

    assert env.tx(attempt) == ["group_id", "group_id", "group_concurrency"]
    assert [r.data for r in env.sql("SELECT data FROM {s}.job")] == [{"after": True}]


# ------------------------------------------------------------- fetch


def test_one_fetch_takes_no_more_of_a_group_than_its_limit(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    send_grouped(env46, "q", {"a": 5, "b": 5})
    env46.tx(lambda q: q.send_many("q", [{"data": n} for n in range(2)]))
    jobs = env46.tx(lambda q: q.fetch("q", 20, group_concurrency=2))
    assert groups_of(jobs) == {"a": 2, "b": 2, None: 2}
    # Full groups give nothing more, in a new transaction or with a larger batch.
    assert env46.tx(lambda q: q.fetch("q", 20, group_concurrency=2)) == []
    # A place freed is a place taken, by the oldest job of the group.
    first_a = min((j for j in jobs if j.group_id == "a"), key=lambda j: j.data["i"])
    env46.tx(lambda q: q.complete("q", first_a))
    [next_a] = env46.tx(lambda q: q.fetch("q", 20, group_concurrency=2))
    assert (next_a.group_id, next_a.data["i"]) == ("a", 2)


def test_a_full_group_at_the_head_does_not_hold_back_the_others(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    send_grouped(env46, "q", {"head": 50})
    send_grouped(env46, "q", {"tail": 1})
    first = env46.tx(lambda q: q.fetch("q", 1, group_concurrency=1))
    assert groups_of(first) == {"head": 1}
    second = env46.tx(lambda q: q.fetch("q", 1, group_concurrency=1))
    assert groups_of(second) == {"tail": 1}


def test_tiers_give_their_groups_their_own_limit_and_others_the_default(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    tiers = {"gold": "gold", "silver": "silver", "plain": None}
    send_grouped(env46, "q", {"gold": 6, "silver": 6, "plain": 6}, tier=tiers.get)
    limits_ = {"default": 1, "tiers": {"gold": 4}}
    jobs = env46.tx(lambda q: q.fetch("q", 50, group_concurrency=limits_))
    # gold is named; silver's tier is not, so it takes the default, as a tierless group does.
    assert groups_of(jobs) == {"gold": 4, "silver": 1, "plain": 1}
    assert env46.tx(lambda q: q.fetch("q", 50, group_concurrency=limits_)) == []
    # Another fetcher's limits are its own: with a default of 3, room shows again.
    more = env46.tx(lambda q: q.fetch("q", 50, group_concurrency=3))
    assert groups_of(more) == {"silver": 2, "plain": 2}


def test_active_jobs_of_any_client_count_against_the_limit(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    send_grouped(env46, "q", {"a": 4})
    # Activated by another client (by hand, as Node would): the claim reads the table.
    env46.sql(
        "UPDATE {s}.job SET state = 'active', started_on = now() WHERE id IN "
        "(SELECT id FROM {s}.job WHERE group_id = 'a' ORDER BY created_on LIMIT 2)"
    )
    assert env46.tx(lambda q: q.fetch("q", 10, group_concurrency=2)) == []
    assert groups_of(env46.tx(lambda q: q.fetch("q", 10, group_concurrency=3))) == {"a": 1}


def test_a_fetch_without_group_concurrency_ignores_groups(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    send_grouped(env46, "q", {"a": 4})
    assert groups_of(env46.tx(lambda q: q.fetch("q", 10))) == {"a": 4}


@pytest.mark.parametrize("policy", ["singleton", "stately", "key_strict_fifo"])
def test_group_limits_hold_on_policy_queues_too(env46: Any, policy: str) -> None:
    env46.tx(lambda q: q.create_queue("q", policy=policy))
    jobs = [{"data": n, "singleton_key": f"k{n}", "group_id": "a"} for n in range(4)]
    jobs += [{"data": 9, "singleton_key": "k9", "group_id": "b"}]
    env46.tx(lambda q: q.send_many("q", jobs))
    got = env46.tx(lambda q: q.fetch("q", 10, group_concurrency=2))
    assert groups_of(got) == {"a": 2, "b": 1}


BAD_LIMITS: list[tuple[Any, str, str]] = [
    (0, "group_concurrency", "from 1 to"),
    (-1, "group_concurrency", "from 1 to"),
    (True, "group_concurrency", "must be an integer or a mapping"),
    (1.5, "group_concurrency", "must be an integer or a mapping"),
    ("2", "group_concurrency", "must be an integer or a mapping"),
    (2**31, "group_concurrency", "from 1 to"),
    ({}, "group_concurrency", "needs 'default'"),
    ({"tiers": {"gold": 2}}, "group_concurrency", "needs 'default'"),
    ({"default": 0}, "group_concurrency.default", "from 1 to"),
    ({"default": "1"}, "group_concurrency.default", "from 1 to"),
    ({"default": 1, "limit": 2}, "group_concurrency", "unknown key 'limit'"),
    ({"default": 1, "tiers": [("gold", 2)]}, "group_concurrency.tiers", "mapping of tier"),
    ({"default": 1, "tiers": {"": 2}}, "group_concurrency.tiers", "non-empty"),
    ({"default": 1, "tiers": {3: 2}}, "group_concurrency.tiers", "must be a string"),
    ({"default": 1, "tiers": {"gold": 0}}, "group_concurrency.tiers['gold']", "from 1 to"),
    ({"default": 1, "tiers": {"gold": None}}, "group_concurrency.tiers['gold']", "from 1 to"),
]


def test_bad_group_concurrency_is_refused_before_any_sql(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    send_grouped(env46, "q", {"a": 1})

    def attempt(q: Any) -> list[Job]:
        for value, option, problem in BAD_LIMITS:
            with pytest.raises(InvalidOptionsError, match=problem) as caught:
                q.fetch("q", 1, group_concurrency=value)
            assert caught.value.option == option, value
        return list(q.fetch("q", 1))  # the transaction is still usable

    assert groups_of(env46.tx(attempt)) == {"a": 1}


def test_group_limits_normalise_ints_and_mappings() -> None:
    assert group_limits(3) == GroupLimits(3)
    checked = group_limits({"default": 1, "tiers": {"b": 5, "a": 2}})
    assert checked == GroupLimits(1, (("a", 2), ("b", 5)))
    assert (checked.limit("a"), checked.limit("zzz"), checked.limit(None), checked.most) == (
        2,
        1,
        1,
        5,
    )


# ------------------------------------------------------------- concurrent claims


def test_two_open_transactions_never_exceed_a_limit_together(engine: Engine, schema46: str) -> None:
    with Session(engine) as s, s.begin():
        q = QueueService(s, schema=schema46)
        q.create_queue("q")
        jobs: list[JobSpec] = [{"group_id": "a"} for _ in range(3)]
        q.send_many("q", [*jobs, {"group_id": "b"}])
    first = Session(engine)
    second = Session(engine)
    try:
        first.begin()
        got = QueueService(first, schema=schema46).fetch("q", 1, group_concurrency=1)
        assert groups_of(got) == {"a": 1}
        # Uncommitted: the second transaction cannot see a's active job, but a's
        # lock keeps it off group a; it takes b instead.
        second.begin()
        other = QueueService(second, schema=schema46).fetch("q", 5, group_concurrency=1)
        assert groups_of(other) == {"b": 1}
        first.commit()
        second.commit()
        with Session(engine) as s, s.begin():
            again = QueueService(s, schema=schema46).fetch("q", 5, group_concurrency=1)
        assert again == []
        assert active_per_group(engine, schema46, "q") == {"a": 1, "b": 1}
    finally:
        first.close()
        second.close()


WORKER_SCRIPT = """
import sys, time
from sqlalchemy import create_engine
from alkstore_sa import Worker

url, schema, queue, limit = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
engine = create_engine(url, pool_size=8)

def handle(job):
    time.sleep(0.002)

worker = Worker(engine, schema=schema, supervise=False)
worker.register(queue, handle, concurrency=4, group_concurrency=limit, poll_interval=0.05)
worker.start()
print("ready", flush=True)
sys.stdin.readline()
worker.stop()
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@pytest.fixture
def processes() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-c", WORKER_SCRIPT, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=child_env(),
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()
    for proc in started:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


GROUPS, PER_GROUP, LIMIT, PROCESSES = 20, 100, 2, 4


@pytest.mark.subprocess
def test_four_worker_processes_never_exceed_a_group_limit_and_finish_every_group(
    engine: Engine, schema46: str, database_url: str, processes: Any
) -> None:
    with Session(engine) as s, s.begin():
        q = QueueService(s, schema=schema46)
        q.create_queue("g")
        # Group by group, so every claim meets full groups at the head of the queue.
        q.send_many(
            "g",
            [
                {"data": {"i": i}, "group_id": f"g{g:02}"}
                for g in range(GROUPS)
                for i in range(PER_GROUP)
            ],
        )
    url = engine.url.render_as_string(hide_password=False)
    workers = [processes(url, schema46, "g", str(LIMIT)) for _ in range(PROCESSES)]
    for proc in workers:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
    highest: Counter[str] = Counter()
    samples = 0
    deadline = time.monotonic() + 120
    with engine.connect() as conn:
        sample = text(
            f'SELECT group_id, count(*) FROM "{schema46}".job '
            "WHERE name = 'g' AND state = 'active' GROUP BY group_id"
        )
        remaining = text(
            f"SELECT count(*) FROM \"{schema46}\".job WHERE name = 'g' AND state <> 'completed'"
        )
        while True:
            for group, n in conn.execute(sample).all():
                highest[group] = max(highest[group], int(n))
            conn.commit()
            samples += 1
            if samples % 20 == 0 and conn.execute(remaining).scalar_one() == 0:
                break
            assert time.monotonic() < deadline, "the workers did not finish in time"
    assert max(highest.values()) == LIMIT, highest  # reached, never passed
    with engine.connect() as conn:
        done = conn.execute(
            text(
                f'SELECT group_id, count(*) FROM "{schema46}".job '
                "WHERE name = 'g' AND state = 'completed' GROUP BY group_id"
            )
        ).all()
    assert {g: int(n) for g, n in done} == {f"g{g:02}": PER_GROUP for g in range(GROUPS)}


# ------------------------------------------------------------- workers


class GroupTracker:
    """Running jobs per group, as a handler sees them."""

    def __init__(self) -> None:
        self.running: Counter[str] = Counter()
        self.highest: Counter[str] = Counter()
        self.lock = threading.Lock()

    def enter(self, job: Job) -> None:
        assert job.group_id is not None
        with self.lock:
            self.running[job.group_id] += 1
            self.highest[job.group_id] = max(self.highest[job.group_id], self.running[job.group_id])

    def leave(self, job: Job) -> None:
        assert job.group_id is not None
        with self.lock:
            self.running[job.group_id] -= 1


@pytest.mark.parametrize("option", ["group_concurrency", "local_group_concurrency"])
def test_a_worker_runs_no_more_of_a_group_than_its_limit(harness46: Harness, option: str) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q"))
    jobs: list[JobSpec] = [
        {"data": i, "group_id": g, "group_tier": "gold"}
        if g == "gold"
        else {"data": i, "group_id": g}
        for i in range(6)
        for g in ("gold", "a", "b")
    ]
    h.service_tx(lambda q: q.send_many("q", jobs))
    tracker = GroupTracker()
    release = threading.Event()
    w = h.worker(poll_interval=0.05)
    w.register(
        "q",
        h.handler(lambda job: tracker.leave(job), block=release, on_start=tracker.enter),
        concurrency=7,
        **{option: {"default": 1, "tiers": {"gold": 3}}},
    )
    h.start(w)
    limits_ = {"gold": 3, "a": 1, "b": 1}
    # Every group fills up to its limit (a slot of the seven stays free)...
    wait_for(lambda: tracker.running == limits_, timeout=15)
    # ...and stays there while the worker keeps polling for the free slot.
    time.sleep(0.5)
    assert tracker.running == limits_
    assert active_per_group(h.engine, h.schema, "q") == limits_
    release.set()
    wait_for(
        lambda: h.sql("SELECT count(*) FROM {s}.job WHERE state = 'completed'")[0][0] == 18,
        timeout=30,
    )
    h.stop(w)
    assert tracker.highest == limits_


def test_handler_group_options_are_checked_when_registered() -> None:
    def fn(job: Job) -> None:
        return None

    with pytest.raises(InvalidOptionsError, match="choose one") as caught:
        HandlerSpec("q", fn, group_concurrency=1, local_group_concurrency=1)
    assert caught.value.option == "local_group_concurrency"
    with pytest.raises(InvalidOptionsError, match="cannot exceed the concurrency") as caught:
        HandlerSpec(
            "q", fn, concurrency=2, local_group_concurrency={"default": 1, "tiers": {"t": 3}}
        )
    assert caught.value.option == "local_group_concurrency"
    with pytest.raises(InvalidOptionsError) as caught:
        HandlerSpec("q", fn, group_concurrency=0)
    assert caught.value.option == "group_concurrency"
    with pytest.raises(InvalidOptionsError) as caught:
        HandlerSpec("q", fn, concurrency=5, local_group_concurrency={"default": -1})
    assert caught.value.option == "local_group_concurrency.default"
    # pg-boss allows a global limit above the concurrency: other workers share it.
    assert HandlerSpec("q", fn, concurrency=1, group_concurrency=10).group_concurrency == 10


def test_a_worker_at_schema_26_reports_group_concurrency_and_claims_nothing(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    job_id = h.service_tx(lambda q: q.send("q", None))
    w = h.worker(poll_interval=0.05)
    w.register("q", h.handler(), group_concurrency=2)
    h.start(w)
    wait_for(lambda: "needs pg-boss schema 46" in caplog.text, timeout=10)
    h.stop(w)
    assert h.sql("SELECT state::text FROM {s}.job WHERE id = :i", i=job_id)[0][0] == "created"
