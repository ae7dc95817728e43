"""The attempt history never stands in the way of a fail: a role that may not write
``alkstore_job_attempt``, a lock another session holds on it, a dropped table; the fail,
the worker's completions and supervision's expiry commit all the same, one WARNING says
what is missing, and ``db upgrade`` grants the table as the job table
(docs/concepts/attempt-history.md, "When the history cannot be written")."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.orm import Session
from support.schemas import random_schema, throwaway
from support.worker import Harness, wait_for

from alkstore_sa import QueueService, migrate
from alkstore_sa.limits import ATTEMPT_LOCK_WAIT_MS

WARNED = "attempt_history_unavailable"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@contextmanager
def app_role(engine: Engine, database_url: str, schema: str) -> Iterator[tuple[str, str]]:
    """A role granted DML on every table of ``schema`` but the attempt history (as one
    granted before an upgrade added it); yields ``(role, url connecting as it)``."""
    role = "alk_app_" + uuid.uuid4().hex[:10]
    s = _q(schema)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE ROLE {role} NOLOGIN"))
        conn.execute(text(f"GRANT USAGE ON SCHEMA {s} TO {role}"))
        conn.execute(
            text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {s} TO {role}")
        )
        conn.execute(text(f"REVOKE ALL ON {s}.alkstore_job_attempt FROM {role}"))
    url = make_url(database_url).update_query_dict({"options": f"-crole={role}"})
    try:
        yield role, url.render_as_string(hide_password=False)
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP OWNED BY {role}"))
            conn.execute(text(f"DROP ROLE {role}"))


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if getattr(r, "action", None) == WARNED]


def _count(engine: Engine, schema: str, sql: str, **params: Any) -> Any:
    with engine.begin() as conn:
        return conn.execute(text(sql.replace("{s}", _q(schema))), params).scalar_one()


def _settles_without_history(h: Harness, admin: Engine, caplog: pytest.LogCaptureFixture) -> None:
    """Queue ``f`` fails twice (two statements), queue ``c`` completes 20 jobs."""
    h.service_tx(lambda q: q.send_many("c", [{"data": {"n": n}} for n in range(20)]))
    first = h.service_tx(lambda q: q.send("f", {"n": 1}))

    def fail(job: Any) -> None:
        raise ValueError(f"no stock {job.data['n']}")

    w = h.worker(poll_interval=0.1)
    w.register("f", h.handler(fail))
    w.register("c", h.handler(lambda job: {"done": job.data["n"]}), concurrency=5)
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        h.start(w)
        wait_for(lambda: w.stats()["c"].completed == 20)
        wait_for(lambda: w.stats()["f"].failed == 1)
        second = h.service_tx(lambda q: q.send("f", {"n": 2}))
        wait_for(lambda: w.stats()["f"].failed == 2)
        h.stop(w)
    for job_id, n in ((first, 1), (second, 2)):
        job = h.job("f", job_id)
        assert job.state.value == "failed"
        assert job.output["message"] == f"no stock {n}"
    # Nothing was recorded, and it was said once, with how to mend it.
    assert _count(admin, h.schema, "SELECT count(*) FROM {s}.alkstore_job_attempt") == 0
    [warning] = _warnings(caplog)
    assert warning.levelno == logging.WARNING
    assert warning.reason == "privilege"  # type: ignore[attr-defined]
    grant = f"GRANT SELECT, INSERT, DELETE ON {_q(h.schema)}.alkstore_job_attempt TO "
    assert grant in warning.getMessage()
    assert warning.grant.startswith(grant)  # type: ignore[attr-defined]


@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("version", [26, 46])
def test_a_role_that_may_not_write_the_history_still_fails_and_completes(
    engine: Engine,
    database_url: str,
    schema: str,
    schema46: str,
    flavour: str,
    version: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = schema if version == 26 else schema46
    with Session(engine) as session, session.begin():
        jobs = QueueService(session, schema=name)
        jobs.create_queue("f", retry_limit=0)
        jobs.create_queue("c")
    with app_role(engine, database_url, name) as (role, url):
        role_engine = create_engine(url)
        h = Harness(flavour, role_engine, name, url)
        try:
            _settles_without_history(h, engine, caplog)
            # The role's own service fails as well, in its caller's transaction.
            job_id = h.service_tx(lambda q: q.send("f"))
            with Session(role_engine) as session, session.begin():
                jobs = QueueService(session, schema=name)
                [job] = jobs.fetch("f")
                jobs.fail("f", job, KeyError("by hand"))
                # The caller's transaction is usable after it.
                assert session.execute(text("SELECT current_user")).scalar_one() == role
            assert h.job("f", job_id).state.value == "failed"
        finally:
            h.close()
            role_engine.dispose()


def _expire_as(url: str, schema: str, engine: Engine) -> tuple[uuid.UUID, str]:
    role_engine = create_engine(url)
    try:
        with Session(role_engine) as session, session.begin():
            jobs = QueueService(session, schema=schema)
            job_id = jobs.send("x", expire_seconds=1)
            assert job_id is not None
        with Session(role_engine) as session, session.begin():
            [job] = QueueService(session, schema=schema).fetch("x")
        with engine.begin() as conn:  # its lease ran out a minute ago
            conn.execute(
                text(
                    f"UPDATE {_q(schema)}.job SET started_on = started_on - interval '1 minute' "
                    "WHERE id = :i"
                ),
                {"i": job.id},
            )
        with Session(role_engine) as session, session.begin():
            report = QueueService(session, schema=schema).supervise(force=True)
            assert not report.errors, report.errors
            state = QueueService(session, schema=schema).get_job("x", job_id)
        assert state is not None
        return job_id, state.state.value
    finally:
        role_engine.dispose()


@pytest.mark.parametrize("version", [26, 46])
def test_supervisions_expiry_works_for_a_role_that_may_not_write_the_history(
    engine: Engine,
    database_url: str,
    schema: str,
    schema46: str,
    version: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = schema if version == 26 else schema46
    with Session(engine) as session, session.begin():
        QueueService(session, schema=name).create_queue("x", retry_limit=0)
    with (
        app_role(engine, database_url, name) as (_, url),
        caplog.at_level(logging.WARNING, logger="alkstore_sa"),
    ):
        job_id, state = _expire_as(url, name, engine)
    assert state == "failed"
    with engine.begin() as conn:
        output = conn.execute(
            text(f"SELECT output FROM {_q(name)}.job WHERE id = :i"), {"i": job_id}
        ).scalar_one()
    assert output == {"value": {"message": "job timed out"}}
    assert [r.reason for r in _warnings(caplog)] == ["privilege"]  # type: ignore[attr-defined]


@contextmanager
def locked(engine: Engine, schema: str) -> Iterator[None]:
    """Another session holds ACCESS EXCLUSIVE on the attempt history meanwhile."""
    with engine.connect() as conn:
        conn.execute(text(f"LOCK TABLE {_q(schema)}.alkstore_job_attempt IN ACCESS EXCLUSIVE MODE"))
        try:
            yield
        finally:
            conn.rollback()


def _settles_under_a_lock(h: Harness, caplog: pytest.LogCaptureFixture) -> None:
    h.service_tx(lambda q: q.create_queue("f", retry_limit=0))
    h.service_tx(lambda q: q.create_queue("g", retry_limit=0))  # no worker's
    h.service_tx(lambda q: q.create_queue("c"))
    failing = h.service_tx(lambda q: q.send("f"))
    h.service_tx(lambda q: q.send_many("c", [{"data": n} for n in range(20)]))

    def fail(job: Any) -> None:
        raise ValueError("under a lock")

    w = h.worker(poll_interval=0.1)
    w.register("f", h.handler(fail))
    w.register("c", h.handler(), concurrency=5)
    with locked(h.engine, h.schema), caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        h.start(w)
        wait_for(lambda: w.stats()["c"].completed == 20, timeout=5)
        wait_for(lambda: h.job("f", failing).state.value == "failed", timeout=5)
        # A client's fail in its own transaction waits a bounded time, then goes on.
        client = h.service_tx(lambda q: q.send("g"))
        with Session(h.engine) as session, session.begin():
            jobs = QueueService(session, schema=h.schema)
            [job] = jobs.fetch("g")
            jobs.fail("g", job, ValueError("by hand"))
            # The caller's own lock_timeout is as it was.
            assert session.execute(text("SHOW lock_timeout")).scalar_one() == "0"
        assert h.job("g", client).state.value == "failed"
        h.stop(w)
    assert h.job("f", failing).output["message"] == "under a lock"
    reasons = [r.reason for r in _warnings(caplog)]  # type: ignore[attr-defined]
    assert reasons == ["lock"], reasons
    # The lock released, fails record their attempts again.
    again = h.service_tx(lambda q: q.send("g"))
    with Session(h.engine) as session, session.begin():
        jobs = QueueService(session, schema=h.schema)
        [job] = jobs.fetch("g")
        jobs.fail("g", job, ValueError("unlocked"))
    [attempt] = h.service_tx(lambda q: q.get_job_attempts("g", again))
    assert attempt.message == "unlocked"


def test_a_lock_on_the_history_stalls_no_settlement(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    _settles_under_a_lock(harness, caplog)


def test_a_lock_on_the_history_stalls_no_settlement_at_46(
    harness46: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    _settles_under_a_lock(harness46, caplog)


def test_the_client_fail_waits_for_the_lock_no_longer_than_the_bound(
    engine: Engine, schema: str
) -> None:
    with Session(engine) as session, session.begin():
        jobs = QueueService(session, schema=schema)
        jobs.create_queue("f", retry_limit=0)
        jobs.send("f")
    import time

    with locked(engine, schema), Session(engine) as session, session.begin():
        jobs = QueueService(session, schema=schema)
        [job] = jobs.fetch("f")
        began = time.monotonic()
        jobs.fail("f", job, ValueError("x"))
        took = time.monotonic() - began
    assert ATTEMPT_LOCK_WAIT_MS / 1000 * 0.8 <= took < ATTEMPT_LOCK_WAIT_MS / 1000 + 2


def test_a_dropped_history_table_fails_nothing(env: Any, caplog: pytest.LogCaptureFixture) -> None:
    _fails_without_the_table(env, caplog)


def test_a_dropped_history_table_fails_nothing_at_46_and_split(
    env46_or_split: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # "split": the fail's statements one table each (noMultiMutationCte), the attempts
    # recorded by statements of their own.
    _fails_without_the_table(env46_or_split, caplog)


def _fails_without_the_table(env: Any, caplog: pytest.LogCaptureFixture) -> None:
    env.tx(lambda q: q.create_queue("f", retry_limit=0))
    job_id = env.tx(lambda q: q.send("f"))
    [job] = env.tx(lambda q: q.fetch("f"))  # the service has read that the table is there
    env.sql("DROP TABLE {s}.alkstore_job_attempt")
    with caplog.at_level(logging.WARNING, logger="alkstore_sa"):
        env.tx(lambda q: q.fail("f", job, ValueError("table gone")))
    [(state, output)] = env.sql("SELECT state::text, output FROM {s}.job WHERE id = :i", i=job_id)
    assert state == "failed" and output["message"] == "table gone"
    assert [r.reason for r in _warnings(caplog)] == ["missing"]  # type: ignore[attr-defined]


def test_db_upgrade_grants_the_history_as_the_job_table(engine: Engine) -> None:
    name = random_schema()
    role = "alk_app_" + uuid.uuid4().hex[:10]
    with throwaway(engine, name):
        migrate.upgrade(engine, name, attempt_history=False)
        with engine.begin() as conn:
            conn.execute(text(f"CREATE ROLE {role} NOLOGIN"))
            conn.execute(text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {_q(name)}.job TO {role}"))
        try:
            assert migrate.upgrade(engine, name).attempt_history
            table = f"{_q(name)}.alkstore_job_attempt"
            with engine.begin() as conn:
                held = {
                    privilege: conn.execute(
                        text("SELECT has_table_privilege(:r, :t, :p)"),
                        {"r": role, "t": table, "p": privilege},
                    ).scalar_one()
                    for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE", "TRUNCATE")
                }
            assert held == {
                "SELECT": True,
                "INSERT": True,
                "UPDATE": True,
                "DELETE": True,
                "TRUNCATE": False,
            }
        finally:
            with engine.begin() as conn:
                conn.execute(text(f"DROP OWNED BY {role}"))
                conn.execute(text(f"DROP ROLE {role}"))
