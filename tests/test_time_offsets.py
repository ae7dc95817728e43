"""Aware datetimes with any UTC offset Python allows (up to 23:59) are taken as the same
instant in UTC: PostgreSQL's ``timestamptz`` refuses an offset of 16 hours or more, which
reached the server as a raw error and spoiled the caller's transaction. A time that is
outside Python's range once in UTC is refused with ``InvalidOptionsError`` before any SQL.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from support.refusals import refused_in_transaction

EAST = dt.timezone(dt.timedelta(hours=16))
WEST = dt.timezone(-dt.timedelta(hours=23, minutes=59))
WHEN = dt.datetime(2030, 1, 2, 3, 4, 5, tzinfo=EAST)


def _upsert(q: Any, when: Any) -> uuid.UUID:
    assert q.upsert("q", 1, singleton_key="k", start_after=when).inserted == 1
    return q.find_jobs("q", key="k").jobs[0].id  # type: ignore[no-any-return]


SENDS: dict[str, Callable[[Any, Any], uuid.UUID]] = {
    "send": lambda q, when: q.send("q", None, start_after=when),
    "send text": lambda q, when: q.send("q", None, start_after=when.isoformat()),
    "send_after": lambda q, when: q.send_after("q", None, when),
    "send_many": lambda q, when: q.send_many("q", [{"data": 1, "start_after": when}])[0],
    "send_throttled": lambda q, when: q.send_throttled("q", None, 60, "t", start_after=when),
    "upsert": _upsert,
}


@pytest.mark.parametrize("tz", [EAST, WEST], ids=["+16:00", "-23:59"])
@pytest.mark.parametrize("call", list(SENDS), ids=list(SENDS))
def test_start_after_with_any_offset_is_stored_as_the_same_instant(
    env46_sync: Any, call: str, tz: dt.timezone
) -> None:
    env = env46_sync
    env.tx(lambda q: q.create_queue("q"))
    when = WHEN.replace(tzinfo=tz)
    svc = env.service()
    mine = svc.send("q", {"mine": 1})
    job = SENDS[call](svc, when)
    env.commit()
    [(stored,)] = env.sql("SELECT start_after FROM {s}.job WHERE id = :id", id=job)
    assert stored == when
    assert env.sql("SELECT count(*) FROM {s}.job WHERE id = :id", id=mine) == [(1,)]


def test_start_after_with_16_hours_offset_at_26(env: Any) -> None:
    env.tx(lambda q: q.create_queue("q"))
    svc = env.service()
    ids = svc.send_many("q", [{"data": 1, "start_after": WHEN}, {"data": 2}])
    env.commit()
    [(stored,)] = env.sql("SELECT start_after FROM {s}.job WHERE id = :id", id=ids[0])
    assert stored == WHEN


END = dt.datetime.max.replace(tzinfo=dt.timezone(-dt.timedelta(hours=1)))
START = dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=1)))

FILTERS: dict[str, tuple[str, Callable[[Any, Any], Any]]] = {
    "find_jobs since": ("since", lambda q, t: q.find_jobs("q", since=t)),
    "find_jobs until": ("until", lambda q, t: q.find_jobs(until=t)),
    "find_jobs after": (
        "after",
        lambda q, t: q.find_jobs("q", after=f"{t.isoformat()}_{uuid.uuid4()}"),
    ),
    "redrive": ("created_before", lambda q, t: q.redrive("dlq", "q", created_before=t)),
    "get_queue_stats_history": ("from_", lambda q, t: q.get_queue_stats_history("q", from_=t)),
    "get_warnings": ("since", lambda q, t: q.get_warnings(since=t)),
    "supervise": ("now", lambda q, t: q.supervise(now=t, force=True)),
}


@pytest.mark.parametrize("at", [END, START], ids=["max-01:00", "min+01:00"])
@pytest.mark.parametrize("call", list(FILTERS), ids=list(FILTERS))
def test_a_time_outside_pythons_range_in_utc_is_refused_before_sql(
    env46_sync: Any, call: str, at: dt.datetime
) -> None:
    env = env46_sync
    env.tx(lambda q: (q.create_queue("q"), q.create_queue("dlq")))
    option, fn = FILTERS[call]
    refused = refused_in_transaction(env, "q", lambda svc: fn(svc, at))
    assert refused.option == option
    assert "outside Python's datetime range in UTC" in refused.problem
