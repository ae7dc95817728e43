"""LISTEN for new-job notifications on one dedicated connection per process.

``send`` issues ``pg_notify(notify_channel(schema), queue_name)`` inside the
sender's transaction, so the notification arrives when (and only if) the job is
committed. A :class:`Listener` keeps one autocommit psycopg connection per
database, outside any SQLAlchemy pool (a pooled connection would be handed to
other work and lose its LISTEN), and calls every subscriber of a channel with
the payload. Workers of both flavours share it: it runs in a daemon thread and
subscribers are plain callables (the asyncio worker passes one that hops onto
its loop).

If the connection drops, the listener logs, reconnects with backoff and then
calls every subscriber with ``None``: notifications may have been missed, so
each worker should look at all its queues once. Polling covers the gap.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import psycopg
from psycopg import sql

from ._backoff import Backoff

log = logging.getLogger(__name__)

APPLICATION_NAME = "alkstore-listener"
"""``application_name`` of the listening connection (find it in ``pg_stat_activity``)."""

PROBE_APPLICATION_NAME = "alkstore-probe"
"""``application_name`` of the short connection a worker sends its wake-up probe on."""

Callback = Callable[[str | None], None]


@dataclass(eq=False)
class Subscription:
    """A callback registered for one channel; pass it to :meth:`Listener.unsubscribe`."""

    channel: str
    callback: Callback


@dataclass
class _Shared:
    listener: Listener
    users: int = 0
    subs: list[Subscription] = field(default_factory=list)


class Listener:
    """One LISTEN connection for a database, shared by every worker of the process.

    Example::

        listener = Listener.acquire("postgresql://localhost/app")
        sub = listener.subscribe("alkstore_pgboss", print)   # prints queue names
        listener.release(sub)

    :param conninfo: a libpq connection string or ``postgresql://`` URL.
    :param poll_seconds: how long one wait for notifications lasts; channel
        changes and shutdown are noticed within this time.
    """

    _registry: ClassVar[dict[str, _Shared]] = {}
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, conninfo: str, *, poll_seconds: float = 0.25) -> None:
        self.conninfo = conninfo
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._subs: dict[str, list[Subscription]] = {}
        self._listening: set[str] = set()
        self._stop = threading.Event()
        self._ready = threading.Condition(self._lock)
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[object] | None = None
        self.connects = 0
        """How many times the connection was (re-)established."""

    # -------------------------------------------------------------- sharing

    @classmethod
    def acquire(cls, conninfo: str) -> Listener:
        """The process's listener for ``conninfo``, started if need be.

        Pair every call with :meth:`release`.
        """
        with cls._registry_lock:
            shared = cls._registry.get(conninfo)
            if shared is None:
                shared = cls._registry[conninfo] = _Shared(cls(conninfo))
                shared.listener.start()
            shared.users += 1
            return shared.listener

    def release(self, *subs: Subscription) -> None:
        """Drop ``subs`` and one use of the listener; the last use stops it."""
        for sub in subs:
            self.unsubscribe(sub)
        with Listener._registry_lock:
            shared = Listener._registry.get(self.conninfo)
            if shared is None or shared.listener is not self:
                return
            shared.users -= 1
            if shared.users > 0:
                return
            del Listener._registry[self.conninfo]
        self.stop()

    # -------------------------------------------------------------- channels

    def subscribe(self, channel: str, callback: Callback) -> Subscription:
        """Call ``callback(payload)`` for each notification on ``channel``.

        ``callback(None)`` means "reconnected, something may have been missed".
        Callbacks run on the listener thread: keep them short and non-blocking.
        """
        sub = Subscription(channel, callback)
        with self._lock:
            self._subs.setdefault(channel, []).append(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        """Stop calling ``sub``'s callback."""
        with self._lock:
            subs = self._subs.get(sub.channel, [])
            if sub in subs:
                subs.remove(sub)
            if not subs:
                self._subs.pop(sub.channel, None)

    def wait_listening(self, channel: str, timeout: float) -> bool:
        """Wait until ``LISTEN channel`` is in effect; ``False`` on timeout."""
        with self._ready:
            return self._ready.wait_for(lambda: channel in self._listening, timeout)

    def probe(self, channel: str, conninfo: str, timeout: float) -> bool | None:
        """Whether a notification on ``channel`` sent over ``conninfo`` (how senders
        reach the database) reaches this listener within ``timeout`` seconds; ``None``
        when it cannot tell (not listening yet, or ``conninfo`` does not connect).

        The payload is a token no queue name can be (it holds spaces), so the other
        subscribers of ``channel`` find no queue to wake for it. A listening
        connection behind a pooler in transaction mode hears nothing: its ``LISTEN``
        was made on a server connection that is someone else's after it.
        """
        token = f"alkstore probe {uuid.uuid4()}"
        heard = threading.Event()

        def hear(payload: str | None) -> None:
            if payload == token:
                heard.set()

        sub = self.subscribe(channel, hear)
        try:
            if not self.wait_listening(channel, timeout):
                return None
            try:
                with psycopg.connect(
                    conninfo, autocommit=True, application_name=PROBE_APPLICATION_NAME
                ) as conn:
                    conn.execute("SELECT pg_notify(%s, %s)", (channel, token), prepare=False)
            except psycopg.Error:
                return None
            return heard.wait(timeout)
        finally:
            self.unsubscribe(sub)

    @property
    def backend_pid(self) -> int | None:
        """The server process id of the listening connection, if connected."""
        conn = self._conn
        return None if conn is None or conn.closed else conn.info.backend_pid

    # -------------------------------------------------------------- thread

    def start(self) -> None:
        """Start the listening thread (done by :meth:`acquire`)."""
        self._thread = threading.Thread(target=self._run, name="alkstore-listener", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop listening and close the connection (done by the last :meth:`release`)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                self._session()
                backoff.reset()
            except Exception as exc:
                # psycopg errors are expected (server restart, network); anything
                # else is a bug, but the listener must outlive it all the same.
                delay = backoff.next()
                log.warning(
                    "listener connection lost (%s); reconnecting in %.1f s",
                    str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
                    delay,
                    extra={"action": "listener_lost", "delay": delay},
                )
                self._stop.wait(delay)
            finally:
                self._close()

    def _session(self) -> None:
        conn: psycopg.Connection[object] = psycopg.connect(
            self.conninfo, autocommit=True, application_name=APPLICATION_NAME
        )
        self._conn = conn
        self.connects += 1
        reconnected = self.connects > 1
        log.log(
            logging.INFO if reconnected else logging.DEBUG,
            "listener connected (backend %s)",
            conn.info.backend_pid,
            extra={"action": "listener_connected", "reconnect": reconnected},
        )
        self._sync_channels(conn)
        if reconnected:
            self._dispatch_all(None)
        while not self._stop.is_set():
            for note in conn.notifies(timeout=self.poll_seconds):
                self._dispatch(note.channel, note.payload)
            self._sync_channels(conn)

    def _sync_channels(self, conn: psycopg.Connection[object]) -> None:
        with self._lock:
            wanted = set(self._subs)
            current = set(self._listening)
        # LISTEN has no SQLAlchemy construct; channel names are case-sensitive,
        # so they go through psycopg's identifier quoting.
        for channel in sorted(wanted - current):
            conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        for channel in sorted(current - wanted):
            conn.execute(sql.SQL("UNLISTEN {}").format(sql.Identifier(channel)))
        if wanted != current:
            with self._ready:
                self._listening = wanted
                self._ready.notify_all()

    def _close(self) -> None:
        with self._ready:
            self._listening = set()
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _dispatch(self, channel: str, payload: str | None) -> None:
        with self._lock:
            subs = list(self._subs.get(channel, ()))
        for sub in subs:
            try:
                sub.callback(payload)
            except Exception:
                log.exception(
                    "listener callback failed", extra={"action": "listener_callback_error"}
                )

    def _dispatch_all(self, payload: str | None) -> None:
        with self._lock:
            channels = list(self._subs)
        for channel in channels:
            self._dispatch(channel, payload)
