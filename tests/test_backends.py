"""Database backend profiles (docs/how-to/backends.md): pg-boss 12.38's names and flag sets,
their refusals, and each followed runtime flag forced on stock PostgreSQL, as pg-boss's own
suite forces them with its ``__test__`` options."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import Engine, Select, func, literal, select
from sqlalchemy.orm import Session
from support.direct import in_tx, rows
from support.node import INTEROP46_DIR, node46, node46_modules, node_url
from support.schemas import libpq_url, random_schema, throwaway
from support.worker import wait_for

from alkstore_sa import (
    Backend,
    InvalidOptionsError,
    QueueService,
    SchemaFeatureError,
    SchemaProfileError,
    SchemaVersionError,
    Settlement,
    Worker,
    backends,
)
from alkstore_sa.cli import main
from alkstore_sa.names import schema_key
from alkstore_sa.ops import Context
from alkstore_sa.ops.duties46 import backoff_turn
from alkstore_sa.ops.frame import Tally
from alkstore_sa.sql.common.base import advisory_key
from alkstore_sa.sql.statements import statements_for
from alkstore_sa.sql.v46.fail import SplitFail
from alkstore_sa.supervision import Supervisor

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below

NO_SKIP_LOCKED = Backend("postgres", frozenset({"noSkipLocked"}))
NO_LISTEN = Backend("postgres", frozenset({"noListenNotify"}))
NO_LOCKS = Backend("postgres", frozenset({"noAdvisoryLocks"}))


# ------------------------------------------------------------ the profiles are pg-boss's


def _pgboss_profiles() -> tuple[tuple[str, ...], dict[str, frozenset[str]]]:
    """``COMPATIBILITY_FLAGS`` and ``BACKEND_PROFILES`` as pg-boss 12.38 ships them."""
    source = (INTEROP46_DIR / "node_modules" / "pg-boss" / "dist" / "attorney.js").read_text()
    source = re.sub(r"//[^\n]*", "", source)
    flags_block = source.split("const COMPATIBILITY_FLAGS = [", 1)[1].split("]", 1)[0]
    flags = tuple(re.findall(r"'(\w+)'", flags_block))
    block = source.split("const BACKEND_PROFILES = {", 1)[1].split("\n};", 1)[0]
    profiles = {
        name: frozenset(re.findall(r"(\w+): true", body))
        for name, body in re.findall(r"(\w+): \{\s*kind: '\w+',\s*flags: \{([^}]*)\}", block)
    }
    return flags, profiles


def test_every_profile_and_flag_is_pg_boss_12_38s(node46_modules: None) -> None:
    flags, profiles = _pgboss_profiles()
    assert len(profiles) == 5 and len(flags) == 13  # the parse found them all
    assert tuple(backends.FLAGS) == flags
    assert {name: frozenset(flags) for name, flags in backends.PROFILES.items()} == profiles
    for flags in backends.PROFILES.values():  # listed in pg-boss's order
        assert list(flags) == [f for f in backends.FLAGS if f in flags]


# ------------------------------------------------------------------- refusals


def test_an_unknown_backend_is_refused_with_the_names(engine: Engine, schema46: str) -> None:
    with Session(engine) as session, pytest.raises(InvalidOptionsError) as refused:
        QueueService(session, schema=schema46, backend="oracle")
    said = str(refused.value)
    assert "'oracle'" in said and "postgres, cockroachdb, yugabytedb, citus, pglite" in said


def test_cockroachdb_sets_every_flag_and_its_dialect_settles_it() -> None:
    profile = backends.resolve("cockroachdb")
    assert profile.flags == frozenset(backends.FLAGS)
    assert set(backends.FOLLOWED_FLAGS) | set(backends.SCHEMA_FLAGS) == set(backends.FLAGS)
    # The dialect of sqlalchemy-cockroachdb settles the profile, to the same answer.
    assert backends.resolve(None, dialect="cockroachdb") == profile
    with pytest.raises(InvalidOptionsError, match="that dialect is backend 'cockroachdb'"):
        backends.resolve("citus", dialect="cockroachdb")


def test_yugabytedb_is_deprecated_as_in_pg_boss() -> None:
    with pytest.warns(DeprecationWarning, match="yugabytedb"):
        profile = backends.resolve("yugabytedb")
    assert profile.has("noTablePartitioning") and not profile.has("noSkipLocked")


def test_forced_flags_must_be_pg_boss_flags() -> None:
    with pytest.raises(InvalidOptionsError, match="unknown flags noSuchThing"):
        backends.resolve(Backend("postgres", frozenset({"noSuchThing"})))
    with pytest.raises(KeyError):
        NO_LISTEN.has("noSuchThing")


def test_a_flagged_profile_on_a_schema_at_26_is_refused_before_any_sql(
    engine: Engine, schema: str
) -> None:
    with Session(engine) as session, session.begin():
        service = QueueService(session, schema=schema, backend=NO_SKIP_LOCKED)
        with pytest.raises(SchemaFeatureError) as refused:
            service.fetch("q")
        assert "backend 'postgres'" in str(refused.value) and refused.value.needed == 46
        # The caller's transaction is still usable.
        assert QueueService(session, schema=schema).get_queues() == []


@pytest.mark.parametrize("name", ["citus", "pglite", "postgres"])
def test_profiles_without_flags_work_as_postgres(name: str, engine: Engine, schema46: str) -> None:
    profile = backends.resolve(name)
    assert profile.name == name and profile.flags == frozenset()
    assert statements_for(46, profile.flags) is statements_for(46)  # the same statements
    with Session(engine) as session, session.begin():
        jobs = QueueService(session, schema=schema46, backend=name)
        jobs.create_queue("q")
        sent = jobs.send("q", {"n": 1})
    with Session(engine) as session, session.begin():
        [job] = QueueService(session, schema=schema46, backend=name).fetch("q")
    assert job.id == sent


def test_the_cli_takes_a_backend_and_refuses_an_unknown_one(
    database_url: str, schema46: str, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--database-url", database_url, "--schema", schema46]
    assert main(["queue", "ensure", "q", "--backend", "citus", *where]) == 0
    capsys.readouterr()
    assert main(["queue", "list", "--backend", "citrus", *where]) == 2
    assert "did you mean 'citus'" in capsys.readouterr().err


# ------------------------------------------------------------------- noSkipLocked


def _claim_sql(engine: Engine, flags: frozenset[str], policy: str) -> str:
    statement = statements_for(46, flags).claim(
        policy=policy, priority=True, ignore_start_after=False, relaxed=False, groups=None
    )
    assert isinstance(statement, Select)
    return str(statement.compile(dialect=engine.dialect))


@pytest.mark.parametrize("policy", ["standard", "singleton", "key_strict_fifo"])
def test_without_skip_locked_the_claim_takes_no_row_locks_and_rechecks_the_state(
    policy: str, engine: Engine
) -> None:
    plain = _claim_sql(engine, frozenset(), policy)
    flagged = _claim_sql(engine, NO_SKIP_LOCKED.flags, policy)
    assert "SKIP LOCKED" in plain and "SKIP LOCKED" not in flagged
    assert "FOR UPDATE" not in flagged
    assert "job.state < CAST('active'" in flagged and "job.state < CAST('active'" not in plain


@pytest.mark.parametrize("policy", ["standard", "singleton"])
def test_without_skip_locked_racing_fetchers_claim_each_job_once(
    policy: str, engine: Engine, schema46: str
) -> None:
    total, fetchers = 600, 6
    in_tx(engine, schema46, lambda q: q.create_queue("q", policy=policy))
    in_tx(
        engine,
        schema46,
        lambda q: q.send_many(
            "q", [{"data": {"n": n}, "singleton_key": f"k{n}"} for n in range(total)]
        ),
    )
    claimed: list[list[Any]] = [[] for _ in range(fetchers)]
    empty = [0] * fetchers
    start = threading.Barrier(fetchers, timeout=20)

    def fetcher(i: int) -> None:
        start.wait()
        while True:
            with Session(engine) as session, session.begin():
                got = QueueService(session, schema=schema46, backend=NO_SKIP_LOCKED).fetch("q", 10)
            if got:
                claimed[i] += [job.id for job in got]
                continue
            empty[i] += 1
            queued = rows(engine, schema46, "SELECT count(*) FROM {s}.job WHERE state = 'created'")
            if queued[0][0] == 0:
                return

    threads = [threading.Thread(target=fetcher, args=(i,)) for i in range(fetchers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    ids = [job_id for batch in claimed for job_id in batch]
    assert len(ids) == len(set(ids)) == total  # each job once, none lost
    assert sum(1 for batch in claimed if batch) > 1, "only one fetcher claimed: no race"


# ---------------------------------------------------------------- noListenNotify


def test_without_listen_notify_a_notify_queue_is_refused_before_any_sql(
    engine: Engine, schema46: str
) -> None:
    with Session(engine) as session, session.begin():
        jobs = QueueService(session, schema=schema46, backend=NO_LISTEN)
        with pytest.raises(InvalidOptionsError, match=r"option 'notify'.*noListenNotify"):
            jobs.create_queue("q", notify=True)
        jobs.create_queue("q")
        with pytest.raises(InvalidOptionsError, match="option 'notify'"):
            jobs.update_queue("q", notify=True)
        assert [q.notify for q in jobs.get_queues()] == [False]


def test_without_listen_notify_sends_announce_nothing_and_a_worker_polls(
    engine: Engine, database_url: str, schema46: str
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("q"))
    handled = threading.Event()
    worker = Worker(engine, schema=schema46, backend=NO_LISTEN, poll_interval=0.2, supervise=False)
    assert worker.listen is False
    worker.register("q", lambda job: handled.set())
    with psycopg.connect(libpq_url(database_url), autocommit=True) as listening:
        listening.execute(f'LISTEN "alkstore_{schema46}"')
        worker.start()
        try:
            with Session(engine) as session, session.begin():
                QueueService(session, schema=schema46, backend=NO_LISTEN).send("q", {"n": 1})
            assert handled.wait(5)  # by polling
            heard = list(listening.notifies(timeout=0.3, stop_after=1))
            listeners = rows(
                engine,
                schema46,
                "SELECT count(*) FROM pg_stat_activity WHERE query = :q",
                q=f'LISTEN "alkstore_{schema46}"',
            )
        finally:
            worker.stop()
    assert heard == []
    assert listeners[0][0] == 1  # this test's own connection only: the worker never listened


# ------------------------------------------------------- noReindex, noMonitorVacuum


def test_without_reindex_bloat_is_reported_and_nothing_is_rebuilt(
    engine: Engine, schema46: str, caplog: pytest.LogCaptureFixture
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("bloat"))
    fill = "INSERT INTO {s}.job (name) SELECT 'bloat' FROM generate_series(1, 60000)"
    rows(engine, schema46, fill)
    rows(engine, schema46, "DELETE FROM {s}.job WHERE name = 'bloat'")
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
            f'VACUUM ANALYZE "{schema46}".job_common'
        )
    size = "SELECT pg_relation_size(to_regclass(:i))"
    pkey = f'"{schema46}".job_common_pkey'
    before = rows(engine, schema46, size, i=pkey)[0][0]
    settings: dict[str, Any] = {"schedule": False, "bam": False, "flows": False}
    no_reindex = Backend("postgres", frozenset({"noReindex"}))
    caplog.set_level(logging.WARNING, "alkstore_sa")
    report = Supervisor(engine, schema=schema46, backend=no_reindex, **settings).run_once(
        force=True
    )
    assert report.reindexed == () and not report.errors
    assert rows(engine, schema46, size, i=pkey)[0][0] == before  # not rebuilt
    # The rebuild window is left to an instance that can rebuild.
    assert rows(engine, schema46, "SELECT reindex_on FROM {s}.version")[0][0] is None
    [said] = [
        r.getMessage()
        for r in caplog.records
        if getattr(r, "action", None) == "index_bloat" and "job_common_pkey" in r.getMessage()
    ]
    assert "does not rebuild indexes (noReindex)" in said


def test_without_vacuum_monitoring_the_monitor_backoff_is_never_taken() -> None:
    # No statement at all: the turn ends before asking the database anything.
    pinned = Tally()
    pinned.pinned.append(30.0)
    plain = backoff_turn(Context(schema="s"), None, pinned)  # type: ignore[arg-type]
    assert next(plain) is not None  # the backoff's statement, without the flag
    flagged = Context(schema="s", backend=Backend("postgres", frozenset({"noMonitorVacuum"})))
    with pytest.raises(StopIteration):
        next(backoff_turn(flagged, None, pinned))  # type: ignore[arg-type]


# ------------------------------------------------------------ noTransactionalHeartbeat


def test_without_transactional_heartbeats_such_a_job_fails_before_its_transaction(
    engine: Engine, schema46: str
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("beats", heartbeat_seconds=30, retry_limit=0))
    in_tx(engine, schema46, lambda q: q.create_queue("plain", retry_limit=0))
    ran: list[str] = []
    worker = Worker(
        engine,
        schema=schema46,
        backend=Backend("postgres", frozenset({"noTransactionalHeartbeat"})),
        supervise=False,
        poll_interval=0.2,
    )

    def handle(job: Any, session: Session) -> None:
        ran.append(job.name)

    worker.register("beats", handle, transactional=True)
    worker.register("plain", handle, transactional=True)
    with Session(engine) as session, session.begin():
        jobs = QueueService(session, schema=schema46)
        refused = jobs.send("beats", {"n": 1})
        kept = jobs.send("plain", {"n": 2})
    worker.start()
    try:
        wait_for(lambda: len(states(engine, schema46, refused, kept)) == 2, timeout=10)
    finally:
        worker.stop()
    assert ran == ["plain"]
    found = states(engine, schema46, refused, kept)
    assert found[kept][0] == "completed" and found[refused][0] == "failed"
    assert "noTransactionalHeartbeat" in found[refused][1]["message"]


def states(engine: Engine, schema: str, *ids: Any) -> dict[Any, tuple[str, Any]]:
    """The settled jobs among ``ids``: their state and output."""
    found = rows(
        engine,
        schema,
        "SELECT id, state, output FROM {s}.job WHERE id = ANY(:ids)"
        " AND state IN ('completed', 'failed')",
        ids=list(ids),
    )
    return {r.id: (r.state, r.output) for r in found}


def test_without_skip_locked_the_supervisor_waits_for_rows_instead_of_skipping_them(
    engine: Engine, schema46: str
) -> None:
    from alkstore_sa.sql.v46 import supervision, turns

    for made in (
        supervision.claim_monitor,
        supervision.claim_maintain,
        supervision.release_maintain,
        turns.resolve_flows,
    ):
        waits = str(made(skip_locked=False).compile(dialect=engine.dialect))
        skips = str(made().compile(dialect=engine.dialect))
        assert "SKIP LOCKED" in skips and "SKIP LOCKED" not in waits and "FOR " in waits
    # Queue claims skip only on stock PostgreSQL without the flag, as pg-boss decides.
    assert backends.queue_claims_skip_locked(backends.POSTGRES)
    assert not backends.queue_claims_skip_locked(backends.resolve("citus"))
    assert not backends.queue_claims_skip_locked(NO_SKIP_LOCKED)
    in_tx(engine, schema46, lambda q: q.create_queue("q"))
    report = Supervisor(engine, schema=schema46, backend=NO_SKIP_LOCKED, schedule=False).run_once(
        force=True
    )
    assert not report.errors and "q" in report.monitored and "q" in report.maintained


# ---------------------------------------------------------------- noAdvisoryLocks


@contextlib.contextmanager
def held(engine: Engine, schema: str, *keys: str) -> Iterator[None]:
    """Hold the advisory locks ``keys`` of ``schema`` (as another instance would)."""
    with engine.connect() as conn, conn.begin():
        for key in keys:
            name = literal(schema_key(schema) + key)
            conn.execute(select(func.pg_advisory_xact_lock(advisory_key(name))))
        yield


def _overdue_job(engine: Engine, schema: str) -> Any:
    """An active job of queue ``q`` whose lease ran out an hour ago."""
    in_tx(engine, schema, lambda q: q.create_queue("q", expire_seconds=60))
    job_id = in_tx(engine, schema, lambda q: q.send("q", {}))
    in_tx(engine, schema, lambda q: q.fetch("q"))
    rows(
        engine,
        schema,
        "UPDATE {s}.job SET started_on = now() - interval '1 hour' WHERE id = :id",
        id=job_id,
    )
    return job_id


@pytest.mark.parametrize("backend", [None, NO_LOCKS], ids=["locks", "noAdvisoryLocks"])
def test_without_advisory_locks_supervision_runs_steps_another_instance_holds(
    backend: Backend | None, engine: Engine, schema46: str
) -> None:
    job_id = _overdue_job(engine, schema46)
    expiry, stats = "job_commonfailJobsByTimeout", "queue-stats"
    with held(engine, schema46, expiry, stats), Session(engine) as session, session.begin():
        service = QueueService(session, schema=schema46, backend=backend)
        report = service.supervise(force=True)
    state = rows(engine, schema46, "SELECT state FROM {s}.job WHERE id = :id", id=job_id)[0][0]
    if backend is None:
        # Another instance holds the locks: the steps are its, and skipped here.
        assert state == "active" and any(expiry in busy for busy in report.busy)
        assert any(stats in busy for busy in report.busy)
    else:
        # No locks to hold (pg-boss's noAdvisoryLocks): each step runs in every pass.
        assert state == "retry" and report.busy == () and report.expired == {"q": 1}


@pytest.mark.parametrize("backend", [None, NO_LOCKS], ids=["locks", "noAdvisoryLocks"])
def test_without_advisory_locks_a_singleton_claim_takes_keys_without_locking_them(
    backend: Backend | None, engine: Engine, schema46: str
) -> None:
    in_tx(engine, schema46, lambda q: q.create_queue("q", policy="singleton"))
    in_tx(engine, schema46, lambda q: q.send("q", {}, singleton_key="k"))
    statements = statements_for(46, frozenset() if backend is None else backend.flags)
    assert statements.takes_key_locks("singleton") is (backend is None)
    assert statements.takes_group_locks() is (backend is None)
    # Another fetcher of ours holds the key's lock in its open transaction.
    lock = statements_for(46).lock_keys(policy="singleton", priority=True, ignore_start_after=False)
    translated = engine.execution_options(schema_translate_map={"pgboss": schema46})
    with translated.connect() as other, other.begin():
        params = {
            "qname": "q",
            "cached_policy": "singleton",
            "limit": 1,
            "lock_schema": schema_key(schema46),
        }
        assert other.execute(lock, params).scalars().all() == ["k"]
        with Session(engine) as session, session.begin():
            got = QueueService(session, schema=schema46, backend=backend).fetch("q")
    # With locks the key is left to the fetcher holding it; without, nothing is held.
    assert len(got) == (0 if backend is None else 1)


def test_without_advisory_locks_racing_singleton_fetchers_never_run_a_key_twice(
    engine: Engine, schema46: str
) -> None:
    """Activations collide on the key's unique index instead: the loser's claim is
    empty, its transaction still usable, and no key is active twice."""
    keys, per_key, fetchers = 20, 5, 6
    in_tx(engine, schema46, lambda q: q.create_queue("q", policy="singleton"))
    in_tx(
        engine,
        schema46,
        lambda q: q.send_many(
            "q", [{"data": {}, "singleton_key": f"k{n % keys}"} for n in range(keys * per_key)]
        ),
    )
    done: list[Any] = []
    errors: list[BaseException] = []
    start = threading.Barrier(fetchers, timeout=20)

    def fetcher() -> None:
        start.wait()
        try:
            for _ in range(200):
                with Session(engine) as session, session.begin():
                    service = QueueService(session, schema=schema46, backend=NO_LOCKS)
                    got = service.fetch("q", 4)
                    for job in got:
                        service.complete("q", job.id)
                    done.extend(job.id for job in got)
                if len(done) >= keys * per_key:
                    return
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=fetcher) for _ in range(fetchers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len(done) == len(set(done)) == keys * per_key  # each once, none lost


# ---------------------------------------------------------------- noMultiMutationCte
# Every fail and expiry of tests/test_runtime46_fail.py runs split as well.

SPLIT = Backend("postgres", frozenset({"noMultiMutationCte"}))

_MUTATION = re.compile(r"\b(?:INSERT INTO|DELETE FROM) (\S+)|\bUPDATE (\S+)(?: AS \S+)? SET\b")


def _changed(statement: Any, engine: Engine) -> list[str]:
    """The tables ``statement`` changes, once per change."""
    found = _MUTATION.findall(str(statement.compile(dialect=engine.dialect)))
    return [changed or updated for changed, updated in found]


def test_without_multi_mutation_ctes_no_statement_changes_a_table_twice(engine: Engine) -> None:
    """What pg-boss splits under the flag: fail (by id, poison, both expiries), flow
    resolution and redrive; and the stats aggregate, whose claim hand-back only
    exists with advisory locks (the profile with this flag has none)."""
    from alkstore_sa.sql.v46 import redrive, supervision, turns

    one = statements_for(46)
    split = statements_for(46, SPLIT.flags)
    fails: list[Any] = [
        lambda s: s.fail_jobs(),
        lambda s: s.fail_poison(),
        lambda s: s.expire_jobs(heartbeat=False),
        lambda s: s.expire_jobs(heartbeat=True),
    ]
    for made in fails:
        whole = _changed(made(one), engine)
        assert len(whole) > len(set(whole))  # the one statement changes job thrice
        steps = made(split)
        assert isinstance(steps, SplitFail)
        for step in (steps.pick, steps.remove, steps.retry, steps.fail, steps.dead_letter):
            assert len(_changed(step, engine)) <= 1
    pairs = [
        (turns.resolve_flows(), turns.resolve_flows_split()),
        (redrive.redrive_jobs(), redrive.redrive_split()),
    ]
    for whole_statement, steps in pairs:
        whole = _changed(whole_statement, engine)
        assert len(whole) > len(set(whole))
        for step in _fields(steps):
            assert len(_changed(step, engine)) <= 1
    stats = _changed(supervision.cache_stats(), engine)
    assert (
        len(stats) == 2 and _changed(supervision.cache_stats(advisory=False), engine) == stats[:1]
    )


def _fields(steps: Any) -> list[Any]:
    return [getattr(steps, f.name) for f in dataclasses.fields(steps)]


def test_without_multi_mutation_ctes_expiry_leaves_the_same_id_in_another_queue_alone(
    engine: Engine, schema46: str
) -> None:
    """Ids can be given, so one id may name a job in each of two queues: the separate
    statements of a fail address the rows they picked by queue and id together."""
    job_id = uuid.uuid4()

    def active_in(q: QueueService, queue: str) -> None:
        q.create_queue(queue, expire_seconds=60)
        q.send(queue, {}, id=job_id)

    for queue in ("a", "b"):
        in_tx(engine, schema46, functools.partial(active_in, queue=queue))
        in_tx(engine, schema46, functools.partial(QueueService.fetch, name=queue))
    rows(
        engine,
        schema46,
        "UPDATE {s}.job SET started_on = now() - interval '1 hour' WHERE name = 'a'",
    )
    with Session(engine) as session, session.begin():
        report = QueueService(session, schema=schema46, backend=SPLIT).supervise(force=True)
    assert report.expired == {"a": 1}
    found = rows(engine, schema46, "SELECT name, state FROM {s}.job WHERE id = :i", i=job_id)
    assert sorted(tuple(r) for r in found) == [("a", "retry"), ("b", "active")]


def test_without_multi_mutation_ctes_a_stately_retry_whose_slot_is_taken_fails_for_good(
    engine: Engine, schema46: str
) -> None:
    def tx(fn: Any) -> Any:
        with Session(engine) as session, session.begin():
            return fn(QueueService(session, schema=schema46, backend=SPLIT))

    tx(lambda q: q.create_queue("dlq"))
    tx(
        lambda q: q.create_queue(
            "q", policy="stately", retry_limit=3, retry_delay=3600, dead_letter="dlq"
        )
    )
    first = tx(lambda q: q.send("q", "first", singleton_key="k"))
    tx(lambda q: q.fetch("q"))
    tx(lambda q: q.fail("q", first))  # first waits in `retry` for an hour
    second = tx(lambda q: q.send("q", "second", singleton_key="k"))
    assert [job.id for job in tx(lambda q: q.fetch("q"))] == [second]
    result = tx(lambda q: q.fail_many("q", [Settlement(second)]))
    # The retry insert skipped it (the slot is first's), so the second insert failed it.
    assert result.states == {second: "failed"} and result.dead_lettered == 1
    assert rows(engine, schema46, "SELECT data FROM {s}.job WHERE name = 'dlq'") == [("second",)]
    assert len(rows(engine, schema46, "SELECT 1 FROM {s}.job WHERE name = 'q'")) == 2


# ---------------------------------------------------------------- the schema's profile


def test_a_schema_with_a_plain_job_table_is_refused_naming_what_differs(engine: Engine) -> None:
    """The shape pg-boss builds under noTablePartitioning (the version row and a plain
    ``job`` table are all the check reads; the Node test below installs the real one)."""
    name = random_schema()
    with throwaway(engine, name):
        for statement in (
            "CREATE SCHEMA {s}",
            "CREATE TABLE {s}.version (version int)",
            "INSERT INTO {s}.version VALUES (46)",
            "CREATE TABLE {s}.job (id uuid)",
        ):
            rows(engine, name, statement)
        with Session(engine) as session, session.begin():
            with pytest.raises(SchemaProfileError) as refused:
                QueueService(session, schema=name).get_queues()
            said = str(refused.value)
            assert "plain table" in said and "noTablePartitioning" in said
            assert "backend 'postgres'" in said and refused.value.found == 46
            # A SchemaVersionError: workers and supervisors report it and look again.
            assert isinstance(refused.value, SchemaVersionError)
            assert session.execute(select(literal(1))).scalar_one() == 1  # still usable


@pytest.mark.filterwarnings("ignore:backend 'yugabytedb' is deprecated")
def test_a_schema_node_built_for_yugabytedb_is_refused_but_under_its_profile(
    engine: Engine, node46: Any
) -> None:
    name = random_schema()
    with throwaway(engine, name):
        node46(name, backend="yugabytedb").call("createQueue", "q", {})
        kind = rows(
            engine, name, "SELECT relkind::text FROM pg_class WHERE oid = '{s}.job'::regclass"
        )
        assert kind == [("r",)]  # pg-boss's plain job table
        with (
            Session(engine) as session,
            session.begin(),
            pytest.raises(SchemaProfileError, match="plain table"),
        ):
            QueueService(session, schema=name).send("q", {})
        assert rows(engine, name, "SELECT count(*) FROM {s}.job")[0][0] == 0
        with Session(engine) as session, session.begin():
            assert QueueService(session, schema=name, backend="yugabytedb").send("q", {})
        assert rows(engine, name, "SELECT count(*) FROM {s}.job")[0][0] == 1
