"""The process-wide LISTEN connection that wakes workers."""

from __future__ import annotations

import queue
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from support.worker import wait_for

from alkstore_sa.worker import Listener
from alkstore_sa.worker._base import listen_conninfo


@pytest.fixture
def listener(engine: Engine) -> Iterator[Listener]:
    lst = Listener.acquire(listen_conninfo(engine.url))
    yield lst
    lst.release()


def notify(engine: Engine, channel: str, payload: str) -> None:
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_notify(:c, :p)"), {"c": channel, "p": payload})


def channel_name() -> str:
    # Mixed case on purpose: channels are case-sensitive and must be quoted.
    return f"alkstore_Test_{uuid.uuid4().hex[:8]}"


def test_subscriber_receives_the_payload_of_each_notification(
    listener: Listener, engine: Engine
) -> None:
    channel, got = channel_name(), queue.SimpleQueue[str | None]()
    sub = listener.subscribe(channel, got.put)
    assert listener.wait_listening(channel, 5)
    notify(engine, channel, "emails")
    assert got.get(timeout=5) == "emails"
    listener.unsubscribe(sub)


def test_notification_of_a_rolled_back_transaction_is_never_delivered(
    listener: Listener, engine: Engine
) -> None:
    channel, got = channel_name(), queue.SimpleQueue[str | None]()
    listener.subscribe(channel, got.put)
    assert listener.wait_listening(channel, 5)
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_notify(:c, 'lost')"), {"c": channel})
        conn.rollback()
    notify(engine, channel, "kept")
    assert got.get(timeout=5) == "kept"


def test_listener_reconnects_and_tells_subscribers_to_look_again(
    listener: Listener, engine: Engine
) -> None:
    channel, got = channel_name(), queue.SimpleQueue[str | None]()
    listener.subscribe(channel, got.put)
    assert listener.wait_listening(channel, 5)
    pid, connects = listener.backend_pid, listener.connects
    with engine.begin() as conn:
        conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
    assert got.get(timeout=5) is None  # "reconnected: something may have been missed"
    assert listener.connects == connects + 1 and listener.backend_pid != pid
    assert listener.wait_listening(channel, 5)
    notify(engine, channel, "after")
    assert got.get(timeout=5) == "after"


def test_one_connection_is_shared_by_every_user_in_the_process(engine: Engine) -> None:
    conninfo = listen_conninfo(engine.url)
    first = Listener.acquire(conninfo)
    second = Listener.acquire(conninfo)
    try:
        assert first is second
    finally:
        second.release()
        first.release()


def test_last_release_closes_the_listening_connection(engine: Engine) -> None:
    lst = Listener.acquire(listen_conninfo(engine.url))
    wait_for(lambda: lst.backend_pid is not None, timeout=5)
    pid = lst.backend_pid
    lst.release()

    def gone() -> bool:
        with engine.begin() as conn:
            alive = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid"), {"pid": pid}
            ).scalar_one()
        return bool(alive == 0)

    wait_for(gone, timeout=5)


def test_a_failing_callback_does_not_stop_delivery_to_others(
    listener: Listener, engine: Engine
) -> None:
    channel, got = channel_name(), queue.SimpleQueue[str | None]()

    def broken(payload: str | None) -> None:
        raise RuntimeError("subscriber bug")

    listener.subscribe(channel, broken)
    listener.subscribe(channel, got.put)
    assert listener.wait_listening(channel, 5)
    notify(engine, channel, "still")
    assert got.get(timeout=5) == "still"
