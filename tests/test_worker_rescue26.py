"""A crashed worker's jobs come back within about a minute at schema 26 too.

26 has no heartbeats, and a job's ``expire_seconds`` is also Node's handler timeout,
so it is left alone. Our worker's claim records each job it activates in
``alkstore_claim`` with the worker's id; the worker renews its ``alkstore_claimer``
row every quarter of its ``liveness_seconds`` and, every half of it, sweeps its queues
for jobs still active in a recorded attempt whose worker stopped renewing. The kill -9
runs are in tests/chaos/test_chaos_rescue26.py, Node's side in
tests/test_interop26_rescue.py.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest
from support.worker import Harness, send, state_of, wait_for

from alkstore_sa import migrate

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def claim_rows(h: Harness) -> list[tuple[uuid.UUID, uuid.UUID]]:
    return [tuple(r) for r in h.sql("SELECT job_id, owner FROM {s}.alkstore_claim")]


def plant_dead_claim(h: Harness, job_id: uuid.UUID, *, ago: int) -> uuid.UUID:
    """Record ``job_id``'s attempt as claimed by a worker last alive ``ago`` seconds ago
    (lapsing after 10 s), as our claim would have."""
    dead = uuid.uuid4()
    h.sql(
        "INSERT INTO {s}.alkstore_claimer (owner, renewed_on, lapse_seconds)"
        " VALUES (:o, now() - make_interval(secs => :ago), 10)",
        o=dead,
        ago=ago,
    )
    h.sql(
        "INSERT INTO {s}.alkstore_claim (job_id, name, started_on, owner)"
        " SELECT id, name, started_on, :o FROM {s}.job WHERE id = :i",
        o=dead,
        i=job_id,
    )
    return dead


def test_a_workers_claim_records_the_job_and_its_worker_renews_one_row(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    release = threading.Event()
    w = h.worker(poll_interval=0.1)
    w.register("q", h.handler(block=release), concurrency=3)
    h.start(w)
    try:
        ids = {send(h, "q") for _ in range(3)}
        wait_for(lambda: ids <= set(h.started))
        rows = claim_rows(h)
        assert {job for job, _ in rows} == ids
        owners = {owner for _, owner in rows}
        assert len(owners) == 1
        [(lapse, fresh)] = h.sql(
            "SELECT lapse_seconds, renewed_on > now() - interval '10 s' FROM {s}.alkstore_claimer"
        )
        assert (lapse, fresh) == (20, True)  # liveness_seconds, by default
        # The recorded attempt is the job's current one.
        for job in ids:
            [(same,)] = h.sql(
                "SELECT j.started_on = c.started_on FROM {s}.job j"
                " JOIN {s}.alkstore_claim c ON c.job_id = j.id WHERE j.id = :i",
                i=job,
            )
            assert same
    finally:
        release.set()
    wait_for(lambda: all(state_of(h, "q", i) == "completed" for i in ids))


def test_a_worker_fails_for_retry_the_jobs_of_a_worker_that_stopped_answering(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q", retry_limit=1))
    job_id = send(h, "q")
    [claimed] = h.service_tx(lambda q: q.fetch("q"))
    assert claimed.id == job_id
    plant_dead_claim(h, job_id, ago=11)
    w = h.worker(poll_interval=0.1, liveness_seconds=10)  # its supervisor is off (harness)
    w.register("q", h.handler(body=lambda job: "again"))
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.worker"):
        h.start(w)
        wait_for(lambda: state_of(h, "q", job_id) == "completed", timeout=10)
    assert time.monotonic() - started < 10  # not the 900 s lease
    job = h.job("q", job_id)
    assert job.retry_count == 1 and job.output == {"value": "again"}
    assert h.started == [job_id]
    [(cause, error)] = h.sql(
        "SELECT cause, error FROM {s}.alkstore_job_attempt WHERE job_id = :i", i=job_id
    )
    assert (cause, error) == ("heartbeat", {"value": {"message": "job heartbeat timeout"}})
    rescued = [r for r in caplog.records if getattr(r, "action", None) == "jobs_rescued"]
    assert rescued and "stopped answering" in rescued[0].getMessage()
    # The first attempt's late settlement is fenced out: it changes nothing.
    done = h.service_tx(lambda q: q.complete("q", [claimed], {"late": True}))
    assert done.affected == []
    assert h.job("q", job_id).output == {"value": "again"}
    # The row, overwritten by the second attempt's claim, goes once that attempt ended.
    wait_for(lambda: all(job != job_id for job, _ in claim_rows(h)), timeout=15)


def test_the_sweep_leaves_jobs_no_worker_of_ours_claimed(harness: Harness) -> None:
    h = harness
    h.service_tx(lambda q: q.create_queue("q"))
    node_like = send(h, "q")
    # Claimed by a client that records nothing (Node pg-boss, or a plain fetch) long ago.
    [claimed] = h.service_tx(lambda q: q.fetch("q"))
    assert claimed.id == node_like
    h.sql("UPDATE {s}.job SET started_on = now() - interval '5 min' WHERE id = :i", i=node_like)
    # And one of a live worker of ours, recorded: alive, so never swept either.
    live = send(h, "q")
    [mine] = h.service_tx(lambda q: q.fetch("q"))
    assert mine.id == live
    alive = uuid.uuid4()
    h.sql("INSERT INTO {s}.alkstore_claimer VALUES (:o, now() + interval '1 h', 10)", o=alive)
    h.sql(
        "INSERT INTO {s}.alkstore_claim SELECT id, name, started_on, :o FROM {s}.job WHERE id = :i",
        o=alive,
        i=live,
    )
    w = h.worker(poll_interval=0.1, liveness_seconds=10)
    w.register("q", h.handler())
    h.start(w)
    time.sleep(10 * 0.5 * 2 + 1)  # three sweeps: at start, then every half liveness_seconds
    assert state_of(h, "q", node_like) == "active"
    assert state_of(h, "q", live) == "active"
    assert h.sql("SELECT count(*) FROM {s}.alkstore_job_attempt")[0][0] == 0


def test_without_the_claim_tables_a_worker_runs_as_before_and_says_so_once(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    h = harness
    h.sql("DROP TABLE {s}.alkstore_claim")
    h.service_tx(lambda q: q.create_queue("q"))
    w = h.worker(poll_interval=0.1, liveness_seconds=10)
    w.register("q", h.handler())
    with caplog.at_level(logging.INFO, logger="alkstore_sa.worker"):
        h.start(w)
        ids = [send(h, "q") for _ in range(3)]
        wait_for(lambda: all(state_of(h, "q", i) == "completed" for i in ids))
        time.sleep(6)  # more than one renewal interval (2.5 s)
    off = [r for r in caplog.records if getattr(r, "action", None) == "claims_unavailable"]
    assert len(off) == 1 and "alkstore db upgrade" in off[0].getMessage()
    errors = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors == []
    # install_attempt_history (as db upgrade and the Alembic hook) makes it again.
    migrate.install_attempt_history(h.engine, h.schema)
    assert h.sql("SELECT to_regclass(:t) IS NOT NULL", t=f'"{h.schema}".alkstore_claim') == [
        (True,)
    ]
