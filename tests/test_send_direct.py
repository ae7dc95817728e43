"""The insert behind send and send_many on the psycopg connection of the caller's transaction.

``Call(direct=True)`` lets the driver run the insert on the DBAPI connection SQLAlchemy
hands out (``alkstore_sa/ops/_direct.py``), compiled once per schema: the job exists if
and only if the caller's transaction commits, a refused send leaves that transaction
usable, a database error is raised as SQLAlchemy would raise it, and with cursor-execute
listeners the statement runs through SQLAlchemy as before. Sync and async.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import Env
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import DBAPIError, InternalError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support.schemas import drop_schema, install, random_schema
from support.statements import recorded

from alkstore_sa import AsyncQueueService, JobSpec, QueueNotFoundError, QueueService, limits
from alkstore_sa import options as opt
from alkstore_sa.errors import InvalidOptionsError
from alkstore_sa.ops import _direct
from alkstore_sa.ops.sending import PLAIN_INSERT_JOBS, _fresh_ids, _job_arrays

BIG = PLAIN_INSERT_JOBS


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statements run on the driver connection (``sync`` / ``async``, with
    ``+savepoint`` for one run in a savepoint), one entry each."""
    ran: list[str] = []
    execute, aexecute = _direct.execute, _direct.aexecute

    def spy(*args: Any, **kwargs: Any) -> Any:
        ran.append("sync" + ("+savepoint" if kwargs.get("savepoint") else ""))
        return execute(*args, **kwargs)

    async def aspy(*args: Any, **kwargs: Any) -> Any:
        ran.append("async" + ("+savepoint" if kwargs.get("savepoint") else ""))
        return await aexecute(*args, **kwargs)

    monkeypatch.setattr(_direct, "execute", spy)
    monkeypatch.setattr(_direct, "aexecute", aspy)
    return ran


class VersionedEnv(Env):
    version: int


@pytest.fixture(
    params=[(26, "sync"), (26, "async"), (46, "sync"), (46, "async")],
    ids=["26-sync", "26-async", "46-sync", "46-async"],
)
def envv(
    request: pytest.FixtureRequest, engine: Engine, database_url: str, spoken46: None
) -> Iterator[VersionedEnv]:
    """The service at schema 26 and at 46, sync and async, with a queue ``q`` and a
    table ``orders`` for the caller's own writes."""
    version, flavour = request.param
    name = random_schema()
    install(database_url, name, version)
    chosen = VersionedEnv(flavour, engine, name, database_url)
    chosen.version = version
    try:
        chosen.sql("CREATE TABLE {s}.orders (n int)")
        chosen.tx(lambda q: q.create_queue("q"))
        yield chosen
    finally:
        chosen.close()
        drop_schema(engine, name)


def _jobs(env: Env) -> int:
    [(count,)] = env.sql("SELECT count(*) FROM {s}.job")
    return int(count)


def _orders(env: Env) -> int:
    [(count,)] = env.sql("SELECT count(*) FROM {s}.orders")
    return int(count)


def _order(env: Env, n: int) -> None:
    env.session.execute(text(f'INSERT INTO "{env.schema}".orders VALUES (:n)'), {"n": n})


def test_jobs_exist_once_the_callers_transaction_commits(
    envv: VersionedEnv, direct: list[str]
) -> None:
    svc = envv.service()
    _order(envv, 1)
    one = svc.send("q", {"n": 1})
    many = svc.send_many("q", [{"data": {"n": 2}}, {"data": None}, {"data": [3]}])
    assert direct == [envv.flavour] * 2
    # Not visible outside the caller's transaction before its commit...
    assert _jobs(envv) == 0
    envv.commit()
    # ...and all of them after, with the ids the calls returned.
    rows = envv.sql("SELECT id, data FROM {s}.job ORDER BY id")
    assert {r.id for r in rows} == {one, *many}
    assert sorted(json.dumps(r.data) for r in rows) == sorted(
        json.dumps(d) for d in ({"n": 1}, {"n": 2}, None, [3])
    )
    assert _orders(envv) == 1


