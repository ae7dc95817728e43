"""fail at schema 46: retry and backoff as pg-boss 12.38 computes them, every column
carried, dead-letter provenance, fencing, lease and heartbeat expiry, poison rows.

Jobs are put in ``active`` by SQL here, so these tests depend on the fail path only
(the claim at 46 has tests of its own).
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from conftest import Env
from sqlalchemy import text
from support.node import NodeBoss46, node46, node46_modules, node_url

from alkstore_sa import FailResult, JobState, Settlement
from alkstore_sa.backends import POSTGRES
from alkstore_sa.ops import driver
from alkstore_sa.ops._core import Context
from alkstore_sa.ops.poison import fail_poison
from alkstore_sa.ops.working import expire_heartbeats46, expire_jobs46
from alkstore_sa.sql.v46.fail import CARRIED_COLUMNS, HEARTBEAT_OUTPUT, TIMEOUT_OUTPUT

__all__ = ["node46", "node46_modules", "node_url"]  # fixtures used below


@pytest.fixture
def env46(env46_or_split: Env) -> Env:
    """Every test here runs split as well (``noMultiMutationCte``, conftest)."""
    return env46_or_split


T0 = dt.datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=dt.UTC)


def create_queue(env: Any, name: str, **options: Any) -> str:
    """A queue made by the schema's own create_queue (pg-boss's option names)."""
    options = {"policy": "standard", **options}
    env.sql("SELECT {s}.create_queue(:n, CAST(:o AS jsonb))", n=name, o=json.dumps(options))
    return name


def add_job(env: Any, queue: str, **columns: Any) -> uuid.UUID:
    """Insert a job with ``columns`` (JSON columns given as Python values)."""
    job_id = uuid.uuid4()
    values = {"id": job_id, "name": queue, **columns}
    for key in ("data", "output", "source_output", "trace_context"):
        if key in values and values[key] is not None:
            values[key] = json.dumps(values[key])
    names = ", ".join(values)
    binds = ", ".join(
        f"CAST(:{k} AS jsonb)"
        if k in ("data", "output", "source_output", "trace_context")
        else f":{k}"
        for k in values
    )
    env.sql(f"INSERT INTO {{s}}.job ({names}) VALUES ({binds})", **values)
    return job_id


def activate(env: Any, job_id: uuid.UUID, started_on: dt.datetime | None = None) -> dt.datetime:
    """Put a job in ``active`` as a claim does; return its ``started_on``."""
    [row] = env.sql(
        "UPDATE {s}.job SET state = 'active', started_on = COALESCE(:t, now()), "
        "heartbeat_on = COALESCE(:t, now()) WHERE id = :id RETURNING started_on",
        id=job_id,
        t=started_on,
    )
    return row.started_on  # type: ignore[no-any-return]


def row_of(env: Any, job_id: uuid.UUID) -> Any:
    [row] = env.sql("SELECT * FROM {s}.job WHERE id = :id", id=job_id)
    return row


def rows_of(env: Any, queue: str) -> list[Any]:
    return list(env.sql("SELECT * FROM {s}.job WHERE name = :q ORDER BY created_on, id", q=queue))


def fail_seeded(env: Any, queue: str, job_id: uuid.UUID, seed: float) -> float:
    """Fail with the session's random() seeded; return start_after - now() in seconds."""
    svc = env.service()
    env.session.execute(text("SELECT setseed(:s)"), {"s": seed})
    result = svc.fail(queue, job_id, "boom")
    assert result.affected == [job_id]
    delay = env.session.execute(
        text(
            f'SELECT extract(epoch FROM start_after - now()) FROM "{env.schema}".job WHERE id = :i'
        ),
        {"i": job_id},
    ).scalar_one()
    env.commit()
    return float(delay)


def seeded_random(env: Any, seed: float) -> float:
    """The first random() after setseed(seed), as PostgreSQL computes it."""
    with env.engine.connect() as conn:
        conn.execute(text("SELECT setseed(:s)"), {"s": seed})
        return float(conn.execute(text("SELECT random()")).scalar_one())


