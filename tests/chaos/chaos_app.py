"""The worker the chaos tests run in child processes (``alkstore worker --app chaos_app:build``).

Configured by environment variables (set by ``chaos_support.Children``):

- ``CHAOS_DATABASE_URL``, ``CHAOS_SCHEMA``: where the queues are.
- ``CHAOS_LABEL``: this process's name in the tables below; its connections carry
  ``application_name = chaos-<schema>-<label>`` so a test can find (and terminate)
  exactly its own backends in ``pg_stat_activity``.
- ``CHAOS_QUEUES`` (comma-separated, default ``chaos``), ``CHAOS_CONCURRENCY``,
  ``CHAOS_POLL``, ``CHAOS_SLEEP`` (seconds each handler sleeps),
  ``CHAOS_FIRST_SLEEP`` (seconds on a job's first attempt instead, when set),
  ``CHAOS_TRANSACTIONAL`` (``1``: the effect commits with the completion),
  ``CHAOS_BACKEND_FLAGS`` (comma-separated compatibility flags forced on the worker,
  see :class:`alkstore_sa.Backend`), ``CHAOS_BACKEND`` (a backend profile's name instead).

Every attempt is written to ``chaos_attempt`` in its own transaction *before* the
handler's work, so an attempt killed midway is still on record. The handler's effect
is a row in ``chaos_effect``: committed on its own by a plain handler (before the job
is completed, so a kill between the two repeats it), or in the completion's
transaction by a transactional one.
"""

from __future__ import annotations

import os
import time
from typing import Any

from sqlalchemy import Engine, create_engine, text
from sqlalchemy.orm import Session

from alkstore_sa import Backend, Worker
from alkstore_sa.records import Job

TABLES = """
CREATE TABLE IF NOT EXISTS {s}.chaos_attempt (
    job_id uuid NOT NULL,
    label text NOT NULL,
    pid int NOT NULL,
    retry_count int NOT NULL,
    started_on timestamptz,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {s}.chaos_effect (
    job_id uuid NOT NULL,
    label text NOT NULL,
    pid int NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def create_tables(engine: Engine, schema: str) -> None:
    """Create the attempt and effect tables in ``schema`` (dropped with it)."""
    with engine.begin() as conn:
        for statement in TABLES.format(s=f'"{schema}"').split(";"):
            conn.execute(text(statement))


def application_name(schema: str, label: str) -> str:
    """The ``application_name`` of a chaos process's pooled connections."""
    return f"chaos-{schema}-{label}"


def build() -> Worker:
    """The worker, from the environment."""
    env = os.environ
    url, schema, label = env["CHAOS_DATABASE_URL"], env["CHAOS_SCHEMA"], env["CHAOS_LABEL"]
    sleep = float(env.get("CHAOS_SLEEP", "0"))
    first_sleep = float(env.get("CHAOS_FIRST_SLEEP", env.get("CHAOS_SLEEP", "0")))
    transactional = env.get("CHAOS_TRANSACTIONAL") == "1"
    pid = os.getpid()
    engine = create_engine(
        url,
        pool_pre_ping=True,
        pool_size=20,
        connect_args={"application_name": application_name(schema, label)},
    )
    s = f'"{schema}"'
    attempt_sql = text(
        f"INSERT INTO {s}.chaos_attempt (job_id, label, pid, retry_count, started_on)"
        " VALUES (:id, :label, :pid, :rc, :so)"
    )
    effect_sql = text(f"INSERT INTO {s}.chaos_effect (job_id, label, pid) VALUES (:id, :l, :p)")

    def attempt(job: Job) -> None:
        with engine.begin() as conn:
            conn.execute(
                attempt_sql,
                {
                    "id": job.id,
                    "label": label,
                    "pid": pid,
                    "rc": job.retry_count,
                    "so": job.started_on,
                },
            )
        time.sleep(first_sleep if job.retry_count == 0 else sleep)

    def output() -> dict[str, Any]:
        return {"label": label, "pid": pid}

    flags = frozenset(f for f in env.get("CHAOS_BACKEND_FLAGS", "").split(",") if f)
    profile = env.get("CHAOS_BACKEND") or None
    worker = Worker(
        engine,
        schema=schema,
        backend=profile or (Backend("postgres", flags) if flags else None),
        concurrency=int(env.get("CHAOS_CONCURRENCY", "4")),
        poll_interval=float(env.get("CHAOS_POLL", "0.5")),
        shutdown_timeout=2.0,
        supervisor_options={
            "supervise_interval": 0.5,
            "monitor_interval": 0.5,
            "schedule": False,
        },
        name=label,
    )
    for queue in env.get("CHAOS_QUEUES", "chaos").split(","):
        if transactional:

            def handle_tx(job: Job, session: Session) -> dict[str, Any]:
                attempt(job)
                session.execute(effect_sql, {"id": job.id, "l": label, "p": pid})
                return output()

            worker.register(queue, handle_tx, transactional=True)
        else:

            def handle(job: Job) -> dict[str, Any]:
                attempt(job)
                with engine.begin() as conn:
                    conn.execute(effect_sql, {"id": job.id, "l": label, "p": pid})
                return output()

            worker.register(queue, handle)
    return worker