def test_a_rolled_back_transaction_leaves_no_job(envv: VersionedEnv, direct: list[str]) -> None:
    svc = envv.service()
    _order(envv, 1)
    assert svc.send_many("q", [{"data": i} for i in range(50)]) != []
    assert svc.send("q", "x") is not None
    envv.rollback()
    assert direct == [envv.flavour] * 2
    assert _jobs(envv) == 0
    assert _orders(envv) == 0


def test_a_refused_send_leaves_the_callers_transaction_usable(
    envv: VersionedEnv, direct: list[str]
) -> None:
    svc = envv.service()
    _order(envv, 1)
    with pytest.raises(QueueNotFoundError):
        svc.send_many("missing", [{"data": 1}, {"data": 2}])
    with pytest.raises(InvalidOptionsError):
        svc.send_many("q", [{"data": 1}, {"data": float("nan")}])
    # At 26 the insert itself finds the queue missing (on the driver connection); at 46
    # the queue's policy is looked up first (key_strict_fifo), which finds it missing.
    assert direct == ([envv.flavour] if envv.version == 26 else [])
    job = svc.send("q", 7)
    _order(envv, 2)
    envv.commit()
    assert [r.id for r in envv.sql("SELECT id FROM {s}.job")] == [job]
    assert _orders(envv) == 2


def test_an_unkeyed_job_for_a_key_strict_fifo_queue_leaves_the_transaction_usable(
    env46: Env,
) -> None:
    env46.tx(lambda q: q.create_queue("fifo", policy="key_strict_fifo"))
    svc = env46.service()
    with pytest.raises(InvalidOptionsError, match="key_strict_fifo"):
        svc.send_many("fifo", [{"data": 1, "singleton_key": "a"}, {"data": 2}])
    assert svc.send_many("fifo", [{"data": 1, "singleton_key": "a"}]) != [None]
    env46.commit()
    assert [r.singleton_key for r in env46.sql("SELECT singleton_key FROM {s}.job")] == ["a"]


def test_jobs_skipped_on_a_unique_index_come_back_as_none(
    envv: VersionedEnv, direct: list[str]
) -> None:
    envv.tx(lambda q: q.create_queue("s", policy="short"))
    taken = uuid.uuid4()
    got = envv.tx(
        lambda q: q.send_many(
            "s", [{"data": 1, "id": taken}, {"data": 2}, {"data": 3, "id": taken}]
        )
    )
    # short: one created job per queue (and key), so only the first goes in.
    assert got == [taken, None, None]
    again = envv.tx(lambda q: q.send_many("q", [{"data": 1, "id": taken}, {"data": 2}]))
    assert again[0] == taken and again[1] is not None
    assert direct == [envv.flavour] * 2


def test_a_database_error_is_raised_as_sqlalchemy_raises_it(
    envv: VersionedEnv, engine: Engine, direct: list[str]
) -> None:
    seen: list[str | None] = []

    def handle_error(context: Any) -> None:
        seen.append(getattr(context.original_exception, "sqlstate", None))

    target = engine if envv.async_engine is None else envv.async_engine.sync_engine
    event.listen(target, "handle_error", handle_error)
    try:
        svc = envv.service()
        envv.session.execute(text("SET TRANSACTION READ ONLY"))
        with pytest.raises(InternalError) as raised:
            svc.send("q", 1)
    finally:
        event.remove(target, "handle_error", handle_error)
        envv.rollback()
    assert isinstance(raised.value, DBAPIError)
    assert getattr(raised.value.orig, "sqlstate", None) == "25006"  # read_only_sql_transaction
    assert "INSERT INTO" in str(raised.value.statement)
    # An engine with handle_error listeners: the insert steps aside, so they run.
    assert direct == []
    assert seen == ["25006"]
    # The session recovers as after any failed statement: roll back, carry on.
    assert envv.tx(lambda q: q.send("q", 2)) is not None