def pgboss_backoff(
    retry_count: int, retry_delay: int, retry_delay_max: int | None, r: float
) -> float:
    """pg-boss 12.38's delay, written from its formula (see sql/v46/fail.py)."""
    half = 2.0 ** min(16, retry_count + 1) / 2
    delay = max(retry_delay, 1) * (half + half * r)
    return delay if retry_delay_max is None else min(retry_delay_max, delay)


# ------------------------------------------------------------------ retry and backoff


@pytest.mark.parametrize(
    ("retry_delay", "retry_delay_max"), [(3, None), (0, None), (5, 30)], ids=["3s", "0s", "capped"]
)
def test_backoff_at_each_attempt_is_pgboss_1238s_multiplicative_formula(
    env46: Any, retry_delay: int, retry_delay_max: int | None
) -> None:
    create_queue(env46, "q")
    job_id = add_job(
        env46,
        "q",
        retry_limit=6,
        retry_delay=retry_delay,
        retry_backoff=True,
        retry_delay_max=retry_delay_max,
    )
    for attempt in range(6):
        env46.sql("UPDATE {s}.job SET retry_count = :n WHERE id = :id", n=attempt, id=job_id)
        activate(env46, job_id)
        seed = 0.1 * attempt - 0.3
        delay = fail_seeded(env46, "q", job_id, seed)
        expected = pgboss_backoff(attempt, retry_delay, retry_delay_max, seeded_random(env46, seed))
        # The interval keeps microseconds.
        assert delay == pytest.approx(expected, abs=1e-6), attempt
        assert row_of(env46, job_id).state == "retry"


def test_backoff_is_not_schema_26s_additive_one(env46: Any) -> None:
    # At 26 (pg-boss 11): 10 + 2^1/2 * (1 + r), in [11, 12); at 46: 10 * (1 + r), in [10, 20).
    create_queue(env46, "q")
    job_id = add_job(env46, "q", retry_delay=10, retry_backoff=True)
    activate(env46, job_id)
    seed = 0.5
    r = seeded_random(env46, seed)
    assert fail_seeded(env46, "q", job_id, seed) == pytest.approx(10 * (1 + r), abs=1e-6)


def test_retry_without_backoff_waits_retry_delay_seconds(env46: Any) -> None:
    create_queue(env46, "q")
    job_id = add_job(env46, "q", retry_delay=42)
    activate(env46, job_id)
    assert fail_seeded(env46, "q", job_id, 0.0) == 42.0
    row = row_of(env46, job_id)
    assert (row.state, row.completed_on, row.output) == ("retry", None, {"value": "boom"})


def test_fail_at_the_retry_limit_is_final_and_keeps_start_after(env46: Any) -> None:
    create_queue(env46, "q")
    job_id = add_job(env46, "q", retry_limit=2, retry_count=2, start_after=T0, retry_backoff=True)
    activate(env46, job_id)
    svc = env46.service()
    result = svc.fail("q", job_id, "last")
    now = env46.session.execute(text("SELECT now()")).scalar_one()
    env46.commit()
    assert result.states == {job_id: JobState.FAILED}
    row = row_of(env46, job_id)
    assert (row.state, row.start_after, row.completed_on) == ("failed", T0, now)
    assert row.output == {"value": "last"}


def test_fail_many_reports_retry_and_failed_states(env46: Any) -> None:
    create_queue(env46, "q")
    retrying = add_job(env46, "q", retry_limit=1)
    final = add_job(env46, "q", retry_limit=0)
    result = env46.tx(
        lambda q: q.fail_many("q", [Settlement(retrying, "a"), Settlement(final, "b")])
    )
    assert isinstance(result, FailResult)
    assert result.states == {retrying: JobState.RETRY, final: JobState.FAILED}
    assert (result.retried, result.failed, result.dead_lettered) == ([retrying], [final], 0)


# ------------------------------------------------------------------ every column carried

