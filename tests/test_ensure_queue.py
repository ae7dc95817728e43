"""create_queue never ignores changed options silently; ensure_queue makes a queue match."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from alkstore_sa import InvalidOptionsError, QueuePolicy


def test_create_queue_warns_naming_each_ignored_option(
    env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    env.tx(lambda q: q.create_queue("payments"))
    with caplog.at_level(logging.WARNING, logger="alkstore_sa.ops.queues"):
        info = env.tx(lambda q: q.create_queue("payments", retry_limit=7, retry_delay=5))
    assert info.retry_limit == 2  # unchanged, as pg-boss does
    [record] = [r for r in caplog.records if r.name == "alkstore_sa.ops.queues"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "'payments'" in message
    assert "retry_limit 2 -> 7" in message and "retry_delay 0 -> 5" in message
    assert "ensure_queue" in message
    assert record.ignored == {"retry_limit": (2, 7), "retry_delay": (0, 5)}  # type: ignore[attr-defined]


def test_create_queue_with_the_same_options_says_nothing(
    env: Any, caplog: pytest.LogCaptureFixture
) -> None:
    env.tx(lambda q: q.create_queue("payments", retry_limit=7, policy="short"))
    with caplog.at_level(logging.DEBUG, logger="alkstore_sa.ops.queues"):
        env.tx(lambda q: q.create_queue("payments", retry_limit=7, policy=QueuePolicy.SHORT))
    assert [r for r in caplog.records if r.name == "alkstore_sa.ops.queues"] == []


def test_ensure_queue_creates_a_missing_queue(env: Any) -> None:
    info = env.tx(lambda q: q.ensure_queue("payments", retry_limit=7))
    assert info.name == "payments" and info.retry_limit == 7


def test_ensure_queue_changes_only_the_options_given(env: Any) -> None:
    env.tx(lambda q: q.create_queue("payments", retry_delay=5, expire_seconds=60))
    info = env.tx(lambda q: q.ensure_queue("payments", retry_limit=7, retry_delay=5))
    assert (info.retry_limit, info.retry_delay, info.expire_seconds) == (7, 5, 60)
    assert env.tx(lambda q: q.get_queue("payments")).retry_limit == 7


def test_ensure_queue_refuses_a_policy_change_before_any_write(env: Any) -> None:
    env.tx(lambda q: q.create_queue("payments"))
    svc = env.service()
    with pytest.raises(InvalidOptionsError, match=r"policy.*cannot be changed"):
        svc.ensure_queue("payments", policy="singleton", retry_limit=7)
    # The caller's transaction is still usable and nothing was written.
    assert svc.get_queue("payments").retry_limit == 2
    env.commit()


def test_ensure_queue_refuses_bad_input(env: Any) -> None:
    with pytest.raises(InvalidOptionsError, match="retry_limit"):
        env.tx(lambda q: q.ensure_queue("payments", retry_limit=-1))
    assert env.tx(lambda q: q.get_queue("payments")) is None


def test_ensure_queue_at_schema_46(env46: Any) -> None:
    env46.tx(lambda q: q.create_queue("payments", heartbeat_seconds=30))
    info = env46.tx(lambda q: q.ensure_queue("payments", heartbeat_seconds=60, retry_limit=7))
    assert (info.heartbeat_seconds, info.retry_limit) == (60, 7)
