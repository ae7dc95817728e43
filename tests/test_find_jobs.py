"""QueueService.find_jobs (filtered, keyset-paged job list) and count_jobs (jobs by state)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from alkstore_sa import InvalidOptionsError, JobState, QueueService, SchemaFeatureError


def _seed(q: Any) -> None:
    q.create_queue("a")
    q.create_queue("b")
    q.send_many(
        "a", [{"data": {"n": n, "tag": "50%_off" if n == 3 else "plain"}} for n in range(7)]
    )
    q.send("b", {"n": 1}, singleton_key="k1")
    q.send("b", {"n": 2}, start_after=3600)


def _walk(q: Any, **filters: Any) -> list[Any]:
    jobs, cursor = [], None
    while True:
        page = q.find_jobs(after=cursor, limit=3, **filters)
        assert len(page.jobs) <= 3
        jobs.extend(page.jobs)
        if page.next_cursor is None:
            return jobs
        cursor = page.next_cursor


def test_pages_filters_and_counts(env46: Any) -> None:
    env46.tx(_seed)
    q = env46.service()
    everything = _walk(q)
    assert len(everything) == 9 and len({j.id for j in everything}) == 9
    keys = [(j.created_on, j.id) for j in everything]
    assert keys == sorted(keys, reverse=True)
    assert {j.name for j in _walk(q, name="a")} == {"a"} and len(_walk(q, name="a")) == 7
    # send_many wrote the 7 jobs of "a" in one transaction: one created_on, ties
    # that only the id settles, and the pages of 3 above neither skip nor repeat.
    assert len({j.created_on for j in _walk(q, name="a")}) == 1
    # The text filter matches literally: % and _ are not wildcards.
    [discount] = q.find_jobs(text="50%_OFF").jobs
    assert discount.data["n"] == 3
    assert [j.data["n"] for j in q.find_jobs(text="%").jobs] == [3]
    assert [j.data["n"] for j in q.find_jobs(text="_").jobs] == [3]
    # An offset is honoured: an hour ago written at +14:00 still means an hour ago.
    ago = (dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).astimezone(
        dt.timezone(dt.timedelta(hours=14))
    )
    assert len(q.find_jobs(since=ago).jobs) == 9
    assert [j.singleton_key for j in q.find_jobs(key="k1").jobs] == ["k1"]
    assert q.find_jobs("b", state="completed").jobs == []
    assert len(q.find_jobs(since=dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)).jobs) == 9
    assert q.find_jobs(until=dt.datetime(2000, 1, 1, tzinfo=dt.UTC)).jobs == []
    assert q.find_jobs(group="nobody").jobs == []

    counts = {c.name: c for c in q.count_jobs()}
    assert counts["a"].counts == {
        "created": 7,
        **dict.fromkeys(["retry", "active", "completed", "cancelled", "failed"], 0),
    }
    assert counts["a"].oldest_ready_seconds is not None and counts["a"].oldest_ready_seconds >= 0
    assert counts["b"].counts["created"] == 2
    assert [c.name for c in q.count_jobs(["b"])] == ["b"]
    env46.rollback()


def test_schema_26(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        _seed(q)
        assert len(_walk(q)) == 9
        assert q.find_jobs("a", state=JobState.CREATED, limit=1000).jobs[0].name == "a"
        with pytest.raises(SchemaFeatureError):
            q.find_jobs(group="g")


BAD: list[tuple[str, Any]] = [
    ("state", "done"),
    ("after", "not-a-cursor"),
    ("after", "2026-01-01T00:00:00_00000000-0000-0000-0000-000000000000"),  # naive
    ("since", dt.datetime(2026, 1, 1)),
    ("limit", 0),
    ("limit", 1001),
    ("key", ""),
]


def test_bad_filters_refused(engine: Engine, schema46: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        for option, value in BAD:
            with pytest.raises(InvalidOptionsError, match=option):
                q.find_jobs(**{option: value})
        with pytest.raises(InvalidOptionsError):
            q.find_jobs("nul\x00 is no name")