EVERY_COLUMN: dict[str, Any] = {
    "priority": 7,
    "data": {"payload": [1, 2, 3]},
    "retry_limit": 5,
    "retry_count": 1,
    "retry_delay": 60,
    "retry_backoff": False,
    "retry_delay_max": 600,
    "expire_seconds": 77,
    "deletion_seconds": 88,
    "singleton_key": "key-1",
    "singleton_on": dt.datetime(2030, 1, 1, 0, 0),
    "start_after": T0,
    "created_on": T0 - dt.timedelta(days=1),
    "keep_until": T0 + dt.timedelta(days=9),
    "output": {"before": True},
    "policy": "standard",
    "group_id": "group-a",
    "group_tier": "gold",
    "heartbeat_seconds": 30,
    "blocked": True,
    "blocking": True,
    "pending_dependencies": 3,
    "source_name": "origin",
    "source_id": uuid.UUID("11111111-2222-3333-4444-555555555555"),
    "source_created_on": T0 - dt.timedelta(days=2),
    "source_retry_count": 4,
    "source_output": {"earlier": "failure"},
    "source_root_id": uuid.UUID("66666666-7777-8888-9999-000000000000"),
    "trace_context": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    "upsert_by_key": True,
}
"""A value for every settable column of a schema-46 job that the fail leaves alone."""


@pytest.mark.parametrize("partition", [False, True], ids=["job_common", "partition"])
@pytest.mark.parametrize("retries_left", [True, False], ids=["to-retry", "to-failed"])
def test_fail_carries_every_column_but_upsert_by_key(
    env46: Any, partition: bool, retries_left: bool
) -> None:
    create_queue(env46, "origin")
    create_queue(env46, "q", partition=partition)
    columns = {**EVERY_COLUMN, "retry_limit": 5 if retries_left else 1}
    job_id = add_job(env46, "q", **columns)
    started = activate(env46, job_id, T0 + dt.timedelta(minutes=1))
    before = row_of(env46, job_id)._asdict()
    assert {k: before[k] for k in columns} == columns  # every value really set

    svc = env46.service()
    result = svc.fail("q", job_id, {"after": True})
    now = env46.session.execute(text("SELECT now()")).scalar_one()
    env46.commit()
    after = row_of(env46, job_id)._asdict()

    assert result.affected == [job_id]
    changed = {"state", "start_after", "completed_on", "output", "heartbeat_on", "upsert_by_key"}
    assert set(CARRIED_COLUMNS) | {"upsert_by_key"} == set(after)
    assert {k: after[k] for k in after if k not in changed} == {
        k: before[k] for k in before if k not in changed
    }
    assert after["started_on"] == started
    assert after["output"] == {"after": True}
    # The attempt is over; a failed job no longer takes part in upsert by key.
    assert (after["heartbeat_on"], after["upsert_by_key"]) == (None, None)
    if retries_left:
        # retry_delay 60 without backoff.
        assert (after["state"], after["completed_on"]) == ("retry", None)
        assert after["start_after"] == now + dt.timedelta(seconds=60)
    else:
        assert (after["state"], after["completed_on"]) == ("failed", now)
        assert after["start_after"] == before["start_after"]


# ------------------------------------------------------------------ dead letters


