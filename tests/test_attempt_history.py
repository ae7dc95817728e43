"""The attempt history: every failed attempt kept in ``alkstore_job_attempt`` (ours),
written by the statement that fails it, bounded per job, swept with its job, read by
``get_job_attempts`` (docs/concepts/attempt-history.md)."""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session
from starlette.testclient import TestClient
from support.schemas import random_schema, throwaway
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa import (
    InvalidOptionsError,
    JobAttempt,
    QueueNotFoundError,
    QueueService,
    migrate,
)
from alkstore_sa._engine_cache import engine_state
from alkstore_sa.dashboard import create_app
from alkstore_sa.limits import ATTEMPTS_KEPT, MAX_ATTEMPT_ERROR_BYTES
from alkstore_sa.ops import attempts as attempts_ops


def fail_once(env: Any, queue: str, error: Any) -> uuid.UUID:
    """Claim the next job of ``queue`` (deferred or not) and fail it with ``error``."""
    [job] = env.tx(lambda q: q.fetch(queue, ignore_start_after=True))
    env.tx(lambda q: q.fail(queue, job, error))
    return job.id  # type: ignore[no-any-return]


def attempts(env: Any, queue: str, job_id: uuid.UUID) -> list[JobAttempt]:
    return env.tx(lambda q: q.get_job_attempts(queue, job_id))  # type: ignore[no-any-return]


