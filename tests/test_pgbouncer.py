"""Behind PgBouncer in transaction pooling: every statement works when each transaction
may land on a different server connection (docs/how-to/pgbouncer.md)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from support.pgbouncer import pgbouncer
from support.worker import wait_for

from alkstore_sa import QueueService, Worker


@pytest.fixture(scope="session")
def transaction_pooled_url(database_url: str) -> Iterator[str]:
    with pgbouncer(database_url, "transaction") as url:
        yield url


def test_senders_and_a_worker_through_transaction_pooling(
    transaction_pooled_url: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    engine = create_engine(transaction_pooled_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema).create_queue("q")
        handled: list[int] = []
        lock = threading.Lock()
        worker = Worker(engine, schema=schema, shutdown_timeout=5)

        @worker.handler("q", concurrency=4)
        def handle(job: object) -> None:
            with lock:
                handled.append(job.data["n"])  # type: ignore[attr-defined]

        errors: list[BaseException] = []

        def sender(base: int) -> None:
            try:
                for n in range(base, base + 200):
                    with Session(engine) as session, session.begin():
                        QueueService(session, schema=schema).send("q", {"n": n})
            except BaseException as exc:
                errors.append(exc)

        caplog.set_level(logging.WARNING, logger="alkstore_sa")
        worker.start()
        try:
            threads = [threading.Thread(target=sender, args=(i * 200,)) for i in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == []
            wait_for(lambda: len(handled) >= 800, timeout=30)
        finally:
            worker.stop()
        assert sorted(handled) == list(range(800))
        with engine.connect() as conn:
            states = conn.execute(
                text(f'select state, count(*) from "{schema}".job group by state')
            ).all()
        assert dict(states) == {"completed": 800}
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        engine.dispose()
