"""Reading queue-stats history at schema 46: ``get_queue_stats_history`` (pg-boss 12.38's
``getQueueStats`` with history on), raw rows and epoch-aligned buckets, on rows placed
here with known values (and on rows a supervision pass wrote). Refused at 26."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from alkstore_sa import QueueService, QueueStatsSnapshot
from alkstore_sa.errors import InvalidOptionsError, QueueNotFoundError, SchemaFeatureError
from alkstore_sa.ops.observe import percentile
from alkstore_sa.sql.v46.stats import create_partition

T0 = dt.datetime(2026, 3, 1, 12, 0, 0, tzinfo=dt.UTC)  # a multiple of 60 s since the epoch


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def bins(**slots: int) -> list[int | None]:
    out: list[int | None] = [None] * 48
    for key, n in slots.items():
        out[int(key[1:])] = n
    return out


def put(engine: Engine, schema: str, captured: float, queued: int, **extra: Any) -> None:
    """A queue_stats row of queue 'q' captured at ``at(captured)``."""
    values = {
        "name": "q",
        "captured_on": at(captured),
        "queued_count": queued,
        "deferred_count": extra.pop("deferred", 0),
        "total_count": queued + 100,
        **extra,
    }
    if "delta_on" in values:
        values["delta_on"] = at(values["delta_on"])
    cols = ", ".join(values)
    marks = ", ".join(f":{k}" for k in values)
    with engine.begin() as conn:
        conn.execute(text(f'INSERT INTO "{schema}".queue_stats ({cols}) VALUES ({marks})'), values)


def history(engine: Engine, schema: str, name: str = "q", **options: Any) -> Any:
    with Session(engine) as session, session.begin():
        return QueueService(session, schema=schema).get_queue_stats_history(name, **options)


@pytest.fixture
def series(engine: Engine, schema46: str) -> str:
    """Queue 'q' with six captures: three in [0, 60), two in [60, 120), one at 190.

    The counters of the captures at 70 and 130 count windows ending at 60 and 120
    (10 s behind); the one at 190 ends at 180, a bucket of 60 s with no capture."""
    with Session(engine) as session, session.begin():
        QueueService(session, schema=schema46).create_queue("q")
        session.execute(create_partition(schema46, T0.date()))  # queue_stats is by day
    put(engine, schema46, 5, 10)
    put(engine, schema46, 25, 30, deferred=2)
    put(engine, schema46, 45, 21)
    w = {"wait_bins": bins(s3=2, s7=1), "run_bins": bins(s5=3)}
    put(engine, schema46, 70, 7, created_delta=4, completed_delta=3, failed_delta=0,
        delta_seconds=60, delta_on=60, ready_oldest_seconds=9, **w)  # fmt: skip
    put(engine, schema46, 110, 8, created_delta=1, completed_delta=2, failed_delta=1,
        delta_seconds=40, delta_on=100, ready_oldest_seconds=4,
        wait_bins=bins(s3=1), run_bins=bins(s6=3))  # fmt: skip
    put(engine, schema46, 190, 3, created_delta=5, completed_delta=5, failed_delta=0,
        delta_seconds=80, delta_on=180, wait_bins=bins(s1=5), run_bins=bins(s2=5))  # fmt: skip
    return schema46


def test_raw_rows_newest_first_within_from_to_and_limit(engine: Engine, series: str) -> None:
    rows = history(engine, series)
    assert all(isinstance(r, QueueStatsSnapshot) for r in rows)
    assert [r.queued_count for r in rows] == [3, 8, 7, 21, 30, 10]
    assert rows[0].captured_on == at(190) and rows[0].delta_on == at(180)
    assert rows[-1].created_delta is None and rows[-1].wait_bins is None  # not counted
    # A slot stored as NULL reads as 0; the histogram has its 48 slots.
    assert rows[1].wait_bins is not None and len(rows[1].wait_bins) == 48
    assert rows[1].wait_bins[3] == 1 and rows[1].wait_bins[0] == 0
    window = history(engine, series, from_=at(25), to=at(110))
    assert [r.queued_count for r in window] == [8, 7, 21, 30]
    assert [r.queued_count for r in history(engine, series, limit=2)] == [3, 8]
    assert rows[0].percentiles is None


def test_buckets_collapse_gauges_and_sum_counters(engine: Engine, series: str) -> None:
    rows = history(engine, series, bucket_seconds=60)
    # Buckets at 0, 60 and 180; the counters ending at 60 belong to bucket 60.
    assert [r.captured_on for r in rows] == [at(180), at(60), at(0)]
    b180, b60, b0 = rows
    assert (b0.queued_count, b0.deferred_count) == (30, 2)  # max
    assert b0.created_delta is None and b0.wait_bins is None  # nothing counted in [0, 60)
    assert (b60.queued_count, b60.created_delta, b60.completed_delta, b60.failed_delta) == (
        8,
        5,
        5,
        1,
    )
    assert b60.delta_seconds == 100 and b60.delta_on == at(100)
    assert b60.ready_oldest_seconds == 9
    assert b60.wait_bins is not None and b60.run_bins is not None
    assert (b60.wait_bins[3], b60.wait_bins[7], b60.run_bins[5], b60.run_bins[6]) == (3, 1, 3, 3)
    assert sum(b60.wait_bins) == 4
    assert (b180.queued_count, b180.created_delta) == (3, 5)

    low = history(engine, series, bucket_seconds=60, aggregate="min")
    assert [r.queued_count for r in low] == [3, 7, 10]
    avg = history(engine, series, bucket_seconds=60, aggregate="avg")
    assert [r.queued_count for r in avg] == [3, 8, 20]  # 7.5 rounds half away from zero
    # The newest buckets only, at most limit.
    assert [r.captured_on for r in history(engine, series, bucket_seconds=60, limit=2)] == [
        at(180),
        at(60),
    ]


def test_counters_of_a_bucket_without_captures_fold_into_the_one_before(
    engine: Engine, series: str
) -> None:
    # 30 s buckets: the capture at 190 is in [180, 210), its counters (delta_on 180) too;
    # the counters ending at 60 land in [60, 90), where the capture at 70 is; those ending
    # at 100 land in [90, 120), where the capture at 110 is. Now take from=61: the counters
    # ending at 60 are out, and those at 100 stay.
    rows = history(engine, series, bucket_seconds=30, from_=at(61))
    assert [r.captured_on for r in rows] == [at(180), at(90), at(60)]
    assert rows[2].created_delta is None and rows[1].created_delta == 1
    # Counters whose bucket has no capture: a 20 s bucket at [100, 120) holds the capture
    # at 110; with to=105 that capture is out, and the counters ending at 100 fold into the
    # newest bucket with a capture before them, [60, 80).
    folded = history(engine, series, bucket_seconds=20, from_=at(50), to=at(105))
    assert [r.captured_on for r in folded] == [at(60)]
    assert folded[0].created_delta == 4 + 1 and folded[0].queued_count == 7


def epoch_bucket(seconds: float, width: int) -> dt.datetime:
    start = (T0.timestamp() + seconds) // width * width
    return dt.datetime.fromtimestamp(start, dt.UTC)


def test_max_data_points_picks_the_width(engine: Engine, series: str) -> None:
    # The captures span 185 s (5 to 190): 4 points means buckets of ceil(185 / 4) = 47 s.
    rows = history(engine, series, max_data_points=4)
    expected = sorted({epoch_bucket(c, 47) for c in (5, 25, 45, 70, 110, 190)}, reverse=True)
    assert [r.captured_on for r in rows] == expected[:4]
    # from/to narrow the span: 60 s from 50 to 110 in 2 points is 30 s buckets.
    narrowed = history(engine, series, max_data_points=2, from_=at(50), to=at(110))
    assert [r.captured_on for r in narrowed] == [epoch_bucket(110, 30), epoch_bucket(70, 30)]
    one = history(engine, series, max_data_points=1)
    assert len(one) == 1 and one[0].queued_count == 30  # one bucket of 185 s: the max


def test_percentiles_read_from_each_snapshot(engine: Engine, series: str) -> None:
    rows = history(engine, series, bucket_seconds=60, percentiles=[50, 100, 50])
    b180, b60, b0 = rows
    assert b0.percentiles is not None and [p.p for p in b0.percentiles] == [50, 100]
    assert b0.percentiles[0].wait_seconds is None  # no histogram, no percentile
    assert b60.percentiles is not None and b180.percentiles is not None
    assert b60.percentiles[0].wait_seconds == percentile(b60.wait_bins, 50)
    # Slot 3 holds 3 of 4 waits: the median lies in it, between 10 ms·√2² and 10 ms·√2³.
    p50 = b60.percentiles[0].wait_seconds
    assert p50 is not None and 0.02 <= p50 <= 0.0283
    assert percentile([0] * 47 + [2], 99) == pytest.approx(0.01 * 2**23)  # past the last edge
    assert percentile([3] + [0] * 47, 50) == 0.01  # under the first edge


def test_bad_options_are_refused_before_any_sql(engine: Engine, series: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=series)
        bad: dict[str, Any]
        for bad in (
            {"limit": 0},
            {"limit": 100_001},
            {"from_": dt.datetime(2026, 1, 1)},  # naive
            {"to": "yesterday"},
            {"bucket_seconds": 0},
            {"max_data_points": 1.5},
            {"bucket_seconds": 60, "aggregate": "sum"},
            {"percentiles": []},
            {"percentiles": [0]},
            {"percentiles": [101]},
            {"percentiles": 50},
        ):
            with pytest.raises(InvalidOptionsError):
                q.get_queue_stats_history("q", **bad)
        with pytest.raises(QueueNotFoundError):
            q.get_queue_stats_history("nope")
        assert len(q.get_queue_stats_history("q")) == 6  # the transaction is usable


def test_rows_a_supervision_pass_writes_are_read_back(engine: Engine, schema46: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema46)
        q.create_queue("live")
        for n in range(3):
            q.send("live", {"n": n})
    with Session(engine) as session, session.begin():
        report = QueueService(session, schema=schema46).supervise(
            "live", force=True, persist_queue_stats=True
        )
    assert report.recorded == ("live",)
    [row] = history(engine, schema46, "live")
    assert row.name == "live" and row.queued_count == 3 and row.total_count == 3
    [bucket] = history(engine, schema46, "live", bucket_seconds=3600)
    assert bucket.queued_count == 3


def test_refused_at_26(engine: Engine, schema: str) -> None:
    with Session(engine) as session, session.begin():
        q = QueueService(session, schema=schema)
        q.create_queue("q")
        with pytest.raises(SchemaFeatureError, match=r"queue-stats history needs .* 46"):
            q.get_queue_stats_history("q")
        assert q.get_queue("q") is not None  # nothing poisoned


def test_the_three_readers_in_both_services(env46: Any) -> None:
    """Sync and async (``AsyncQueueService``, generated) answer alike."""
    env46.tx(lambda q: q.create_queue("both"))
    env46.tx(lambda q: q.send("both"))
    env46.tx(lambda q: q.supervise("both", force=True, persist_queue_stats=True))
    s = f'"{env46.schema}"'
    with env46.engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {s}.warning (type, message) VALUES ('index_bloat', 'x');"
                f"INSERT INTO {s}.instance (id, host, pid, version, node_version, "
                "heartbeat_seconds, supervise, schedule, migrate, persist_queue_stats, "
                "persist_warnings) VALUES (gen_random_uuid(), 'h', 1, '12.38.0', 'v22', 30, "
                "false, false, false, false, false)"
            )
        )
    q = env46.service()
    [point] = q.get_queue_stats_history("both", bucket_seconds=60, percentiles=[50])
    assert point.queued_count == 1 and point.percentiles is not None
    assert [w.type for w in q.get_warnings()] == ["index_bloat"]
    [instance] = q.get_instances()
    assert instance.live and instance.version == "12.38.0"
    env46.commit()