def test_each_failed_attempt_is_kept_with_its_error_not_only_the_last(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q", retry_limit=3))
    job_id = env.tx(lambda q: q.send("q", {"n": 1}))
    for n in range(3):
        fail_once(env, "q", ValueError(f"no stock {n}"))
    found = attempts(env, "q", job_id)
    assert [(a.attempt, a.cause, a.message) for a in found] == [
        (1, "failed", "no stock 0"),
        (2, "failed", "no stock 1"),
        (3, "failed", "no stock 2"),
    ]
    first = found[0]
    assert first.job_id == job_id and first.name == "q"
    assert first.error_type == "ValueError"
    assert first.stack is not None and "ValueError: no stock 0" in first.stack
    assert first.started_on is not None and first.failed_on >= first.started_on
    assert first.worker is None and first.worker_id is None  # failed by a service call
    # The job row itself still holds only the last output, as pg-boss keeps it.
    [(output,)] = env.sql("SELECT output FROM {s}.job WHERE id = :i", i=job_id)
    assert output["message"] == "no stock 2"


def test_a_job_keeps_its_newest_attempts_only(env46_or_split: Any) -> None:
    env = env46_or_split
    env.tx(lambda q: q.create_queue("q", retry_limit=ATTEMPTS_KEPT + 10))
    job_id = env.tx(lambda q: q.send("q"))
    for n in range(ATTEMPTS_KEPT + 3):
        fail_once(env, "q", {"message": f"try {n}"})
    found = attempts(env, "q", job_id)
    assert len(found) == ATTEMPTS_KEPT
    assert [a.attempt for a in found] == list(range(4, ATTEMPTS_KEPT + 4))
    assert found[-1].message == f"try {ATTEMPTS_KEPT + 2}"


def test_failing_a_job_again_by_id_without_a_claim_stays_bounded(env46: Any) -> None:
    # No claim in between, so every attempt has the same number; still bounded.
    env46.tx(lambda q: q.create_queue("q", retry_limit=1000))
    job_id = env46.tx(lambda q: q.send("q"))
    for n in range(ATTEMPTS_KEPT + 2):
        env46.tx(lambda q, n=n: q.fail("q", job_id, {"message": f"again {n}"}))
    found = attempts(env46, "q", job_id)
    assert len(found) == ATTEMPTS_KEPT
    assert {a.attempt for a in found} == {1}
    assert found[-1].message == f"again {ATTEMPTS_KEPT + 1}"


def test_a_fail_rolled_back_leaves_no_attempt(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    job_id = env.tx(lambda q: q.send("q"))
    [job] = env.tx(lambda q: q.fetch("q"))
    svc = env.service()
    svc.fail("q", job, RuntimeError("undone"))
    assert [a.message for a in svc.get_job_attempts("q", job_id)] == ["undone"]
    env.rollback()
    assert attempts(env, "q", job_id) == []


def test_expiry_records_the_timed_out_attempt(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q", retry_limit=1))
    job_id = env.tx(lambda q: q.send("q"))
    env.tx(lambda q: q.fetch("q"))
    env.sql("UPDATE {s}.job SET started_on = now() - interval '1 hour' WHERE id = :i", i=job_id)
    report = env.tx(lambda q: q.supervise("q", force=True))
    assert report.expired == {"q": 1}
    [attempt] = attempts(env, "q", job_id)
    assert (attempt.attempt, attempt.cause, attempt.message) == (1, "expired", "job timed out")
    assert attempt.worker is None


def test_a_lapsed_heartbeat_records_its_attempt(env46_or_split: Any) -> None:
    env = env46_or_split
    env.tx(lambda q: q.create_queue("q", heartbeat_seconds=10, retry_limit=0))
    job_id = env.tx(lambda q: q.send("q"))
    env.tx(lambda q: q.fetch("q"))
    env.sql("UPDATE {s}.job SET heartbeat_on = now() - interval '1 minute' WHERE id = :i", i=job_id)
    env.tx(lambda q: q.supervise("q", force=True))
    [attempt] = attempts(env, "q", job_id)
    assert (attempt.cause, attempt.message) == ("heartbeat", "job heartbeat timeout")


def test_a_worker_records_which_worker_failed_the_attempt(harness46: Harness) -> None:
    h = harness46
    h.service_tx(lambda q: q.create_queue("q", retry_limit=0))
    job_id = send(h, "q")

    def boom(job: Any) -> None:
        raise KeyError("sku-42")

    w = h.worker(name="billing", poll_interval=0.1)
    w.register("q", h.handler(boom))
    h.start(w)
    wait_for(lambda: state_of(h, "q", job_id) == "failed")
    h.stop(w)
    [attempt] = h.service_tx(lambda q: q.get_job_attempts("q", job_id))
    assert attempt.worker is not None and attempt.worker.startswith("billing@")
    assert attempt.worker_id == w.instance_id
    # The job page links the worker to its row on the instances page.
    board = TestClient(create_app(h.engine, schemas=[h.schema]), base_url="http://127.0.0.1")
    page = board.get(f"/s/{quote(h.schema, safe='')}/jobs/{job_id}?queue=q").text
    assert f'/instances#instance-{w.instance_id}"><code class="attempt-worker">billing@' in page
    row = board.get(f"/s/{quote(h.schema, safe='')}/instances").text
    assert f'id="instance-{w.instance_id}"' in row
    assert (attempt.error_type, attempt.message) == ("KeyError", "'sku-42'")


def test_supervision_removes_the_attempts_of_jobs_that_are_gone(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("q", retry_limit=0))
    kept = env46.tx(lambda q: q.send("q", {"n": 1}))
    fail_once(env46, "q", {"message": "first"})
    gone = env46.tx(lambda q: q.send("q", {"n": 2}))
    fail_once(env46, "q", {"message": "second"})
    env46.tx(lambda q: q.delete_jobs("q", [gone]))
    # The sweep walks the table in batches from where it stopped; one pass covers both.
    env46.tx(lambda q: q.supervise(force=True))
    rows = env46.sql("SELECT job_id FROM {s}.alkstore_job_attempt")
    assert rows == [(kept,)]
    assert len(attempts(env46, "q", kept)) == 1


def test_reading_attempts_refuses_bad_input_and_tells_no_queue_from_no_attempts(
    env: Any,
) -> None:
    env.tx(lambda q: q.create_queue("q"))
    assert attempts(env, "q", uuid.uuid4()) == []
    with pytest.raises(QueueNotFoundError):
        attempts(env, "nope", uuid.uuid4())
    with pytest.raises(InvalidOptionsError, match="id"):
        attempts(env, "q", "not-a-uuid")  # type: ignore[arg-type]


def test_without_the_table_fails_work_as_before_and_installing_it_starts_the_history(
    engine: Engine,
) -> None:
    schema = random_schema()

    def tx(fn: Any) -> Any:
        with Session(engine) as session, session.begin():
            return fn(QueueService(session, schema=schema))

    def fail_next(message: str) -> None:
        [job] = tx(lambda q: q.fetch("q", ignore_start_after=True))
        tx(lambda q: q.fail("q", job, {"message": message}))

    with throwaway(engine, schema):
        migrate.upgrade(engine, schema, schema_version=46, attempt_history=False)
        tx(lambda q: q.create_queue("q", retry_limit=5))
        job_id = tx(lambda q: q.send("q"))
        fail_next("before")
        assert tx(lambda q: q.get_job_attempts("q", job_id)) == []
        assert migrate.install_attempt_history(engine, schema) is True
        assert migrate.install_attempt_history(engine, schema) is False
        # A running process notices the table when it next reads the version.
        engine_state(engine).forget(schema)
        fail_next("after")
        assert [a.message for a in tx(lambda q: q.get_job_attempts("q", job_id))] == ["after"]
        migrate.downgrade(engine, schema)
        with engine.connect() as conn:
            left = conn.execute(
                text("SELECT count(*) FROM pg_namespace WHERE nspname = :s"), {"s": schema}
            ).scalar_one()
        assert left == 0  # the table went with the rest, and then the schema


def test_the_offline_script_makes_the_table_and_can_run_again() -> None:
    script = migrate.offline_sql("jobs", schema_version=46)
    assert "CREATE TABLE IF NOT EXISTS jobs.alkstore_job_attempt" in script
    assert "CREATE INDEX IF NOT EXISTS alkstore_job_attempt_i1" in script
    assert script.rstrip().endswith("COMMIT;")
    bare = migrate.offline_sql("jobs", schema_version=46, attempt_history=False)
    assert "alkstore_job_attempt" not in bare


def test_the_sweep_walks_a_big_history_over_several_passes(
    env46: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(attempts_ops, "SWEEP_BATCH", 2)
    env46.tx(lambda q: q.create_queue("q", retry_limit=0))
    ids = [env46.tx(lambda q, n=n: q.send("q", {"n": n})) for n in range(5)]
    for _ in ids:
        fail_once(env46, "q", {"message": "x"})
    env46.tx(lambda q: q.delete_jobs("q", ids[3:]))  # the last two, beyond the first window
    svc_passes = 0
    while env46.sql("SELECT count(*) FROM {s}.alkstore_job_attempt")[0][0] > 3:
        env46.tx(lambda q: q.supervise(force=True))
        svc_passes += 1
        assert svc_passes <= 4, "the sweep never reached the end of the table"
    assert svc_passes >= 2  # two rows a pass: the orphans were not in the first window
    left = {r[0] for r in env46.sql("SELECT job_id FROM {s}.alkstore_job_attempt")}
    assert left == set(ids[:3])


def test_a_huge_error_is_kept_shortened_and_the_job_keeps_it_whole(env46_or_split: Any) -> None:
    env = env46_or_split
    env.tx(lambda q: q.create_queue("q", retry_limit=0))
    job_id = env.tx(lambda q: q.send("q"))
    message = "m" * (MAX_ATTEMPT_ERROR_BYTES * 2)
    fail_once(env, "q", {"name": "Huge", "message": message, "stack": "s" * 100})
    [attempt] = attempts(env, "q", job_id)
    assert attempt.error["truncated"] > MAX_ATTEMPT_ERROR_BYTES
    assert attempt.error_type == "Huge" and attempt.stack == "s" * 100
    assert attempt.message == "m" * (MAX_ATTEMPT_ERROR_BYTES // 4)
    [(output,)] = env.sql("SELECT output FROM {s}.job WHERE id = :i", i=job_id)
    assert output["message"] == message