def test_with_cursor_listeners_the_insert_runs_through_sqlalchemy(
    envv: VersionedEnv, engine: Engine, direct: list[str]
) -> None:
    target = engine if envv.async_engine is None else envv.async_engine.sync_engine
    with recorded(target) as seen:
        ids = envv.tx(lambda q: q.send_many("q", [{"data": 1}, {"data": 2}]))
    assert direct == []
    assert sum("INSERT INTO" in s for s in seen) == 1
    assert None not in ids and _jobs(envv) == 2


def test_each_schema_gets_its_own_compiled_statement(
    engine: Engine, schema: str, database_url: str, direct: list[str]
) -> None:
    other = random_schema()
    install(database_url, other, 26)
    try:
        sent: dict[str, list[Any]] = {schema: [], other: []}
        for name in (schema, other):
            with Session(engine) as session, session.begin():
                QueueService(session, schema=name).create_queue("q")
        for name in (schema, other, schema):
            with Session(engine) as session, session.begin():
                sent[name].append(QueueService(session, schema=name).send("q", name))
        for name in (schema, other):
            with engine.connect() as conn:
                rows = conn.execute(text(f'SELECT id, data FROM "{name}".job')).all()
            assert {r.id for r in rows} == set(sent[name])
            assert {r.data for r in rows} == {name}
        assert direct == ["sync"] * 3
    finally:
        drop_schema(engine, other)


def test_a_sync_service_under_run_sync_runs_through_sqlalchemy(
    engine: Engine, schema: str, database_url: str, direct: list[str]
) -> None:
    # AsyncSession.run_sync hands a sync Session over psycopg's AsyncConnection: the
    # sync driver cannot await it, so SQLAlchemy runs the insert (in its greenlet).
    async def main() -> Any:
        aengine = create_async_engine(database_url)
        try:
            async with AsyncSession(aengine) as session, session.begin():
                return await session.run_sync(
                    lambda s: QueueService(s, schema=schema).send_many(
                        "q", [{"data": i} for i in range(BIG)]
                    )
                )
        finally:
            await aengine.dispose()

    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema).create_queue("q")
    direct.clear()
    ids = asyncio.run(main())
    assert direct == [] and len(ids) == BIG and None not in ids
    with engine.connect() as conn:
        count = conn.execute(text(f'SELECT count(*) FROM "{schema}".job')).scalar_one()
    assert count == BIG


# ------------------------------------------------- large batches without ON CONFLICT


def _sync_engine(env: Env) -> Engine:
    return env.engine if env.async_engine is None else env.async_engine.sync_engine


def test_a_large_batch_goes_in_without_on_conflict_in_a_savepoint(envv: VersionedEnv) -> None:
    envv.tx(lambda q: q.send("q", 0))  # the queue's policy is now known (cached)
    with recorded(_sync_engine(envv)) as seen:
        ids = envv.tx(lambda q: q.send_many("q", [{"data": i} for i in range(BIG)]))
    inserts = [s for s in seen if "INSERT INTO" in s]
    assert len(inserts) == 1 and "ON CONFLICT" not in inserts[0]
    assert [s.split()[0] for s in seen if "INSERT INTO" not in s] == ["SAVEPOINT", "RELEASE"]
    assert None not in ids and _jobs(envv) == BIG + 1
    # One job fewer, or one with a key, and it is the usual statement.
    with recorded(_sync_engine(envv)) as seen:
        envv.tx(lambda q: q.send_many("q", [{"data": i} for i in range(BIG - 1)]))
        envv.tx(lambda q: q.send_many("q", [{"data": 1, "singleton_key": "k"}] * BIG))
    assert [("ON CONFLICT" in s) for s in seen if "INSERT INTO" in s] == [True, True]


