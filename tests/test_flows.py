"""``flow``: jobs with dependencies at schema 46 (pg-boss 12.38's ``flow``).

The service tests run with QueueService and AsyncQueueService (``env46``); the
worker test with Worker and AsyncWorker (``harness46``). Children are released by
the flow turn of supervision, as Node's background resolver releases them.
"""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from conftest import Env
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from support.worker import Harness, wait_for

from alkstore_sa import (
    FlowConflictError,
    InvalidOptionsError,
    JobDependency,
    JobState,
    QueueNotFoundError,
    QueueService,
    SchemaFeatureError,
    limits,
)
from alkstore_sa.names import notify_channel
from alkstore_sa.sql.v46 import node_channel
from alkstore_sa.supervision import Supervisor

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PAIR: list[Any] = [{"ref": "p", "name": "q"}, {"ref": "c", "name": "q", "depends_on": ["p"]}]


def flags(env: Any, job_id: uuid.UUID) -> tuple[str, bool, bool, int]:
    [row] = env.sql(
        "SELECT state::text, blocked, blocking, pending_dependencies FROM {s}.job WHERE id = :id",
        id=job_id,
    )
    return tuple(row)


def dependencies(env: Any) -> set[tuple[str, uuid.UUID, str, uuid.UUID]]:
    rows = env.sql("SELECT child_name, child_id, parent_name, parent_id FROM {s}.job_dependency")
    return {tuple(r) for r in rows}


@pytest.fixture
def env46(env46_or_split: Env) -> Env:
    """Every test here runs split as well (``noMultiMutationCte``, conftest)."""
    return env46_or_split


def resolve(env: Any) -> Any:
    """One supervision pass that takes the flow turn (and nothing else that matters here)."""
    supervisor = Supervisor(
        env.engine, schema=env.schema, schedule=False, bam=False, backend=env.backend
    )
    return supervisor.run_once(force=True)


def run_one(env: Any, queue: str) -> uuid.UUID | None:
    """Fetch and complete one job of ``queue``; its id, or None if none was ready."""

    def work(q: Any) -> uuid.UUID | None:
        jobs = q.fetch(queue)
        if not jobs:
            return None
        q.complete(queue, jobs[0])
        return jobs[0].id  # type: ignore[no-any-return]

    return env.tx(work)  # type: ignore[no-any-return]


# ------------------------------------------------------------------ sending


def test_flow_writes_jobs_flags_and_dependencies_as_node_does(env46: Any) -> None:
    env46.tx(lambda q: [q.create_queue("a"), q.create_queue("b")])
    ids = env46.tx(
        lambda q: q.flow(
            [
                {"ref": "extract", "name": "a", "data": {"n": 1}},
                {"ref": "load", "name": "a", "data": {"n": 2}, "options": {"priority": 5}},
                {"ref": "report", "name": "b", "depends_on": ["extract", "load", "extract"]},
                {"ref": "notify", "name": "b", "depends_on": ["report"]},
            ]
        )
    )
    assert list(ids) == ["extract", "load", "report", "notify"]
    assert all(isinstance(i, uuid.UUID) for i in ids.values())
    assert flags(env46, ids["extract"]) == ("created", False, True, 0)
    assert flags(env46, ids["load"]) == ("created", False, True, 0)
    # A parent named twice counts once, as pg-boss deduplicates dependsOn.
    assert flags(env46, ids["report"]) == ("created", True, True, 2)
    assert flags(env46, ids["notify"]) == ("created", True, False, 1)
    assert dependencies(env46) == {
        ("b", ids["report"], "a", ids["extract"]),
        ("b", ids["report"], "a", ids["load"]),
        ("b", ids["notify"], "b", ids["report"]),
    }
    [(priority, data)] = env46.sql(
        "SELECT priority, data FROM {s}.job WHERE id = :i", i=ids["load"]
    )
    assert (priority, data) == (5, {"n": 2})
    # Blocked children are never fetched, whatever their queue holds.
    assert env46.tx(lambda q: q.fetch("b", 10)) == []


