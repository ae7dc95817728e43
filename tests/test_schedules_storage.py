"""Cron schedule storage and publish/subscribe (as pg-boss stores them).

Firing schedules belongs to the supervisor; here: what is stored, in which
names (Node pg-boss reads the same rows), and what is refused.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pytest

from alkstore_sa import InvalidOptionsError, QueueNotFoundError, ScheduleInfo
from alkstore_sa.options import from_pgboss_send_options


@pytest.fixture
def queue(env: Any) -> str:
    env.tx(lambda q: q.create_queue("reports"))
    return "reports"


def schedule_rows(env: Any) -> list[Any]:
    return list(env.sql("SELECT * FROM {s}.schedule ORDER BY name, key"))


# ------------------------------------------------------------------ schedule


def test_schedule_stores_cron_timezone_data_and_options(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "0 6 * * *", {"kind": "daily"}, tz="Europe/Paris"))
    [row] = schedule_rows(env)
    assert (row.name, row.key, row.cron, row.timezone) == (queue, "", "0 6 * * *", "Europe/Paris")
    assert row.data == {"kind": "daily"}
    assert row.options == {"tz": "Europe/Paris", "key": ""}


def test_schedule_options_use_pgboss_names(env: Any) -> None:
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("q"))
    env.tx(
        lambda q: q.schedule(
            "q",
            "*/5 * * * *",
            None,
            key="k1",
            priority=3,
            retry_limit=4,
            retry_delay=5,
            retry_backoff=True,
            retry_delay_max=50,
            expire_seconds=60,
            retention_seconds=70,
            deletion_seconds=80,
            singleton_key="s",
            singleton_seconds=90,
            dead_letter="dlq",
            start_after=dt.timedelta(seconds=15),
        )
    )
    [row] = schedule_rows(env)
    assert row.options == {
        "tz": "UTC",
        "key": "k1",
        "priority": 3,
        "retryLimit": 4,
        "retryDelay": 5,
        "retryBackoff": True,
        "retryDelayMax": 50,
        "expireInSeconds": 60,
        "retentionSeconds": 70,
        "deleteAfterSeconds": 80,
        "singletonKey": "s",
        "singletonSeconds": 90,
        "deadLetter": "dlq",
        "startAfter": 15,
    }


START_AFTER_STORED: list[tuple[Any, Any]] = [
    (
        dt.datetime(2031, 5, 6, 9, 8, 9, tzinfo=dt.timezone(dt.timedelta(hours=2))),
        "2031-05-06T07:08:09.000Z",
    ),
    ("2031-05-06T09:08:09+02:00", "2031-05-06T07:08:09.000Z"),
    ("45", 45),
    (1.5, 1.5),
    (dt.timedelta(minutes=2), 120),
]


def test_schedule_start_after_is_stored_in_a_form_node_accepts(env: Any, queue: str) -> None:
    # pg-boss casts text ending in Z to a time and anything else to an interval.
    for start_after, stored in START_AFTER_STORED:
        env.tx(lambda q, s=start_after: q.schedule(queue, "* * * * *", None, start_after=s))
        [row] = schedule_rows(env)
        assert row.options["startAfter"] == stored, start_after


def test_stored_options_read_back_as_send_options(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "* * * * *", None, retry_limit=1, priority=2))
    [info] = env.tx(lambda q: q.get_schedules(queue))
    assert from_pgboss_send_options(info.options) == {"retry_limit": 1, "priority": 2}


def test_schedule_again_replaces_the_schedule(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "* * * * *", {"v": 1}, retry_limit=1))
    [first] = schedule_rows(env)
    time.sleep(0.01)
    env.tx(lambda q: q.schedule(queue, "0 * * * *", {"v": 2}))
    [row] = schedule_rows(env)
    assert (row.cron, row.data, row.options) == ("0 * * * *", {"v": 2}, {"tz": "UTC", "key": ""})
    assert row.created_on == first.created_on
    assert row.updated_on > first.updated_on


def test_schedules_with_different_keys_coexist(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "* * * * *", key="a"))
    env.tx(lambda q: q.schedule(queue, "0 * * * *", key="b"))
    assert [(r.key, r.cron) for r in schedule_rows(env)] == [("a", "* * * * *"), ("b", "0 * * * *")]


def test_six_field_cron_with_seconds_is_accepted(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "*/30 * * * * *"))
    assert [r.cron for r in schedule_rows(env)] == ["*/30 * * * * *"]


def test_cron_whitespace_is_normalised(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "  0   6 * * 1-5 "))
    assert [r.cron for r in schedule_rows(env)] == ["0 6 * * 1-5"]


def test_invalid_cron_is_refused_naming_cron(env: Any, queue: str) -> None:
    for cron in ["", "not a cron", "61 * * * *", "* * * *", "* * 32 * *", 5]:
        with pytest.raises(InvalidOptionsError) as caught:
            env.tx(lambda q, c=cron: q.schedule(queue, c))
        assert caught.value.option == "cron", cron
    assert schedule_rows(env) == []


def test_invalid_time_zone_is_refused_naming_tz(env: Any, queue: str) -> None:
    for tz in ["Mars/Olympus", "", "UTC+25", None]:
        with pytest.raises(InvalidOptionsError) as caught:
            env.tx(lambda q, z=tz: q.schedule(queue, "* * * * *", tz=z))
        assert caught.value.option == "tz", tz
    assert schedule_rows(env) == []


def test_schedule_with_an_invalid_send_option_is_refused(env: Any, queue: str) -> None:
    with pytest.raises(InvalidOptionsError, match="retry_limit"):
        env.tx(lambda q: q.schedule(queue, "* * * * *", retry_limit=-1))
    assert schedule_rows(env) == []


def test_schedule_with_unencodable_data_is_refused(env: Any, queue: str) -> None:
    with pytest.raises(InvalidOptionsError, match="data"):
        env.tx(lambda q: q.schedule(queue, "* * * * *", {1, 2}))


def test_schedule_for_a_missing_queue_raises_queue_not_found(env: Any) -> None:
    with pytest.raises(QueueNotFoundError, match="'nope'"):
        env.tx(lambda q: q.schedule("nope", "* * * * *"))


def test_schedule_key_must_be_text(env: Any, queue: str) -> None:
    with pytest.raises(InvalidOptionsError, match="key"):
        env.tx(lambda q: q.schedule(queue, "* * * * *", key=3))


# ------------------------------------------------------------------ read and remove


def test_get_schedules_returns_records(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "* * * * *", [1, 2], key="k", tz="America/New_York"))
    [info] = env.tx(lambda q: q.get_schedules())
    assert isinstance(info, ScheduleInfo)
    assert (info.name, info.key, info.cron, info.timezone, info.data) == (
        queue,
        "k",
        "* * * * *",
        "America/New_York",
        [1, 2],
    )


def test_get_schedules_filters_by_queue_and_key(env: Any) -> None:
    env.tx(lambda q: q.create_queue("a"))
    env.tx(lambda q: q.create_queue("b"))
    for name, key in (("a", ""), ("a", "x"), ("b", "")):
        env.tx(lambda q, n=name, k=key: q.schedule(n, "* * * * *", key=k))
    everything = env.tx(lambda q: q.get_schedules())
    assert [(i.name, i.key) for i in everything] == [("a", ""), ("a", "x"), ("b", "")]
    assert [(i.name, i.key) for i in env.tx(lambda q: q.get_schedules("a"))] == [
        ("a", ""),
        ("a", "x"),
    ]
    assert [(i.name, i.key) for i in env.tx(lambda q: q.get_schedules("a", "x"))] == [("a", "x")]
    assert env.tx(lambda q: q.get_schedules("b", "x")) == []


def test_unschedule_removes_one_schedule(env: Any, queue: str) -> None:
    env.tx(lambda q: q.schedule(queue, "* * * * *"))
    env.tx(lambda q: q.schedule(queue, "* * * * *", key="other"))
    assert env.tx(lambda q: q.unschedule(queue)) is True
    assert [r.key for r in schedule_rows(env)] == ["other"]


def test_unschedule_of_nothing_returns_false(env: Any, queue: str) -> None:
    assert env.tx(lambda q: q.unschedule(queue, "absent")) is False


# ------------------------------------------------------------------ publish / subscribe


def test_publish_sends_to_every_subscribed_queue(env: Any) -> None:
    for name in ("a", "b", "c"):
        env.tx(lambda q, n=name: q.create_queue(n))
    env.tx(lambda q: q.subscribe("order.paid", "a"))
    env.tx(lambda q: q.subscribe("order.paid", "b"))
    env.tx(lambda q: q.subscribe("other", "c"))
    ids = env.tx(lambda q: q.publish("order.paid", {"order": 1}, priority=2))
    rows = env.sql("SELECT id, name, data, priority FROM {s}.job ORDER BY name")
    assert [(r.name, r.data, r.priority) for r in rows] == [
        ("a", {"order": 1}, 2),
        ("b", {"order": 1}, 2),
    ]
    assert ids == [r.id for r in rows]


def test_publish_without_subscribers_sends_nothing(env: Any, queue: str) -> None:
    assert env.tx(lambda q: q.publish("nobody-listens", None)) == []
    assert env.sql("SELECT count(*) FROM {s}.job") == [(0,)]


def test_subscribe_twice_keeps_one_subscription(env: Any, queue: str) -> None:
    env.tx(lambda q: q.subscribe("e", queue))
    env.tx(lambda q: q.subscribe("e", queue))
    assert env.sql("SELECT event, name FROM {s}.subscription") == [("e", queue)]


def test_unsubscribe_stops_delivery(env: Any, queue: str) -> None:
    env.tx(lambda q: q.subscribe("e", queue))
    assert env.tx(lambda q: q.unsubscribe("e", queue)) is True
    assert env.tx(lambda q: q.unsubscribe("e", queue)) is False
    assert env.tx(lambda q: q.publish("e", None)) == []


def test_subscribe_to_a_missing_queue_raises_queue_not_found(env: Any) -> None:
    with pytest.raises(QueueNotFoundError, match="'nope'"):
        env.tx(lambda q: q.subscribe("e", "nope"))


def test_event_must_be_non_empty_text(env: Any, queue: str) -> None:
    for event in ["", None, 3]:
        with pytest.raises(InvalidOptionsError, match="event"):
            env.tx(lambda q, e=event: q.subscribe(e, queue))
        with pytest.raises(InvalidOptionsError, match="event"):
            env.tx(lambda q, e=event: q.publish(e, None))