def test_dead_letter_copy_takes_the_queue_settings_and_records_provenance(env46: Any) -> None:
    create_queue(
        env46,
        "dlq",
        retryLimit=9,
        retryDelay=11,
        retryBackoff=True,
        expireInSeconds=120,
        retentionSeconds=3600,
        deleteAfterSeconds=0,
        heartbeatSeconds=45,
    )
    create_queue(env46, "q", deadLetter="dlq", policy="singleton")
    trace = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    job_id = add_job(
        env46,
        "q",
        retry_limit=0,
        dead_letter="dlq",
        policy="singleton",
        priority=3,
        data={"n": 1},
        singleton_key="k",
        singleton_on=dt.datetime(2030, 1, 1),
        group_id="g",
        group_tier="t",
        heartbeat_seconds=10,
        retry_delay_max=99,
        trace_context=trace,
    )
    activate(env46, job_id)
    svc = env46.service()
    result = svc.fail("q", job_id, {"error": "x"})
    now = env46.session.execute(text("SELECT now()")).scalar_one()
    env46.commit()

    assert result.dead_lettered == 1
    failed = row_of(env46, job_id)
    [copy] = rows_of(env46, "dlq")
    assert copy.id != job_id
    expected = {
        "state": "created",
        "priority": 3,
        "data": {"n": 1},
        "singleton_key": "k",
        "group_id": "g",
        "group_tier": "t",
        "trace_context": trace,
        # From the dead letter queue:
        "retry_limit": 9,
        "retry_delay": 11,
        "retry_backoff": True,
        "expire_seconds": 120,
        "deletion_seconds": 0,
        "heartbeat_seconds": 45,
        "keep_until": now + dt.timedelta(seconds=3600),
        "start_after": now,
        "created_on": now,
        # A new job that has not run: no output of its own; the failure is its source.
        "output": None,
        "source_output": {"error": "x"},
        "source_name": "q",
        "source_id": job_id,
        "source_created_on": failed.created_on,
        "source_retry_count": 0,
        "source_root_id": job_id,
        # Left NULL: the copy is never refused by the dead letter queue's unique indexes.
        "policy": None,
        "dead_letter": None,
        "retry_delay_max": None,
        "singleton_on": None,
        "upsert_by_key": None,
        "retry_count": 0,
        "started_on": None,
        "completed_on": None,
    }
    assert {k: getattr(copy, k) for k in expected} == expected


def test_a_dead_letter_job_failing_again_keeps_its_provenance_and_chain_root(
    env46: Any,
) -> None:
    create_queue(env46, "dlq2")
    create_queue(env46, "dlq", deadLetter="dlq2")
    create_queue(env46, "q", deadLetter="dlq")
    first = add_job(env46, "q", retry_limit=0, dead_letter="dlq")
    activate(env46, first)
    env46.tx(lambda q: q.fail("q", first, "one"))
    [copy] = rows_of(env46, "dlq")
    env46.sql("UPDATE {s}.job SET dead_letter = 'dlq2', retry_limit = 0 WHERE id = :i", i=copy.id)
    activate(env46, copy.id)
    env46.tx(lambda q: q.fail("dlq", copy.id, "two"))

    failed_copy = row_of(env46, copy.id)
    assert (failed_copy.state, failed_copy.source_id, failed_copy.source_name) == (
        "failed",
        first,
        "q",
    )
    assert failed_copy.source_output == {"value": "one"}
    [second] = rows_of(env46, "dlq2")
    assert (second.source_id, second.source_name, second.source_root_id) == (copy.id, "dlq", first)
    assert second.source_output == {"value": "two"}


def test_no_dead_letter_copy_while_retries_remain(env46: Any) -> None:
    create_queue(env46, "dlq")
    create_queue(env46, "q", deadLetter="dlq")
    job_id = add_job(env46, "q", retry_limit=1, dead_letter="dlq")
    activate(env46, job_id)
    result = env46.tx(lambda q: q.fail("q", job_id))
    assert (result.retried, result.dead_lettered) == ([job_id], 0)
    assert rows_of(env46, "dlq") == []


def fail_keeping_forever(env: Any) -> uuid.UUID:
    create_queue(env, "dlq", deleteAfterSeconds=0)
    create_queue(env, "q", deadLetter="dlq", deleteAfterSeconds=0)
    job_id = add_job(env, "q", retry_limit=0, deletion_seconds=0, dead_letter="dlq")
    activate(env, job_id)
    env.tx(lambda q: q.fail("q", job_id))
    return job_id


def test_deletion_seconds_zero_is_carried_by_the_fail_and_given_to_the_copy(env46: Any) -> None:
    # At 46 deletion_seconds = 0 means "keep finished jobs" (pg-boss 12.38's
    # retention deletes only where deletion_seconds > 0): the fail must carry the
    # 0, and the dead-letter copy take its queue's 0.
    job_id = fail_keeping_forever(env46)
    assert (row_of(env46, job_id).state, row_of(env46, job_id).deletion_seconds) == ("failed", 0)
    [copy] = rows_of(env46, "dlq")
    assert copy.deletion_seconds == 0


