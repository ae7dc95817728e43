"""alkstore_sa.testing: assertions on queued jobs, drain, inline mode."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.orm import Session

from alkstore_sa import AsyncWorker, QueueService, Worker
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.records import Job
from alkstore_sa.testing import (
    InlineQueueService,
    adrain,
    assert_enqueued,
    drain,
    refute_enqueued,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture
def session(engine: Engine, schema: str) -> Iterator[Session]:
    """A test transaction that is rolled back at the end, with queues q and dlq."""
    with Session(engine) as s:
        s.begin()
        svc = QueueService(s, schema=schema)
        svc.create_queue("dlq")
        svc.create_queue("q", retry_limit=1, dead_letter="dlq")
        yield s
        s.rollback()


def committed(engine: Engine, schema: str, fn: Any) -> Any:
    with Session(engine) as s, s.begin():
        return fn(QueueService(s, schema=schema))


# ------------------------------------------------------------ assertions


def test_assert_enqueued_sees_jobs_of_the_uncommitted_test_transaction(
    session: Session, schema: str
) -> None:
    QueueService(session, schema=schema).send("q", {"to": "ada", "lang": "en"})
    [job] = assert_enqueued(session, "q", data={"to": "ada"}, schema=schema)
    assert job.data == {"to": "ada", "lang": "en"}


def test_assert_enqueued_fails_with_what_is_queued_instead(session: Session, schema: str) -> None:
    QueueService(session, schema=schema).send("q", {"to": "bob"})
    with pytest.raises(AssertionError, match=r"no job queued in 'q'.*\{'to': 'bob'\}"):
        assert_enqueued(session, "q", data={"to": "ada"}, schema=schema)


def test_assert_enqueued_checks_an_exact_count(session: Session, schema: str) -> None:
    svc = QueueService(session, schema=schema)
    svc.send("q", {"n": 1})
    svc.send("q", {"n": 1})
    assert len(assert_enqueued(svc, "q", data={"n": 1}, count=2)) == 2
    with pytest.raises(AssertionError, match="expected 1 job"):
        assert_enqueued(svc, "q", data={"n": 1}, count=1)


def test_active_and_finished_jobs_are_not_enqueued(
    engine: Engine, schema: str, session: Session
) -> None:
    session.commit()  # the queues, for the committed transactions below
    first = committed(engine, schema, lambda q: q.send("q", "x"))
    assert_enqueued(engine, "q", data="x", schema=schema)
    [active] = committed(engine, schema, lambda q: q.fetch("q"))
    assert active.id == first
    refute_enqueued(engine, "q", schema=schema)  # active
    committed(engine, schema, lambda q: q.complete("q", first))
    second = committed(engine, schema, lambda q: q.send("q", "y"))
    [job] = committed(engine, schema, lambda q: q.fetch("q"))
    assert job.id == second
    committed(engine, schema, lambda q: q.cancel("q", second))
    refute_enqueued(engine, "q", schema=schema)  # completed and cancelled


def test_refute_enqueued_fails_when_a_matching_job_is_queued(session: Session, schema: str) -> None:
    QueueService(session, schema=schema).send("q", {"to": "ada"})
    refute_enqueued(session, "q", data={"to": "bob"}, schema=schema)
    with pytest.raises(AssertionError, match="expected no job"):
        refute_enqueued(session, "q", data={"to": "ada"}, schema=schema)


# ------------------------------------------------------------ drain


def test_drain_runs_every_queued_job_and_those_handlers_send(engine: Engine, schema: str) -> None:
    committed(engine, schema, lambda q: q.create_queue("a"))
    committed(engine, schema, lambda q: q.create_queue("b"))
    committed(engine, schema, lambda q: q.send_many("a", [{"data": 1}, {"data": 2}]))
    seen: list[Any] = []
    w = Worker(engine, schema=schema, supervise=False)

    @w.handler("a", transactional=True)
    def fan_out(job: Job, session: Session) -> None:
        QueueService(session, schema=schema).send("b", job.data * 10)

    w.register("b", lambda job: seen.append(job.data))
    result = drain(engine, w)
    assert (result.completed, result.failed) == (4, 0)
    assert sorted(seen) == [10, 20]
    refute_enqueued(engine, "a", schema=schema)


def test_drain_retries_a_failing_job_until_it_is_dead_lettered(engine: Engine, schema: str) -> None:
    committed(engine, schema, lambda q: q.create_queue("dlq"))
    committed(engine, schema, lambda q: q.create_queue("q", retry_limit=1, dead_letter="dlq"))
    job_id = committed(engine, schema, lambda q: q.send("q", "x"))

    def boom(job: Job) -> None:
        raise ValueError("nope")

    result = drain(engine, {"q": boom}, schema=schema)
    assert (result.completed, result.failed) == (0, 2)
    # One job, two attempts: the counts say which is which.
    assert (result.jobs_completed, result.jobs_failed, result.jobs_retrying) == (0, 1, 0)
    assert result.attempts_failed == 2
    assert [str(e) for _, e in result.errors] == ["nope", "nope"]
    job = committed(engine, schema, lambda q: q.get_job("q", job_id))
    assert job.state.value == "failed"
    assert_enqueued(engine, "dlq", data="x", count=1, schema=schema)


def test_drained_counts_jobs_and_attempts_apart(engine: Engine, schema: str) -> None:
    committed(engine, schema, lambda q: q.create_queue("flaky", retry_limit=2))
    committed(engine, schema, lambda q: q.create_queue("later", retry_limit=1, retry_delay=60))
    committed(engine, schema, lambda q: q.send("flaky", "x"))
    committed(engine, schema, lambda q: q.send("later", "y"))
    tries: list[str] = []

    def twice_then_ok(job: Job) -> None:
        tries.append(job.data)
        if len(tries) < 3:
            raise ValueError(f"try {len(tries)}")

    def boom(job: Job) -> None:
        raise ValueError("not yet")

    result = drain(engine, {"flaky": twice_then_ok, "later": boom}, schema=schema)
    # flaky: failed twice, then completed; later: failed once, its retry due in a minute.
    assert (result.jobs_completed, result.jobs_failed, result.jobs_retrying) == (1, 0, 1)
    assert (result.attempts_failed, result.failed, result.completed) == (3, 3, 1)
    assert sorted(str(e) for _, e in result.errors) == ["not yet", "try 1", "try 2"]


def test_drain_inside_a_test_transaction_leaves_nothing_behind(
    session: Session, schema: str, engine: Engine
) -> None:
    session.execute(text(f'CREATE TABLE "{schema}".seen (v int)'))
    QueueService(session, schema=schema).send("q", 7)

    def record(job: Job, s: Session) -> None:
        s.execute(text(f'INSERT INTO "{schema}".seen VALUES (:v)'), {"v": job.data})

    result = drain(session, {"q": _transactional(record)}, schema=schema)
    assert result.completed == 1
    assert session.execute(text(f'SELECT v FROM "{schema}".seen')).scalars().all() == [7]
    session.rollback()
    with engine.connect() as conn:
        assert conn.execute(text(f'SELECT count(*) FROM "{schema}".job')).scalar_one() == 0


def test_drain_leaves_jobs_deferred_to_the_future_unless_asked(engine: Engine, schema: str) -> None:
    committed(engine, schema, lambda q: q.create_queue("q"))
    committed(engine, schema, lambda q: q.send("q", "later", start_after=3600))
    assert drain(engine, {"q": lambda job: None}, schema=schema).completed == 0
    assert drain(engine, {"q": lambda job: None}, schema=schema, with_scheduled=True).completed == 1


def test_drain_refuses_async_handlers(engine: Engine, schema: str) -> None:
    async def handler(job: Job) -> None: ...

    with pytest.raises(InvalidOptionsError, match="adrain"):
        drain(engine, {"q": handler}, schema=schema)


async def test_adrain_runs_async_handlers(engine: Engine, schema: str, database_url: str) -> None:
    committed(engine, schema, lambda q: q.create_queue("q"))
    committed(engine, schema, lambda q: q.send_many("q", [{"data": i} for i in range(3)]))
    async_engine: AsyncEngine = create_async_engine(database_url)
    w = AsyncWorker(async_engine, schema=schema, supervise=False)
    seen: list[int] = []

    @w.handler("q")
    async def handle(job: Job) -> int:
        seen.append(job.data)
        return int(job.data)

    try:
        result = await adrain(async_engine, w)
    finally:
        await async_engine.dispose()
    assert result.completed == 3 and sorted(seen) == [0, 1, 2]


# ------------------------------------------------------------ inline


def test_inline_send_runs_the_handler_at_once_and_records_the_job() -> None:
    jobs = InlineQueueService({"emails": lambda job: f"sent to {job.data['to']}"})
    job_id = jobs.send("emails", {"to": "ada"}, priority=2)
    [job] = jobs.performed
    assert job.id == job_id and job.priority == 2
    assert job.state.value == "completed" and job.output == {"value": "sent to ada"}


def test_inline_handler_error_is_raised_and_the_job_recorded_as_failed() -> None:
    def boom(job: Job) -> None:
        raise RuntimeError("smtp down")

    jobs = InlineQueueService({"emails": boom})
    with pytest.raises(RuntimeError, match="smtp down"):
        jobs.send("emails", {})
    assert jobs.performed[0].state.value == "failed"
    assert jobs.performed[0].output["message"] == "smtp down"


def test_inline_send_validates_like_the_real_service() -> None:
    jobs = InlineQueueService({"emails": lambda job: None})
    with pytest.raises(InvalidOptionsError, match="no inline handler"):
        jobs.send("sms", {})
    with pytest.raises(InvalidOptionsError, match="priorty"):
        jobs.send("emails", {}, priorty=1)
    with pytest.raises(InvalidOptionsError, match="data"):
        jobs.send("emails", {"when": object()})
    assert jobs.performed == []


def test_inline_send_many_runs_each_job_in_order() -> None:
    seen: list[Any] = []
    jobs = InlineQueueService({"q": lambda job: seen.append(job.data)})
    ids = jobs.send_many("q", [{"data": 1}, {"data": 2, "priority": 5}])
    assert seen == [1, 2] and len(set(ids)) == 2 and all(isinstance(i, uuid.UUID) for i in ids)


def _transactional(fn: Any) -> Any:
    from alkstore_sa.worker import HandlerSpec

    return HandlerSpec("q", fn, transactional=True)


def test_drain_refuses_an_empty_schema_instead_of_using_the_default(engine: Engine) -> None:
    with pytest.raises(InvalidOptionsError, match="schema"):
        drain(engine, {"q": lambda job: None}, schema="")


async def test_adrain_refuses_an_empty_schema_instead_of_using_the_default(
    database_url: str,
) -> None:
    async def handler(job: Job) -> None:
        return None

    async_engine = create_async_engine(database_url)
    try:
        with pytest.raises(InvalidOptionsError, match="schema"):
            await adrain(async_engine, {"q": handler}, schema="")
    finally:
        await async_engine.dispose()