def test_a_large_batch_runs_on_the_driver_connection_in_one_savepoint(
    envv: VersionedEnv, direct: list[str]
) -> None:
    envv.tx(lambda q: q.send("q", 0))
    svc = envv.service()
    _order(envv, 1)
    ids = svc.send_many("q", [{"data": i} for i in range(BIG)])
    envv.rollback()
    assert direct == [envv.flavour, envv.flavour + "+savepoint"]
    assert len(ids) == BIG and None not in ids
    assert _jobs(envv) == 1 and _orders(envv) == 0  # rolled back with the caller's transaction


@pytest.mark.parametrize("path", ["direct", "sqlalchemy"])
def test_a_unique_index_someone_added_still_skips_the_job(
    envv: VersionedEnv, path: str, direct: list[str]
) -> None:
    # Not one of ours: a user's own dedupe index on the job table.
    envv.sql("CREATE UNIQUE INDEX user_dedupe ON {s}.job_common ((data->>'k'))")
    envv.tx(lambda q: q.send("q", {"k": "first"}))
    jobs: list[JobSpec] = [{"data": {"k": str(i)}} for i in range(BIG)]
    jobs[20] = {"data": {"k": "10"}}  # a duplicate in the batch
    jobs[30] = {"data": {"k": "first"}}  # and one of an existing job
    svc = envv.service()
    _order(envv, 1)
    with recorded(_sync_engine(envv)) if path == "sqlalchemy" else _nothing():
        ids = svc.send_many("q", jobs)
    # Refused in the savepoint, rolled back, sent again with ON CONFLICT DO NOTHING:
    # the outcome is the one ON CONFLICT always gave, and the transaction goes on.
    assert [i for i, job_id in enumerate(ids) if job_id is None] == [20, 30]
    _order(envv, 2)
    envv.commit()
    assert _jobs(envv) == BIG - 1 and _orders(envv) == 2
    if path == "direct":
        assert direct == [envv.flavour, envv.flavour + "+savepoint", envv.flavour]


@pytest.mark.parametrize("size", [1, BIG])
def test_a_transaction_that_had_failed_raises_as_sqlalchemy_would(
    envv: VersionedEnv, size: int, direct: list[str]
) -> None:
    envv.tx(lambda q: q.send("q", 0))  # the policy is cached: BIG takes the savepoint path
    direct.clear()
    svc = envv.service()
    with pytest.raises(DBAPIError):
        envv.session.execute(text("SELECT 1 / 0"))
    with pytest.raises(DBAPIError) as raised:
        svc.send_many("q", [{"data": i} for i in range(size)])
    assert getattr(raised.value.orig, "sqlstate", None) == "25P02"  # in_failed_sql_transaction
    assert direct == [envv.flavour + ("+savepoint" if size == BIG else "")]
    envv.rollback()
    assert envv.tx(lambda q: q.send("q", 1)) is not None


def test_a_stale_cached_policy_gives_the_policys_outcome(
    envv: VersionedEnv, direct: list[str]
) -> None:
    from alkstore_sa._engine_cache import engine_state

    envv.tx(lambda q: q.create_queue("s", policy="short"))
    policies = engine_state(_sync_engine(envv)).policies
    policies.put(envv.schema, "s", "standard")  # as if "s" had been re-created since
    ids = envv.tx(lambda q: q.send_many("s", [{"data": i} for i in range(BIG)]))
    # short: one created job per queue; the rest are skipped, as always.
    assert ids[0] is not None and ids[1:] == [None] * (BIG - 1)
    assert _jobs(envv) == 1
    assert policies.get(envv.schema, "s") == "short"  # learnt from the insert


