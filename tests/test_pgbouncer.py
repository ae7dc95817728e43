"""Behind PgBouncer in transaction pooling: every statement works when each transaction
may land on a different server connection (docs/how-to/pgbouncer.md)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session
from support.pgbouncer import pgbouncer
from support.worker import wait_for

from alkstore_sa import AsyncQueueService, AsyncWorker, QueueService, Worker


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


@pytest.fixture(scope="session")
def session_pooled_url(database_url: str) -> Iterator[str]:
    with pgbouncer(database_url, "session") as url:
        yield url


@pytest.mark.parametrize("mode", ["transaction", "session"])
def test_an_async_worker_through_pgbouncer(
    mode: str,
    request: pytest.FixtureRequest,
    schema: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = request.getfixturevalue(f"{mode}_pooled_url")
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    async_engine = create_async_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    handled: list[int] = []

    async def main() -> None:
        worker = AsyncWorker(async_engine, schema=schema, shutdown_timeout=5)

        @worker.handler("q", concurrency=4)
        async def handle(job: object) -> None:
            handled.append(job.data["n"])  # type: ignore[attr-defined]

        await worker.start()
        try:
            for n in range(300):
                async with AsyncSession(async_engine) as session, session.begin():
                    await AsyncQueueService(session, schema=schema).send("q", {"n": n})
            deadline = asyncio.get_running_loop().time() + 30
            while len(handled) < 300 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
        finally:
            await worker.stop()

    try:
        with Session(engine) as session, session.begin():
            QueueService(session, schema=schema).create_queue("q")
        caplog.set_level(logging.WARNING, logger="alkstore_sa")
        asyncio.run(main())
        assert sorted(handled) == list(range(300))
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    finally:
        asyncio.run(async_engine.dispose())
        engine.dispose()
