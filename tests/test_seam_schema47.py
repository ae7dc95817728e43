"""The version seam, proven with a pretend schema 47 (``support.schema47``).

47 is 46 plus one column, with completion changed to write it. It is plugged in
through the seam alone (a statement set registered for 47, and 47 among the
spoken versions), and a slice of the service, worker and supervision tests of 46
runs again on a schema at 47: they are imported below, so pytest collects them
here too, and the ``schema46`` fixture of this module hands them a schema at 47.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from support.schema47 import COMPLETED_BY, VERSION, Statements47, migrate_46_to_47, speak_47
from support.schemas import install
from support.worker import Harness, send, state_of, wait_for

# The slice of 46's suite that runs again at 47 (each name is a test of its module).
from test_runtime46_fail import (  # noqa: F401
    test_dead_letter_copy_takes_the_queue_settings_and_records_provenance,
    test_expire_fails_jobs_past_their_lease_with_the_timeout_output,
    test_fail_many_reports_retry_and_failed_states,
)
from test_runtime46_jobs import (  # noqa: F401
    test_a_stale_fenced_complete_changes_nothing_at_46,
    test_cancel_and_resume_move_a_passed_start_after_up_and_clear_upsert_by_key,
    test_deleting_and_resuming_counted_jobs_lowers_the_queues_counts,
    test_every_policy_follows_the_policy_table_at_46,
    test_fetch_activates_and_stamps_started_on_and_heartbeat_on,
    test_get_job_and_list_jobs_read_the_columns_of_46,
)
from test_runtime46_supervision import (  # noqa: F401
    test_expiry_by_lease_and_by_heartbeat_in_the_same_monitor_turn,
    test_maintenance_deletes_what_is_due_keeps_deletion_zero_and_counts_what_it_kept,
    test_monitor_counts_blocked_apart_and_stamps_monitor_on_with_the_counts,
)
from test_worker_46 import (  # noqa: F401
    test_a_notification_on_node_channel_wakes_an_idle_worker_at_46,
)

from alkstore_sa import QueueService, names
from alkstore_sa.ops import Context
from alkstore_sa.sql.statements import Statements46, statements_for


@pytest.fixture
def spoken47(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """47 is spoken and has its statement set, for this test only."""
    monkeypatch.setattr(names, "SPOKEN_SCHEMA_VERSIONS", names.SPOKEN_SCHEMA_VERSIONS | {VERSION})
    undo = speak_47()
    yield
    undo()


@pytest.fixture
def schema46(engine: Engine, database_url: str, spoken47: None) -> Iterator[str]:
    """In this module, the tests of 46 get a schema at 47."""
    from support.schemas import drop_schema, random_schema

    name = random_schema()
    install(database_url, name, 46)
    migrate_46_to_47(engine, name)
    yield name
    drop_schema(engine, name)


@contextlib.contextmanager
def _service(engine: Engine, schema: str) -> Iterator[QueueService]:
    with Session(engine) as session, session.begin():
        yield QueueService(session, schema=schema)


def _version(engine: Engine, schema: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text(f'SELECT version FROM "{schema}".version')).scalar_one())


def test_the_schema_is_at_47_and_speaks_47s_set(engine: Engine, schema46: str) -> None:
    assert _version(engine, schema46) == VERSION
    with _service(engine, schema46) as svc:
        svc.create_queue("q")
    ctx = Context(schema46, version=VERSION)
    assert isinstance(ctx.sql, Statements47)
    # What 47 did not change it takes from 46, and 47 has every feature of 46.
    assert type(ctx.sql).fail_jobs is Statements46.fail_jobs
    assert ctx.has("flow") and ctx.has("key_strict_fifo")


def test_completing_at_47_runs_47s_statement(engine: Engine, schema46: str) -> None:
    with _service(engine, schema46) as svc:
        svc.create_queue("q")
        job_id = svc.send("q", {"n": 1})
        (job,) = svc.fetch("q")
        assert job.id == job_id
        svc.complete("q", job)
    with engine.connect() as conn:
        row = conn.execute(
            text(f'SELECT state, completed_by FROM "{schema46}".job WHERE id = :id'),
            {"id": job_id},
        ).one()
    assert tuple(row) == ("completed", COMPLETED_BY)


def test_a_worker_completes_through_47s_statement(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("w"))
    job_id = send(h, "w", {"n": 1})
    w = h.start(h.worker(poll_interval=0.05, handlers={"w": h.handler()}))
    wait_for(lambda: state_of(h, "w", job_id) == "completed")
    h.stop(w)
    rows = h.sql("SELECT completed_by FROM {s}.job WHERE id = :id", id=job_id)
    assert [r.completed_by for r in rows] == [COMPLETED_BY]


def test_a_schema_at_46_keeps_46s_statements(
    engine: Engine, database_url: str, spoken47: None
) -> None:
    from support.schemas import drop_schema, random_schema

    name = random_schema()
    install(database_url, name, 46)
    try:
        assert type(statements_for(46)) is Statements46
        with _service(engine, name) as svc:
            svc.create_queue("q")
            svc.send("q", {})
            (job,) = svc.fetch("q")
            # 46's statement names no completed_by column, which 46 does not have.
            assert svc.complete("q", job).affected == [job.id]
    finally:
        drop_schema(engine, name)


def test_without_47_registered_a_schema_at_47_uses_46s_set() -> None:
    assert type(statements_for(VERSION)) is Statements46