def test_children_run_only_after_every_parent_completed(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    ids = env46.tx(
        lambda q: q.flow(
            [
                {"ref": "p1", "name": "q"},
                {"ref": "p2", "name": "q"},
                {"ref": "c", "name": "q", "depends_on": ["p1", "p2"]},
            ]
        )
    )
    first = run_one(env46, "q")
    assert first in (ids["p1"], ids["p2"])
    resolve(env46)
    assert flags(env46, ids["c"])[1:] == (True, False, 1)  # one parent left
    second = run_one(env46, "q")
    assert {first, second} == {ids["p1"], ids["p2"]}
    assert run_one(env46, "q") is None  # completed, but not resolved yet
    report = resolve(env46)
    assert report.flows_resolved >= 1 and report.released == 1
    assert flags(env46, ids["c"]) == ("created", False, False, 0)
    assert run_one(env46, "q") == ids["c"]


@pytest.mark.postgres_only
def test_a_flow_spans_partitioned_and_shared_queues(env46: Any) -> None:
    env46.tx(lambda q: [q.create_queue("own", partition=True), q.create_queue("shared")])
    ids = env46.tx(
        lambda q: q.flow(
            [
                {"ref": "p", "name": "own"},
                {"ref": "c", "name": "shared", "depends_on": ["p"]},
                {"ref": "g", "name": "own", "depends_on": ["c"]},
            ]
        )
    )
    assert run_one(env46, "shared") is None
    assert run_one(env46, "own") == ids["p"]
    resolve(env46)
    assert run_one(env46, "own") is None
    assert run_one(env46, "shared") == ids["c"]
    resolve(env46)
    assert run_one(env46, "own") == ids["g"]


def test_given_ids_are_kept_and_returned(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    mine = uuid.uuid4()
    ids = env46.tx(
        lambda q: q.flow(
            [
                {"ref": "a", "name": "q", "options": {"id": mine}},
                {"ref": "b", "name": "q", "depends_on": ["a"]},
            ]
        )
    )
    assert ids["a"] == mine
    assert flags(env46, mine) == ("created", False, True, 0)


def test_flow_jobs_carry_their_group(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    ids = env46.tx(
        lambda q: q.flow(
            [
                {
                    "ref": "a",
                    "name": "q",
                    "options": {"group_id": "tenant-1", "group_tier": "gold"},
                },
                {"ref": "b", "name": "q", "depends_on": ["a"], "options": {"group_id": "tenant-2"}},
            ]
        )
    )
    rows = env46.sql("SELECT id, group_id, group_tier FROM {s}.job")
    assert {r[0]: (r[1], r[2]) for r in rows} == {
        ids["a"]: ("tenant-1", "gold"),
        ids["b"]: ("tenant-2", None),
    }


def test_the_flow_exists_only_if_the_callers_transaction_commits(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    svc = env46.service()
    ids = svc.flow([{"ref": "a", "name": "q"}, {"ref": "b", "name": "q", "depends_on": ["a"]}])
    assert len(ids) == 2
    env46.rollback()
    assert env46.sql("SELECT count(*) FROM {s}.job")[0][0] == 0
    assert dependencies(env46) == set()


def test_a_conflicting_job_refuses_the_whole_flow_and_leaves_the_transaction_usable(
    env46: Any,
) -> None:
    env46.tx(lambda q: [q.create_queue("q"), q.create_queue("s", policy="singleton")])
    taken = env46.tx(lambda q: q.send("q", {"first": True}))
    svc = env46.service()
    with pytest.raises(FlowConflictError, match="nothing of the flow was written"):
        svc.flow(
            [
                {"ref": "a", "name": "s"},
                {"ref": "b", "name": "q", "options": {"id": taken}, "depends_on": ["a"]},
            ]
        )
    # Same transaction, still usable: a send in it commits.
    later = svc.send("q", {"after": True})
    env46.commit()
    assert later is not None
    assert env46.sql("SELECT count(*) FROM {s}.job WHERE name = 's'")[0][0] == 0
    assert env46.sql("SELECT count(*) FROM {s}.job WHERE name = 'q'")[0][0] == 2
    assert dependencies(env46) == set()


@pytest.mark.postgres_only
def test_a_flow_announces_the_queues_of_its_ready_jobs(env46: Any, database_url: str) -> None:
    env46.tx(lambda q: [q.create_queue("n"), q.create_queue("plain")])
    env46.sql("UPDATE {s}.queue SET notify = true WHERE name = 'n'")
    node, ours = node_channel(env46.schema), notify_channel(env46.schema)
    listener = psycopg.connect(database_url.replace("postgresql+psycopg://", "postgresql://"))
    listener.autocommit = True
    listener.execute(f'LISTEN "{node}"')
    listener.execute(f'LISTEN "{ours}"')

    def notices() -> list[tuple[str, str]]:
        return sorted((n.channel, n.payload) for n in listener.notifies(timeout=0.5))

    try:
        # A blocked child is not ready: its queue is not announced.
        env46.tx(
            lambda q: q.flow(
                [{"ref": "p", "name": "plain"}, {"ref": "c", "name": "n", "depends_on": ["p"]}]
            )
        )
        assert notices() == [(ours, "plain")]
        # A ready root in a notify queue wakes Node's workers too.
        env46.tx(
            lambda q: q.flow(
                [{"ref": "p", "name": "n"}, {"ref": "c", "name": "plain", "depends_on": ["p"]}]
            )
        )
        assert notices() == sorted([(node, "n"), (ours, "n")])
    finally:
        listener.close()


# ------------------------------------------------------------------ bad input


BAD: list[tuple[Any, str]] = [
    ("not a list", "must be a list of flow jobs"),
    ({"ref": "a", "name": "q"}, "must be a list of flow jobs"),
    ([{"ref": "a", "name": "q"}], "at least 2 jobs"),
    ([{"ref": "a", "name": "q"}, {"ref": "b", "name": "q"}], "at least one job with depends_on"),
    ([{"ref": "", "name": "q"}, {"ref": "b", "name": "q", "depends_on": [""]}], "non-empty ref"),
    ([{"name": "q"}, {"ref": "b", "name": "q"}], "non-empty ref"),
    (
        [{"ref": "a", "name": "q"}, {"ref": "a", "name": "q", "depends_on": ["a"]}],
        "duplicate ref 'a'",
    ),
    ([{"ref": "a", "name": ""}, {"ref": "b", "name": "q", "depends_on": ["a"]}], "queue name"),
    (
        [{"ref": "a", "name": "q"}, {"ref": "b", "name": "q", "depends_on": ["zz"]}],
        "ref 'zz' is not a job of this flow",
    ),
    (
        [{"ref": "a", "name": "q"}, {"ref": "b", "name": "q", "depends_on": ["b"]}],
        "'b' cannot depend on itself",
    ),
    (
        [{"ref": "a", "name": "q"}, {"ref": "b", "name": "q", "depends_on": "a"}],
        "must be a list of refs",
    ),
    (
        [{"ref": "a", "name": "q"}, {"ref": "b", "name": "q", "dependsOn": ["a"]}],
        "unknown key",
    ),
    (
        [
            {"ref": "a", "name": "q", "options": {"priority": "high"}},
            {"ref": "b", "name": "q", "depends_on": ["a"]},
        ],
        "priority",
    ),
    (
        [
            {"ref": "a", "name": "q", "options": {"retry_limit": -1}},
            {"ref": "b", "name": "q", "depends_on": ["a"]},
        ],
        "retry_limit",
    ),
    (
        [
            {"ref": "root", "name": "q"},
            {"ref": "x", "name": "q", "depends_on": ["root", "z"]},
            {"ref": "y", "name": "q", "depends_on": ["x"]},
            {"ref": "z", "name": "q", "depends_on": ["y"]},
        ],
        "dependency cycle: 'x' -> 'y' -> 'z' -> 'x'",
    ),
]


@pytest.mark.parametrize(("jobs", "problem"), BAD)
def test_bad_flows_are_refused_before_any_write(env46: Any, jobs: Any, problem: str) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match=problem.replace("(", r"\(")):
        svc.flow(jobs)
    assert svc.send("q") is not None  # the transaction is usable
    env46.commit()
    assert env46.sql("SELECT count(*) FROM {s}.job")[0][0] == 1
    assert dependencies(env46) == set()


def test_a_cycle_names_its_refs(env46: Any) -> None:
    svc = env46.service()
    jobs = [{"ref": f"j{i}", "name": "q", "depends_on": [f"j{(i + 1) % 3}"]} for i in range(3)]
    with pytest.raises(InvalidOptionsError) as caught:
        svc.flow([{"ref": "free", "name": "q"}, *jobs])
    message = str(caught.value)
    assert "dependency cycle" in message
    assert all(f"'j{i}'" in message for i in range(3))
    assert "'free'" not in message


def test_unknown_queues_are_refused_as_send_refuses_them(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    svc = env46.service()
    with pytest.raises(QueueNotFoundError, match="nope"):
        svc.flow([{"ref": "a", "name": "q"}, {"ref": "b", "name": "nope", "depends_on": ["a"]}])
    assert svc.send("q") is not None
    env46.commit()
    assert env46.sql("SELECT count(*) FROM {s}.job")[0][0] == 1


def test_a_duplicate_id_in_one_queue_is_refused(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    same = uuid.uuid4()
    with pytest.raises(InvalidOptionsError, match="also the id of jobs"):
        env46.tx(
            lambda q: q.flow(
                [
                    {"ref": "a", "name": "q", "options": {"id": same}},
                    {"ref": "b", "name": "q", "options": {"id": same}, "depends_on": ["a"]},
                ]
            )
        )


def test_key_strict_fifo_jobs_need_a_key_in_a_flow_too(env46: Any) -> None:
    env46.tx(lambda q: [q.create_queue("q"), q.create_queue("k", policy="key_strict_fifo")])
    with pytest.raises(InvalidOptionsError, match="key_strict_fifo"):
        env46.tx(
            lambda q: q.flow(
                [{"ref": "a", "name": "q"}, {"ref": "b", "name": "k", "depends_on": ["a"]}]
            )
        )
    ids = env46.tx(
        lambda q: q.flow(
            [
                {"ref": "a", "name": "q"},
                {"ref": "b", "name": "k", "options": {"singleton_key": "x"}, "depends_on": ["a"]},
            ]
        )
    )
    assert flags(env46, ids["b"]) == ("created", True, False, 1)


def test_a_flow_past_the_limit_is_refused(env46: Any) -> None:
    jobs: list[Any] = [{"ref": "p", "name": "q"}]
    jobs += [{"ref": str(i), "name": "q", "depends_on": ["p"]} for i in range(limits.MAX_FLOW_JOBS)]
    with pytest.raises(InvalidOptionsError, match="at most 100,000 jobs"):
        env46.service().flow(jobs)


def test_flow_needs_schema_46(engine: Engine, schema: str) -> None:
    refused = pytest.raises(SchemaFeatureError, match="flow needs a pg-boss schema at version 46")
    with Session(engine) as session, session.begin(), refused:
        QueueService(session, schema=schema).flow(PAIR)


# ------------------------------------------------------------------ reading a flow


def test_dependencies_and_dependents_list_parents_and_children_with_their_states(
    env46: Any,
) -> None:
    env46.tx(lambda q: [q.create_queue("a"), q.create_queue("b")])
    ids = env46.tx(
        lambda q: q.flow(
            [
                {"ref": "p1", "name": "b"},
                {"ref": "p2", "name": "a"},
                {"ref": "c", "name": "b", "depends_on": ["p1", "p2"]},
                {"ref": "g", "name": "a", "depends_on": ["c"]},
            ]
        )
    )

    def dep(ref: str, state: str | None) -> JobDependency:
        queue = {"p1": "b", "p2": "a", "c": "b", "g": "a"}[ref]
        return JobDependency(queue, ids[ref], None if state is None else JobState(state))

    # Ordered by queue, then id, as pg-boss orders them.
    parents = [dep("p2", "created"), dep("p1", "created")]
    assert env46.tx(lambda q: q.get_dependencies("b", ids["c"])) == parents
    [child] = env46.tx(lambda q: q.get_dependents("b", ids["p1"]))
    assert child == dep("c", "created") and type(child.state) is JobState
    assert env46.tx(lambda q: q.get_dependents("a", ids["g"])) == []
    assert env46.tx(lambda q: q.get_dependencies("a", str(ids["p2"]))) == []
    # States are read when asked: a completed parent shows as completed.
    assert run_one(env46, "a") == ids["p2"]
    assert env46.tx(lambda q: q.get_dependencies("b", ids["c"]))[0] == dep("p2", "completed")
    # Pages: the last row of one page (or its (queue, id)) continues the listing.
    first = env46.tx(lambda q: q.get_dependencies("b", ids["c"], limit=1))
    assert first == [dep("p2", "completed")]
    rest = env46.tx(lambda q: q.get_dependencies("b", ids["c"], after=first[-1]))
    assert rest == [dep("p1", "created")]
    assert env46.tx(lambda q: q.get_dependencies("b", ids["c"], after=("b", ids["p1"]))) == []
    # A deleted parent is still listed until maintenance drops its row, without a state.
    env46.tx(lambda q: q.delete_job("b", ids["p1"]))
    assert env46.tx(lambda q: q.get_dependencies("b", ids["c"]))[1] == dep("p1", None)
    # An unknown job (or queue) has no parents and no children, as in pg-boss.
    assert env46.tx(lambda q: q.get_dependencies("b", uuid.uuid4())) == []
    assert env46.tx(lambda q: q.get_dependents("nowhere", ids["c"])) == []


@pytest.mark.parametrize(
    ("call", "problem"),
    [
        (lambda q: q.get_dependencies("q", "not-a-uuid"), "id"),
        (lambda q: q.get_dependents("", uuid.uuid4()), "name"),
        (lambda q: q.get_dependencies("q", uuid.uuid4(), limit=0), "limit"),
        (lambda q: q.get_dependents("q", uuid.uuid4(), limit=100_001), "limit"),
        (lambda q: q.get_dependencies("q", uuid.uuid4(), after="q"), "after"),
        (lambda q: q.get_dependencies("q", uuid.uuid4(), after=("q", "x")), "after"),
    ],
)
def test_dependency_reads_refuse_bad_input_before_any_sql(
    engine: Engine, schema: str, call: Any, problem: str
) -> None:
    # At schema 26 the call itself is refused: bad input is named before that.
    with Session(engine) as session, session.begin(), pytest.raises(InvalidOptionsError) as bad:
        call(QueueService(session, schema=schema))
    assert bad.value.option == problem


def test_dependency_reads_need_schema_46(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        with pytest.raises(SchemaFeatureError, match=r"get_dependencies needs .* version 46"):
            q.get_dependencies("q", uuid.uuid4())
        with pytest.raises(SchemaFeatureError, match=r"get_dependents needs .* version 46"):
            q.get_dependents("q", uuid.uuid4())


# ------------------------------------------------------------------ failure and deletion


def test_a_failed_parent_leaves_its_children_blocked_until_it_completes(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", retry_limit=0))
    ids = env46.tx(lambda q: q.flow(PAIR))

    def fail_one(q: Any) -> None:
        [job] = q.fetch("q")
        q.fail("q", job, {"boom": True})

    env46.tx(fail_one)
    # The failed job keeps its flow flags (fail re-inserts every column).
    assert flags(env46, ids["p"]) == ("failed", False, True, 0)
    resolve(env46)
    assert flags(env46, ids["c"]) == ("created", True, False, 1)  # as pg-boss: blocked
    assert run_one(env46, "q") is None
    # Retried and completed, the parent releases its child after all.
    env46.tx(lambda q: q.retry("q", ids["p"]))
    assert run_one(env46, "q") == ids["p"]
    resolve(env46)
    assert run_one(env46, "q") == ids["c"]


def test_a_cancelled_parent_leaves_its_children_blocked(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    ids = env46.tx(lambda q: q.flow(PAIR))
    env46.tx(lambda q: q.cancel("q", ids["p"]))
    resolve(env46)
    assert flags(env46, ids["c"]) == ("created", True, False, 1)


def test_a_deleted_parent_leaves_its_child_blocked_and_maintenance_drops_the_dependency(
    env46: Any,
) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    ids = env46.tx(lambda q: q.flow(PAIR))
    env46.tx(lambda q: q.delete_job("q", ids["p"]))
    assert dependencies(env46) == {("q", ids["c"], "q", ids["p"])}
    resolve(env46)  # the flow turn, and (force=True) the queue's maintenance
    # pg-boss releases a child only for a parent that completed: a child whose
    # parent is gone stays blocked (retention deletes it past keep_until) ...
    assert flags(env46, ids["c"]) == ("created", True, False, 1)
    assert run_one(env46, "q") is None
    # ... and maintenance removes the dependency row whose parent no longer exists.
    assert dependencies(env46) == set()
    # It can still be cancelled or deleted by hand.
    assert env46.tx(lambda q: q.cancel("q", ids["c"])).affected == [ids["c"]]


# ------------------------------------------------------------------ sizes


def test_a_flow_of_10_000_children_is_sent_and_released(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q"))
    jobs: list[Any] = [{"ref": "p", "name": "q"}]
    jobs += [{"ref": f"c{i}", "name": "q", "depends_on": ["p"]} for i in range(10_000)]
    ids = env46.tx(lambda q: q.flow(jobs))
    assert len(ids) == 10_001
    assert env46.sql("SELECT count(*) FROM {s}.job WHERE blocked")[0][0] == 10_000
    assert env46.sql("SELECT count(*) FROM {s}.job_dependency")[0][0] == 10_000
    assert run_one(env46, "q") == ids["p"]
    report = resolve(env46)
    assert report.released == 10_000
    assert env46.sql("SELECT count(*) FROM {s}.job WHERE blocked")[0][0] == 0


def layered_dag(queue: str, layers: int, width: int) -> list[Any]:
    """``layers`` x ``width`` jobs; each depends on up to 3 jobs of the layer above."""
    jobs: list[Any] = []
    for layer in range(layers):
        for i in range(width):
            ref = f"{layer}.{i}"
            parents = (
                sorted({f"{layer - 1}.{(i * 7 + k * 13) % width}" for k in range(3)})
                if layer
                else []
            )
            jobs.append({"ref": ref, "name": queue, "data": {"ref": ref}, "depends_on": parents})
    return jobs


@pytest.mark.slow  # a thousand jobs worked in order: scale, not a new path
def test_a_1000_job_dag_is_worked_in_dependency_order(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("dag"))
    jobs = layered_dag("dag", layers=10, width=100)
    ids = h.service_tx(lambda q: q.flow(jobs))
    assert len(ids) == 1000
    w = h.start(
        h.worker(
            handlers={"dag": h.handler()},
            poll_interval=0.2,
            supervise=True,
            supervisor_options={"flow_interval": 1, "schedule": False, "bam": False},
        )
    )
    wait_for(
        lambda: h.sql("SELECT count(*) FROM {s}.job WHERE state = 'completed'")[0][0] == 1000,
        timeout=120,
        interval=0.5,
    )
    h.stop(w)
    times = {
        row.id: (row.started_on, row.completed_on)
        for row in h.sql("SELECT id, started_on, completed_on FROM {s}.job")
    }
    for job in jobs:
        started, _ = times[ids[job["ref"]]]
        for parent in job["depends_on"]:
            assert times[ids[parent]][1] <= started, (parent, job["ref"])