def test_a_failed_job_with_deletion_seconds_zero_survives_supervision(env46: Any) -> None:
    job_id = fail_keeping_forever(env46)
    env46.sql(
        "UPDATE {s}.job SET completed_on = now() - interval '400 days' WHERE id = :i", i=job_id
    )
    env46.tx(lambda q: q.supervise(force=True))
    assert row_of(env46, job_id).state == "failed"


# ------------------------------------------------------------------ fencing


def test_a_stale_fenced_fail_changes_nothing(env46: Any) -> None:
    create_queue(env46, "q")
    job_id = add_job(env46, "q", retry_limit=3)
    old_attempt = activate(env46, job_id, T0)
    activate(env46, job_id, T0 + dt.timedelta(seconds=5))  # claimed again since
    before = row_of(env46, job_id)
    result = env46.tx(lambda q: q.fail_many("q", [Settlement(job_id, "late", old_attempt)]))
    assert (result.requested, result.affected) == (1, [])
    assert row_of(env46, job_id) == before


def test_a_fenced_fail_of_a_job_no_longer_active_changes_nothing(env46: Any) -> None:
    create_queue(env46, "q")
    job_id = add_job(env46, "q", retry_limit=3)
    attempt = activate(env46, job_id, T0)
    env46.sql("UPDATE {s}.job SET state = 'retry' WHERE id = :i", i=job_id)  # expired meanwhile
    before = row_of(env46, job_id)
    result = env46.tx(lambda q: q.fail_many("q", [Settlement(job_id, "late", attempt)]))
    assert result.affected == []
    assert row_of(env46, job_id) == before


def test_a_fenced_fail_of_the_current_attempt_applies(env46: Any) -> None:
    create_queue(env46, "q")
    job_id = add_job(env46, "q", retry_limit=0)
    attempt = activate(env46, job_id, T0)
    result = env46.tx(lambda q: q.fail_many("q", [Settlement(job_id, "now", attempt)]))
    assert result.states == {job_id: JobState.FAILED}


# ------------------------------------------------------------------ expiry


def run_op(env: Any, op: Any) -> Any:
    """Run an operation at 46 in its own committed transaction, sync or async."""
    ctx = Context(env.schema, version=46, backend=env.backend or POSTGRES)
    options = {"schema_translate_map": {"pgboss": env.schema}}
    if env.async_engine is None:
        with env.engine.begin() as conn:
            return driver.run(conn, op(ctx), options)

    async def go() -> Any:
        async with env.async_engine.begin() as conn:
            return await driver.arun(conn, op(ctx), options)

    return env.runner.run(go())


def test_expire_fails_jobs_past_their_lease_with_the_timeout_output(env46: Any) -> None:
    create_queue(env46, "q")
    create_queue(env46, "other")
    lapsed = add_job(env46, "q", **{**EVERY_COLUMN, "expire_seconds": 60, "retry_limit": 5})
    fresh = add_job(env46, "q", expire_seconds=3600)
    elsewhere = add_job(env46, "other", expire_seconds=60)
    for job in (lapsed, fresh, elsewhere):
        activate(env46, job, dt.datetime.now(dt.UTC) - dt.timedelta(seconds=120))
    before = row_of(env46, lapsed)._asdict()

    counts = run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 100))

    assert counts == {"q": 1}
    after = row_of(env46, lapsed)._asdict()
    assert (after["state"], after["output"]) == ("retry", TIMEOUT_OUTPUT)
    assert after["heartbeat_on"] is None
    for column in ("group_id", "trace_context", "source_root_id", "blocked", "heartbeat_seconds"):
        assert after[column] == before[column], column
    assert (row_of(env46, fresh).state, row_of(env46, elsewhere).state) == ("active", "active")


def test_expire_works_in_batches_of_limit(env46: Any) -> None:
    create_queue(env46, "q")
    jobs = [add_job(env46, "q", expire_seconds=1, retry_limit=0) for _ in range(5)]
    for job in jobs:
        activate(env46, job, T0)
    now = T0 + dt.timedelta(seconds=10)
    assert run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 2, now)) == {"q": 2}
    assert run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 2, now)) == {"q": 2}
    assert run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 2, now)) == {"q": 1}
    assert run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 2, now)) == {}
    assert {row.state for row in rows_of(env46, "q")} == {"failed"}