def test_a_large_batch_on_an_autocommit_session(envv: VersionedEnv, direct: list[str]) -> None:
    # No transaction, so no savepoint: each statement is its own transaction, and a
    # refused one ends only itself.
    envv.sql("CREATE UNIQUE INDEX user_dedupe ON {s}.job_common ((data->>'k'))")
    jobs: list[JobSpec] = [{"data": {"k": str(i % (BIG - 1))}} for i in range(BIG)]
    if envv.async_engine is None:
        engine = envv.engine.execution_options(isolation_level="AUTOCOMMIT")
        with Session(engine) as session:
            svc = QueueService(session, schema=envv.schema)
            svc.send("q", {"k": "warm"})
            ids = svc.send_many("q", jobs)
    else:
        aengine = envv.async_engine.execution_options(isolation_level="AUTOCOMMIT")

        async def send() -> list[Any]:
            async with AsyncSession(aengine) as session:
                svc = AsyncQueueService(session, schema=envv.schema)
                await svc.send("q", {"k": "warm"})
                return await svc.send_many("q", jobs)

        ids = envv.runner.run(send())
    assert ids[-1] is None and None not in ids[:-1]
    # The plain insert failed on its own (no SAVEPOINT outside a transaction, which
    # PostgreSQL would refuse) and the batch went again with ON CONFLICT.
    assert direct == [envv.flavour, envv.flavour + "+savepoint", envv.flavour]
    assert _jobs(envv) == BIG


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ------------------------------------------------------------------ without a database


def test_fresh_ids_are_ascending_version_7_uuids_and_their_text() -> None:
    ids, literal = _fresh_ids(200)
    assert ids == sorted(ids) and len(set(ids)) == 200
    assert all(isinstance(i, uuid.UUID) and i.version == 7 for i in ids)
    assert all(i.variant == uuid.RFC_4122 for i in ids)
    assert all(i == uuid.UUID(str(i)) and hash(i) == hash(uuid.UUID(str(i))) for i in ids)
    assert literal == "{" + ",".join(i.hex for i in ids) + "}"
    assert _fresh_ids(0) == ([], "{}")


def test_a_batch_of_data_is_one_json_array_of_each_jobs_own_text() -> None:
    datas: list[Any] = [{"n": 1}, None, [1, {"a": "é"}], "text", 2.5, {"deep": [[[]]]}]
    whole = opt.encode_json_array(datas)
    each = [opt.encode_json("data", d) for d in datas]
    assert whole == "[" + ",".join("null" if t is None else t for t in each) + "]"
    arrays, ids = _job_arrays([{"data": d} for d in datas], 46)
    assert arrays == {"in_id": "{" + ",".join(i.hex for i in ids) + "}", "in_data": whole}


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (float("nan"), "cannot be encoded"),
        ({1, 2}, "cannot be encoded"),
        ("\x00", r"U\+0000"),
        ("\ud800", "surrogate"),
        ("x" * (1024 * 1024 + 1), "bytes as JSON"),
    ],
)
def test_a_refused_element_is_named_by_the_job_by_job_path(bad: Any, problem: str) -> None:
    datas: list[Any] = [{"n": 0}, bad]
    assert opt.encode_json_array(datas) is None
    with pytest.raises(InvalidOptionsError, match=problem) as raised:
        _job_arrays([{"data": d} for d in datas], 46)
    assert raised.value.option == "jobs[1].data"


def _nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_data_nested_past_the_limit_is_refused_by_the_batch_check() -> None:
    limit = limits.MAX_JSON_DEPTH
    at_limit, past = {"deep": _nested(limit - 1)}, {"deep": _nested(limit)}
    # As the job-by-job check has it: the object itself is one level.
    assert opt.encode_json("data", at_limit) is not None
    with pytest.raises(InvalidOptionsError):
        opt.encode_json("data", past)
    assert opt.encode_json_array([{"ok": 1}, at_limit]) is not None
    assert opt.encode_json_array([{"ok": 1}, past]) is None
    with pytest.raises(InvalidOptionsError, match="deeper than") as raised:
        _job_arrays([{"data": {"ok": 1}}, {"data": past}], 46)
    assert raised.value.option == "jobs[1].data"
