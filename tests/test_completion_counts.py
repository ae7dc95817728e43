"""``QueueService.count_completions``: completed jobs per queue and time bucket, from the job
table (docs/how-to/observability.md), and the dashboard's sparkline without history."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from starlette.testclient import TestClient
from support.direct import rows

from alkstore_sa import InvalidOptionsError, QueueService, SchemaFeatureError
from alkstore_sa.dashboard import create_app

UTC = dt.UTC


def _completed(engine: Engine, schema: str, queue: str, minutes_ago: list[int]) -> None:
    """Jobs of ``queue`` completed that many minutes ago (the time set by hand)."""
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        ids = [q.send(queue, {"n": n}) for n in range(len(minutes_ago))]
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        fetched = q.fetch(queue, batch_size=len(ids))
        q.complete(queue, [j.id for j in fetched])
    for job_id, ago in zip(ids, minutes_ago, strict=True):
        rows(
            engine,
            schema,
            "UPDATE {s}.job SET completed_on = now() - make_interval(mins => :m) WHERE id = :id",
            m=ago,
            id=job_id,
        )


def test_completions_are_counted_per_queue_and_bucket(engine: Engine, schema46: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.create_queue("mail")
        q.create_queue("sms", retry_limit=0)
        q.send("sms", {})
    _completed(engine, schema46, "mail", [2, 3, 12, 50, 70])
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        [job] = q.fetch("sms")
        q.fail("sms", job.id, {"error": "not a completion"})
        since = dt.datetime.now(UTC) - dt.timedelta(hours=1)
        counts = q.count_completions(["mail", "sms", "nobody"], since=since, bucket_seconds=600)
    # Six buckets of ten minutes, oldest first: 50 min ago, then 12, then 2 and 3.
    assert counts == {
        "mail": [1, 0, 0, 0, 1, 2],
        "sms": [0] * 6,
        "nobody": [0] * 6,
    }


@pytest.mark.parametrize(
    ("names", "since", "bucket", "option"),
    [
        ("mail", None, 300, "names"),
        (["mail"], dt.datetime(2030, 1, 1), 300, "since"),  # naive
        (["mail"], dt.datetime(2999, 1, 1, tzinfo=UTC), 300, "since"),  # the future
        (["mail"], None, 0, "bucket_seconds"),
        (["mail"], dt.datetime(2000, 1, 1, tzinfo=UTC), 60, "bucket_seconds"),  # too many
        (["x" * 2000], None, 300, "names"),
    ],
)
def test_bad_arguments_are_refused_before_any_sql(
    engine: Engine, schema46: str, names: Any, since: Any, bucket: Any, option: str
) -> None:
    start = dt.datetime.now(UTC) - dt.timedelta(hours=1) if since is None else since
    with Session(engine) as session, session.begin():
        with pytest.raises(InvalidOptionsError) as refused:
            QueueService(session, schema=schema46).count_completions(
                names, since=start, bucket_seconds=bucket
            )
        assert refused.value.option == option


def test_a_schema_at_26_has_no_completion_index(engine: Engine, schema: str) -> None:
    since = dt.datetime.now(UTC) - dt.timedelta(hours=1)
    with (
        Session(engine) as session,
        session.begin(),
        pytest.raises(SchemaFeatureError, match="completion counts"),
    ):
        QueueService(session, schema=schema).count_completions(["q"], since=since)


def test_the_overview_draws_the_last_hour_when_no_history_is_kept(
    engine: Engine, schema46: str
) -> None:
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("mail")
    _completed(engine, schema46, "mail", [1, 1, 20])
    client = TestClient(create_app(engine, schemas=[schema46]), base_url="http://127.0.0.1")
    page = client.get("/").text
    assert 'class="spark recent"' in page
    assert re.search(r"3 in the last hour, from the job table", page)
    assert "persist_queue_stats=True" in page