def test_expire_sends_a_timed_out_job_without_retries_to_its_dead_letter_queue(
    env46: Any,
) -> None:
    create_queue(env46, "dlq")
    create_queue(env46, "q", deadLetter="dlq")
    job_id = add_job(env46, "q", expire_seconds=1, retry_limit=0, dead_letter="dlq")
    activate(env46, job_id, T0)
    run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 10, T0 + dt.timedelta(seconds=2)))
    [copy] = rows_of(env46, "dlq")
    assert (copy.source_id, copy.source_output) == (job_id, TIMEOUT_OUTPUT)


def test_heartbeat_expiry_fails_jobs_whose_heartbeat_stopped(env46: Any) -> None:
    create_queue(env46, "q")
    stopped = add_job(env46, "q", heartbeat_seconds=30, retry_limit=0)
    beating = add_job(env46, "q", heartbeat_seconds=30)
    without = add_job(env46, "q")  # no heartbeat interval: only its lease counts
    for job in (stopped, beating, without):
        activate(env46, job, T0)
    env46.sql(
        "UPDATE {s}.job SET heartbeat_on = :t WHERE id = :i",
        t=T0 + dt.timedelta(seconds=50),
        i=beating,
    )
    now = T0 + dt.timedelta(seconds=60)

    counts = run_op(env46, lambda ctx: expire_heartbeats46(ctx, ["q"], 100, now))

    assert counts == {"q": 1}
    row = row_of(env46, stopped)
    assert (row.state, row.output, row.heartbeat_on) == ("failed", HEARTBEAT_OUTPUT, None)
    assert row.heartbeat_seconds == 30
    assert (row_of(env46, beating).state, row_of(env46, without).state) == ("active", "active")
    # Leases are another sweep's: nothing here has a lease that ran out.
    assert run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 100, now)) == {}


def test_expiry_reads_the_schema_clock_job_now(env46: Any) -> None:
    # A test clock in the schema's job_now() (as Node's tests set one) moves expiry too.
    create_queue(env46, "q")
    job_id = add_job(env46, "q", expire_seconds=60, retry_limit=0)
    activate(env46, job_id)
    assert run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 10)) == {}
    env46.sql(
        "CREATE OR REPLACE FUNCTION {s}.job_now() RETURNS timestamptz LANGUAGE sql STABLE "
        "AS $$ SELECT pg_catalog.now() + interval '1 hour' $$"
    )
    assert run_op(env46, lambda ctx: expire_jobs46(ctx, ["q"], 10)) == {"q": 1}


# ------------------------------------------------------------------ poison rows


def test_a_poison_row_at_46_fails_for_good_carrying_its_columns(env46: Any) -> None:
    create_queue(env46, "dlq")
    create_queue(env46, "q", deadLetter="dlq")
    job_id = add_job(
        env46,
        "q",
        retry_limit=5,
        retry_count=2,
        dead_letter="dlq",
        group_id="g",
        trace_context={"traceparent": "x"},
        source_root_id=uuid.uuid4(),
    )
    before = row_of(env46, job_id)

    failed = run_op(
        env46, lambda ctx: fail_poison(ctx, "q", [(job_id, "read", {"data": "too deep"})])
    )

    assert failed == 1
    row = row_of(env46, job_id)
    assert (row.state, row.retry_limit, row.retry_count) == ("failed", 2, 2)
    assert (row.group_id, row.trace_context, row.source_root_id) == (
        "g",
        {"traceparent": "x"},
        before.source_root_id,
    )
    assert row.output["name"] == "PoisonJob"
    [copy] = rows_of(env46, "dlq")
    assert (copy.source_id, copy.source_root_id) == (job_id, before.source_root_id)


# ------------------------------------------------------------------ against Node pg-boss 12.38


def node_comparable(row: Any, *drop: str) -> dict[str, Any]:
    values = dict(row._asdict())
    for key in ("id", "completed_on", "singleton_key", *drop):
        values.pop(key)
    return values


