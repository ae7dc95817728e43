"""A chaos worker at default settings (``alkstore worker --app chaos_rescue_app:build``).

Unlike ``chaos_app`` (short leases, a supervisor every half second), every setting that
decides how soon a crashed worker's jobs come back is the default: the queue's lease,
the supervisor's intervals, ``liveness_seconds``, ``prefetch``. Only ``CHAOS_CONCURRENCY``
(default 4), ``CHAOS_TRANSACTIONAL`` and ``CHAOS_LIVENESS`` (``none``: off) are read,
with the variables ``chaos_app`` documents for where the queues are. Each job sleeps
``data["sleep"]`` seconds (only in the worker ``data["only_in"]`` names, if it names
one); attempts and effects go to ``chaos_app``'s tables.
"""

from __future__ import annotations

import os
import time
from typing import Any

from chaos_app import application_name
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from alkstore_sa import Worker
from alkstore_sa.records import Job


def build() -> Worker:
    env = os.environ
    url, schema, label = env["CHAOS_DATABASE_URL"], env["CHAOS_SCHEMA"], env["CHAOS_LABEL"]
    transactional = env.get("CHAOS_TRANSACTIONAL") == "1"
    pid = os.getpid()
    engine = create_engine(
        url, pool_pre_ping=True, connect_args={"application_name": application_name(schema, label)}
    )
    s = f'"{schema}"'
    attempt_sql = text(
        f"INSERT INTO {s}.chaos_attempt (job_id, label, pid, retry_count, started_on)"
        " VALUES (:id, :label, :pid, :rc, :so)"
    )
    effect_sql = text(f"INSERT INTO {s}.chaos_effect (job_id, label, pid) VALUES (:id, :l, :p)")

    def attempt(job: Job) -> None:
        with engine.begin() as conn:
            params = {"id": job.id, "label": label, "pid": pid, "rc": job.retry_count}
            conn.execute(attempt_sql, {**params, "so": job.started_on})
        data = job.data if isinstance(job.data, dict) else {}
        if data.get("only_in") in (None, label):
            time.sleep(float(data.get("sleep", 0)))

    liveness = env.get("CHAOS_LIVENESS")
    options: dict[str, Any] = {}
    if liveness:
        options["liveness_seconds"] = None if liveness == "none" else int(liveness)
    worker = Worker(
        engine,
        schema=schema,
        concurrency=int(env.get("CHAOS_CONCURRENCY", "4")),
        name=label,
        **options,
    )
    if transactional:

        def handle_tx(job: Job, session: Session) -> dict[str, Any]:
            attempt(job)
            session.execute(effect_sql, {"id": job.id, "l": label, "p": pid})
            return {"label": label}

        worker.register("chaos", handle_tx, transactional=True)
    else:

        def handle(job: Job) -> dict[str, Any]:
            attempt(job)
            with engine.begin() as conn:
                conn.execute(effect_sql, {"id": job.id, "l": label, "p": pid})
            return {"label": label}

        worker.register("chaos", handle)
    return worker
