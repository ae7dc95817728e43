"""Supervision steps: expiration, retention, queue counters, warnings
(as pg-boss's maintenance and failJobs do them).

Time is moved with a :class:`FakeClock` whose time the statements use instead of
the database's ``now()``: a week passes in a millisecond.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.direct import in_tx, rows

from alkstore_sa import InvalidOptionsError
from alkstore_sa.clock import FakeClock
from alkstore_sa.names import schema_key
from alkstore_sa.ops import Settlement
from alkstore_sa.supervision import QueueWarning, Supervisor

DAY = 86_400


def db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()  # type: ignore[no-any-return]


def job_states(engine: Engine, schema: str, queue: str) -> dict[uuid.UUID, str]:
    found = rows(engine, schema, "SELECT id, state FROM {s}.job WHERE name = :q", q=queue)
    return {r.id: r.state for r in found}


@pytest.fixture
def clock(engine: Engine) -> FakeClock:
    return FakeClock(db_now(engine))


@pytest.fixture
def supervise(engine: Engine, schema: str, clock: FakeClock) -> Iterator[Callable[..., Any]]:
    """``supervise(advance=seconds, **settings)``: move the clock, run one full pass."""

    def run(advance: float = 0, **settings: Any) -> Any:
        clock.advance(advance)
        settings.setdefault("schedule", False)
        return Supervisor(engine, schema=schema, clock=clock, **settings).run_once()

    yield run


@pytest.fixture
def queue(engine: Engine, schema: str) -> str:
    in_tx(engine, schema, lambda q: q.create_queue("q", deletion_seconds=60))
    return "q"


def finish(engine: Engine, schema: str, queue: str, how: str) -> uuid.UUID:
    job_id = in_tx(engine, schema, lambda q: q.send(queue, {"n": 1}, retry_limit=0))
    if how == "cancelled":
        in_tx(engine, schema, lambda q: q.cancel(queue, job_id))
        return job_id  # type: ignore[no-any-return]
    [job] = in_tx(engine, schema, lambda q: q.fetch(queue))
    if how == "completed":
        in_tx(engine, schema, lambda q: q.complete(queue, job.id))
    elif how == "failed":
        in_tx(engine, schema, lambda q: q.fail(queue, job.id))
    return job_id  # type: ignore[no-any-return]


# ------------------------------------------------------------------ retention


@pytest.mark.parametrize("how", ["completed", "cancelled", "failed"])
def test_finished_job_is_deleted_once_its_deletion_seconds_have_passed(
    engine: Engine, schema: str, queue: str, supervise: Any, how: str
) -> None:
    job_id = finish(engine, schema, queue, how)
    report = supervise(advance=61)
    assert job_id not in job_states(engine, schema, queue)
    assert report.deleted == {queue: 1}


@pytest.mark.parametrize("how", ["completed", "cancelled", "failed"])
def test_finished_job_is_kept_until_its_deletion_seconds_have_passed(
    engine: Engine, schema: str, queue: str, supervise: Any, how: str
) -> None:
    job_id = finish(engine, schema, queue, how)
    supervise(advance=30)
    assert job_states(engine, schema, queue) == {job_id: how}


def test_queued_job_past_keep_until_is_deleted(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    job_id = in_tx(engine, schema, lambda q: q.send(queue, None, retention_seconds=120))
    supervise(advance=100, maintenance_interval=10)
    assert job_id in job_states(engine, schema, queue)
    supervise(advance=30, maintenance_interval=10)
    assert job_id not in job_states(engine, schema, queue)


def test_deferred_job_keeps_its_full_retention_after_start_after(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    job_id = in_tx(
        engine, schema, lambda q: q.send(queue, None, retention_seconds=120, start_after=3600)
    )
    supervise(advance=3600 + 100)
    assert job_id in job_states(engine, schema, queue)


def test_active_job_is_never_deleted(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    job_id = in_tx(
        engine,
        schema,
        lambda q: q.send(
            queue, None, retention_seconds=1, deletion_seconds=1, expire_seconds=86_399
        ),
    )
    in_tx(engine, schema, lambda q: q.fetch(queue))
    supervise(advance=3600)
    assert job_states(engine, schema, queue) == {job_id: "active"}


def test_active_job_carrying_an_old_completed_on_is_not_deleted(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    # Node pg-boss's retry() keeps completed_on; the job can then run again with it set.
    job_id = in_tx(engine, schema, lambda q: q.send(queue, None, deletion_seconds=1))
    in_tx(engine, schema, lambda q: q.fetch(queue))
    rows(engine, schema, "UPDATE {s}.job SET completed_on = now() WHERE id = :id", id=job_id)
    supervise(advance=120)
    assert job_states(engine, schema, queue) == {job_id: "active"}


def test_large_deletions_run_in_bounded_batches_until_done(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.send_many(queue, [{"retention_seconds": 1}] * 5))
    report = supervise(advance=10, delete_batch_size=2)
    assert report.deleted == {queue: 5}
    assert job_states(engine, schema, queue) == {}


def test_deletion_runs_once_per_maintenance_interval(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    assert supervise().maintained == (queue,)
    assert supervise(advance=DAY - 10).maintained == ()
    assert supervise(advance=20).maintained == (queue,)


# ------------------------------------------------------------------ expiration


def test_job_past_its_lease_is_retried_with_the_timeout_output(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    job_id = in_tx(engine, schema, lambda q: q.send(queue, None, expire_seconds=5, retry_limit=1))
    in_tx(engine, schema, lambda q: q.fetch(queue))
    report = supervise(advance=6)
    job = in_tx(engine, schema, lambda q: q.get_job(queue, job_id))
    assert (job.state, job.output) == ("retry", {"value": {"message": "job timed out"}})
    assert report.expired == {queue: 1}


def test_job_past_its_lease_on_a_partitioned_queue_is_expired(
    engine: Engine, schema: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("p", partition=True, expire_seconds=5))
    job_id = in_tx(engine, schema, lambda q: q.send("p", None, retry_limit=0))
    in_tx(engine, schema, lambda q: q.fetch("p"))
    assert supervise(advance=6).expired == {"p": 1}
    assert job_states(engine, schema, "p") == {job_id: "failed"}


def test_more_than_a_hundred_queues_are_all_supervised_in_one_pass(
    engine: Engine, schema: str, supervise: Any
) -> None:
    names = [f"q{i:03}" for i in range(130)]
    in_tx(engine, schema, lambda q: [q.create_queue(n) for n in names])
    report = supervise()
    assert list(report.monitored) == names == list(report.maintained)


def test_job_within_its_lease_is_not_expired(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    job_id = in_tx(engine, schema, lambda q: q.send(queue, None, expire_seconds=60))
    in_tx(engine, schema, lambda q: q.fetch(queue))
    supervise(advance=30)
    assert job_states(engine, schema, queue) == {job_id: "active"}


def test_expired_job_past_its_retry_limit_moves_to_the_dead_letter_queue(
    engine: Engine, schema: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("dlq"))
    in_tx(engine, schema, lambda q: q.create_queue("q", dead_letter="dlq", expire_seconds=5))
    job_id = in_tx(engine, schema, lambda q: q.send("q", {"order": 7}, retry_limit=0))
    in_tx(engine, schema, lambda q: q.fetch("q"))
    supervise(advance=6)
    assert job_states(engine, schema, "q") == {job_id: "failed"}
    [dead] = rows(engine, schema, "SELECT data, output FROM {s}.job WHERE name = 'dlq'")
    assert (dead.data, dead.output) == ({"order": 7}, {"value": {"message": "job timed out"}})


def test_extended_lease_is_honoured_by_expiration(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.send(queue, None, expire_seconds=5))
    [job] = in_tx(engine, schema, lambda q: q.fetch(queue))
    in_tx(
        engine,
        schema,
        lambda q: q.extend_leases(queue, [Settlement(job.id, None, job.started_on)], 600),
    )
    supervise(advance=60)
    assert job_states(engine, schema, queue) == {job.id: "active"}


def test_expiration_runs_in_bounded_batches_until_done(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.send_many(queue, [{"expire_seconds": 1}] * 5))
    in_tx(engine, schema, lambda q: q.fetch(queue, 5))
    report = supervise(advance=5, expire_batch_size=2)
    assert report.expired == {queue: 5}
    assert set(job_states(engine, schema, queue).values()) == {"retry"}


# ------------------------------------------------------------------ counters and warnings


def test_monitor_pass_writes_live_counts_into_the_queue_row(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.send_many(queue, [{}, {}, {}, {"start_after": 3600}]))
    in_tx(engine, schema, lambda q: q.fetch(queue))
    supervise(advance=5)  # the fake clock started before these jobs were sent
    info = in_tx(engine, schema, lambda q: q.get_queue(queue))
    live = in_tx(engine, schema, lambda q: q.get_queue_stats(queue))
    cached = (info.deferred_count, info.queued_count, info.active_count, info.total_count)
    assert cached == (live.deferred_count, live.queued_count, live.active_count, live.total_count)
    assert cached == (1, 3, 1, 4)


def test_monitor_pass_zeroes_the_counters_of_a_queue_without_jobs(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.send_many(queue, [{}, {}]))
    supervise()
    in_tx(engine, schema, lambda q: q.delete_all_jobs(queue))
    supervise(advance=61)
    info = in_tx(engine, schema, lambda q: q.get_queue(queue))
    assert (info.deferred_count, info.queued_count, info.active_count, info.total_count) == (0,) * 4


def test_monitor_pass_records_active_singleton_keys(
    engine: Engine, schema: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("s", policy="singleton"))
    in_tx(
        engine, schema, lambda q: q.send_many("s", [{"singleton_key": "a"}, {"singleton_key": "b"}])
    )
    in_tx(engine, schema, lambda q: q.fetch("s", 2))
    supervise()
    info = in_tx(engine, schema, lambda q: q.get_queue("s"))
    assert sorted(info.singletons_active) == ["a", "b"]


def test_monitor_runs_once_per_monitor_interval(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    assert supervise().monitored == (queue,)
    assert supervise(advance=59).monitored == ()
    assert supervise(advance=2).monitored == (queue,)


def test_queue_over_its_own_threshold_raises_a_warning(
    engine: Engine, schema: str, supervise: Any, caplog: pytest.LogCaptureFixture
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("busy", warning_queued=2))
    in_tx(engine, schema, lambda q: q.send_many("busy", [{}, {}, {}]))
    seen: list[QueueWarning] = []
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.supervision"):
        report = supervise(on_warning=seen.append)
    assert seen == [QueueWarning("busy", 3, 2)] == list(report.warnings)
    assert any(r.__dict__.get("action") == "large_queue" for r in caplog.records)


def test_global_warning_size_applies_to_queues_without_their_own(
    engine: Engine, schema: str, queue: str, supervise: Any
) -> None:
    in_tx(engine, schema, lambda q: q.send_many(queue, [{}, {}, {}]))
    assert supervise(warning_queue_size=3).warnings == ()
    assert supervise(advance=61, warning_queue_size=2).warnings == (QueueWarning(queue, 3, 2),)


# ------------------------------------------------------------------ in the caller's transaction


def test_supervise_in_the_callers_transaction_leaves_it_usable(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q", deletion_seconds=1))
    env.tx(lambda q: q.send("q", None))
    svc = env.service()
    report = svc.supervise(force=True)
    sent = svc.send("q", {"after": "supervise"})
    env.commit()
    assert report.monitored == ("q",) and report.maintained == ("q",)
    assert env.tx(lambda q: q.get_job("q", sent)) is not None


def test_supervise_with_a_bad_setting_raises_before_any_sql(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    svc = env.service()
    with pytest.raises(InvalidOptionsError, match="monitor_interval"):
        svc.supervise(monitor_interval=0)
    assert svc.send("q", None) is not None
    env.commit()


@pytest.mark.parametrize(
    ("step", "key"),
    [("expire", "failJobsByTimeout"), ("delete", "deletion"), ("stats", None)],
)
@pytest.mark.parametrize("partition", [False, True])
def test_supervise_skips_a_step_whose_pgboss_advisory_lock_is_held(
    env: Any, engine: Engine, step: str, key: str | None, partition: bool
) -> None:
    info = env.tx(lambda q: q.create_queue("q", partition=partition, deletion_seconds=1))
    lock_key = "queue-stats" if key is None else info.table_name + key
    with engine.connect() as holder, holder.begin():
        # The lock exactly as Node pg-boss computes it (pg-boss's advisory-lock keys).
        holder.execute(
            text(
                "SELECT pg_advisory_xact_lock(('x' || encode(sha224((current_database()"
                " || '.pgboss.' || :schema || :key)::bytea), 'hex'))::bit(64)::bigint)"
            ),
            {"schema": schema_key(env.schema), "key": lock_key},
        )
        report = env.tx(lambda q: q.supervise(force=True))
    assert [b.split(":")[0] for b in report.busy] == [step]
    assert lock_key in report.busy[0]