@pytest.mark.interop
def test_a_job_failed_by_node_1238_and_one_failed_by_us_end_alike(
    env46_sync: Any, node46: Callable[..., NodeBoss46]
) -> None:
    create_queue(env46_sync, "origin")
    create_queue(env46_sync, "dlq", retryLimit=4, heartbeatSeconds=20, expireInSeconds=99)
    create_queue(env46_sync, "q", deadLetter="dlq")
    twins = {}
    for side in ("node", "ours"):
        # Keys differ: twins sharing one would meet the unique indexes.
        columns = {**EVERY_COLUMN, "retry_limit": 1, "dead_letter": "dlq", "singleton_key": side}
        twins[side] = add_job(env46_sync, "q", **columns)
        activate(env46_sync, twins[side], T0)
    boss = node46(env46_sync.schema)
    boss.call("fail", "q", str(twins["node"]), {"error": "x"})
    env46_sync.tx(lambda q: q.fail("q", twins["ours"], {"error": "x"}))

    node_row, our_row = row_of(env46_sync, twins["node"]), row_of(env46_sync, twins["ours"])
    assert our_row.state == "failed"
    assert node_comparable(our_row) == node_comparable(node_row)
    copies = {c.source_id: c for c in rows_of(env46_sync, "dlq")}
    assert copies[twins["ours"]].singleton_key == "ours"
    assert node_comparable(
        copies[twins["ours"]], "source_id", "created_on", "start_after", "keep_until"
    ) == node_comparable(
        copies[twins["node"]], "source_id", "created_on", "start_after", "keep_until"
    )


@pytest.mark.interop
def test_node_1238s_backoff_falls_in_the_range_of_the_formula_we_use(
    env46_sync: Any, node46: Callable[..., NodeBoss46]
) -> None:
    # Node's random() cannot be seeded from here: its delays must lie where the
    # 12.38 formula puts them, ranges that schema 26's additive formula (10 + 2^n/2
    # * (1 + r): [11, 12), [12, 14), [14, 18)) does not reach from the second attempt.
    create_queue(env46_sync, "q")
    job_id = add_job(env46_sync, "q", retry_limit=9, retry_delay=10, retry_backoff=True)
    boss = node46(env46_sync.schema)
    for attempt in range(3):
        env46_sync.sql("UPDATE {s}.job SET retry_count = :n WHERE id = :i", n=attempt, i=job_id)
        activate(env46_sync, job_id)
        [(before,)] = env46_sync.sql("SELECT clock_timestamp()")
        boss.call("fail", "q", str(job_id), {"n": attempt})
        [(after,)] = env46_sync.sql("SELECT clock_timestamp()")
        start_after = row_of(env46_sync, job_id).start_after
        # Node's clock read lies between before and after.
        longest = (start_after - before).total_seconds()
        shortest = (start_after - after).total_seconds()
        assert pgboss_backoff(attempt, 10, None, 0.0) <= longest, attempt
        assert shortest < pgboss_backoff(attempt, 10, None, 1.0), attempt


# ------------------------------------------------------------------ end to end


def test_a_job_fetched_at_46_and_failed_by_its_job_runs_its_retries_then_is_dead_lettered(
    env46: Any,
) -> None:
    env46.tx(lambda q: q.create_queue("dlq"))
    env46.tx(lambda q: q.create_queue("q", retry_limit=2, dead_letter="dlq"))
    job_id = env46.tx(lambda q: q.send("q", {"n": 1}, retry_delay=0))
    attempts = []
    while jobs := env46.tx(lambda q: q.fetch("q")):
        [job] = jobs
        attempts.append(job.retry_count)
        result = env46.tx(lambda q, j=job: q.fail("q", j, f"attempt {j.retry_count}"))
        assert result.affected == [job_id]
    assert attempts == [0, 1, 2]
    row = row_of(env46, job_id)
    assert (row.state, row.output) == ("failed", {"value": "attempt 2"})
    [copy] = rows_of(env46, "dlq")
    assert (copy.source_id, copy.source_retry_count, copy.data) == (job_id, 2, {"n": 1})
