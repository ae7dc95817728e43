"""A :class:`~alkstore_sa.Settlement`'s ``started_on`` goes through the same UTC
normalisation as every other time: any offset Python allows (16 hours or more, or not a
whole minute, which PostgreSQL refuses in a ``timestamptz``) names the same instant and
fences as the fetched job's own; a time with no instant in Python's range once in UTC is
refused with :class:`~alkstore_sa.InvalidOptionsError` naming ``started_on``, before
anything is written, and the caller's transaction goes on."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from alkstore_sa import InvalidOptionsError, QueueService, Settlement

# Offsets Python allows: ordinary ones, ones PostgreSQL refuses (16 hours or more), and
# ones that are not a whole minute.
OFFSETS = [
    dt.timedelta(0),
    dt.timedelta(hours=5, minutes=30),
    dt.timedelta(hours=-15, minutes=-59),
    dt.timedelta(hours=16),
    dt.timedelta(hours=-16),
    dt.timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
    -dt.timedelta(hours=23, minutes=59, seconds=59, microseconds=999999),
    dt.timedelta(hours=1, microseconds=500000),
    -dt.timedelta(microseconds=1),
]
SETTLES: dict[str, Callable[[QueueService, list[Settlement]], list[uuid.UUID]]] = {
    "complete_many": lambda q, items: q.complete_many("q", items).affected,
    "fail_many": lambda q, items: q.fail_many("q", items).affected,
    "extend_leases": lambda q, items: q.extend_leases("q", items, 60),
}


def tx(engine: Engine, schema: str, work: Callable[[QueueService], Any]) -> Any:
    with Session(engine) as session, session.begin():
        return work(QueueService(session, schema=schema))


def fetched(engine: Engine, schema: str) -> Any:
    def work(q: QueueService) -> Any:
        q.create_queue("q")
        q.send("q", None)
        [job] = q.fetch("q")
        return job

    return tx(engine, schema, work)


@pytest.mark.parametrize("offset", OFFSETS, ids=str)
@pytest.mark.parametrize("call", sorted(SETTLES))
def test_the_fetched_instant_at_any_offset_fences_as_the_job_s_own(
    engine: Engine, schema46: str, call: str, offset: dt.timedelta
) -> None:
    job = fetched(engine, schema46)
    assert job.started_on is not None
    same = job.started_on.astimezone(dt.timezone(offset))
    affected = tx(engine, schema46, lambda q: SETTLES[call](q, [Settlement(job.id, 1, same)]))
    assert affected == [job.id]


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-1))),
        dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(microseconds=1))),
        dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=16))),
        dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(seconds=1))),
    ],
    ids=str,
)
@pytest.mark.parametrize("call", sorted(SETTLES))
def test_a_time_outside_the_utc_range_is_refused_and_the_transaction_goes_on(
    engine: Engine, schema46: str, call: str, when: dt.datetime
) -> None:
    job = fetched(engine, schema46)
    with Session(engine) as session:
        q = QueueService(session, schema=schema46)
        with pytest.raises(InvalidOptionsError, match="outside") as caught:
            SETTLES[call](q, [Settlement(job.id, 1, when)])
        assert caught.value.option == "started_on"
        # Nothing was sent to the server: the transaction still writes and commits.
        q.send("q", {"after": True})
        session.commit()
    with engine.connect() as conn:
        rows = conn.execute(
            text(f"SELECT state FROM \"{schema46}\".job WHERE name = 'q' ORDER BY created_on")
        ).all()
    assert [r.state for r in rows] == ["active", "created"]


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=16))),
        dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=-16))),
    ],
    ids=str,
)
def test_an_extreme_time_inside_the_utc_range_settles_nothing(
    engine: Engine, schema46: str, when: dt.datetime
) -> None:
    job = fetched(engine, schema46)
    done = tx(engine, schema46, lambda q: q.complete_many("q", [Settlement(job.id, 1, when)]))
    assert done.affected == []


def test_a_settlement_s_id_as_text_is_the_job_s_id(engine: Engine, schema46: str) -> None:
    job = fetched(engine, schema46)
    tx(engine, schema46, lambda q: q.send("q", None))
    # A finished job named by its id as text: per_job says not_active, as for a UUID.
    tx(engine, schema46, lambda q: q.complete("q", job))
    items = [Settlement(str(job.id), None, job.started_on)]  # type: ignore[arg-type]
    done = tx(engine, schema46, lambda q: q.complete_many("q", items, per_job=True))
    [outcome] = done.outcomes
    assert (outcome.id, outcome.reason, str(outcome.state)) == (job.id, "not_active", "completed")
