"""Every kind of bad row at once, while a worker, its supervisor, cron and the
dashboard run: everything good still runs (docs/concepts/guarantees.md, "One bad
row stops nobody else").

The bad rows are written through raw SQL, as Node pg-boss or a console could write
them: queues named as we would not name them and one with a policy we do not know,
a job Python cannot read, schedules whose rules or data cannot be evaluated or
sent, warning and instance rows Python cannot decode, and a ``bam`` row that is
not an index build.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from chaos_support import Deadline, rows, states
from sqlalchemy import Engine
from sqlalchemy.orm import Session
from support.skips import require_module

from alkstore_sa import Job, QueueService, Worker

pytestmark = pytest.mark.chaos

GOOD = 10
LONG = "x" * 201
DEEP = "(repeat('[', 1500) || repeat(']', 1500))::jsonb"
BIG = "('{\"n\": ' || repeat('9', 5000) || '}')::jsonb"
BAD_SCHEDULES = {
    "huge-count": (
        "rrule",
        "'DTSTART:20000101T000000Z' || chr(10)"
        " || 'RRULE:FREQ=SECONDLY;BYMINUTE=5;COUNT=2000000000'",
        "NULL",
    ),
    "byday": ("rrule", "'FREQ=MONTHLY;BYDAY=99MO'", "NULL"),
    "interval": ("rrule", "'FREQ=DAILY;INTERVAL=99999999999999999999'", "NULL"),
    "unsatisfiable": ("rrule", "'FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=30'", "NULL"),
    "deep-data": ("cron", "'* * * * *'", DEEP),
    "long-number": ("cron", "'* * * * *'", BIG),
    "bad-cron": ("cron", "'61 * * * *'", "NULL"),
}


def _foreign_queue(engine: Engine, schema: str, name: str, policy: str = "standard") -> None:
    rows(engine, schema, "SELECT {s}.create_queue(:n, jsonb_build_object('policy', 'standard'))",
         n=name)  # fmt: skip
    if policy != "standard":
        rows(engine, schema, "UPDATE {s}.queue SET policy = :p WHERE name = :n", p=policy, n=name)


def _expired_active(engine: Engine, schema: str, queue: str) -> uuid.UUID:
    """A job a crashed worker left active an hour ago (its lease long gone)."""
    [(job_id,)] = rows(
        engine,
        schema,
        "INSERT INTO {s}.job (name, state, started_on, expire_seconds, data)"
        " VALUES (:q, 'active', now() - interval '1 hour', 1, '{\"crashed\": true}')"
        " RETURNING id",
        q=queue,
    )
    assert isinstance(job_id, uuid.UUID)
    return job_id


def _plant_bad_rows(engine: Engine, schema: str) -> dict[str, Any]:
    _foreign_queue(engine, schema, "my queue")
    _foreign_queue(engine, schema, LONG)
    _foreign_queue(engine, schema, "odd", policy="bogus")
    rows(engine, schema, "INSERT INTO {s}.job (name, policy) VALUES ('odd', 'bogus')")
    [(poison,)] = rows(
        engine,
        schema,
        f"INSERT INTO {{s}}.job (name, priority, data) VALUES ('good', 10, {DEEP}) RETURNING id",
    )
    for key, (kind, expr, data) in BAD_SCHEDULES.items():
        rows(
            engine,
            schema,
            "INSERT INTO {s}.schedule (name, key, kind, cron, timezone, data, options)"
            f" VALUES ('good', :key, :kind, {expr}, 'UTC', {data}, '{{}}')",
            key=key,
            kind=kind,
        )
    rows(
        engine,
        schema,
        "INSERT INTO {s}.warning (type, message, data) VALUES ('slow', 'big', " + BIG + "),"
        " ('slow', 'deep', " + DEEP + ")",
    )
    rows(
        engine,
        schema,
        "INSERT INTO {s}.instance (id, host, pid, version, node_version, heartbeat_seconds,"
        " supervise, schedule, migrate, persist_queue_stats, persist_warnings, workers,"
        " metrics, config) VALUES (gen_random_uuid(), 'odd-host', 1, 'v', 'n', 30, true,"
        " true, true, true, true, " + DEEP + ", " + BIG + ", '{}')",
    )
    rows(
        engine,
        schema,
        "INSERT INTO {s}.bam (name, version, status, table_name, command)"
        " VALUES ('evil', 46, 'pending', 'job_common', 'DROP TABLE {s}.queue')",
    )
    return {
        "poison": poison,
        "expired": {q: _expired_active(engine, schema, q) for q in ("good", "my queue", LONG)},
    }


def test_bad_rows_of_every_kind_stop_no_good_work(
    database_url: str, engine: Engine, schema46: str
) -> None:
    starlette = require_module("starlette.testclient", "the dashboard extra")
    from alkstore_sa.dashboard import create_app

    schema = schema46
    deadline = Deadline(90)
    with Session(engine) as s, s.begin():
        q = QueueService(s, schema=schema)
        q.create_queue("good", retry_limit=3, expire_seconds=60)
        q.create_queue("parted", partition=True)
        # Every 10 seconds: the cron turn of the worker's first pass files its
        # occurrences of the last minute, send-it sends them into "good".
        q.schedule("good", "RRULE:FREQ=SECONDLY;INTERVAL=10", {"from": "schedule"}, key="tick")
    planted = _plant_bad_rows(engine, schema)
    with Session(engine) as s, s.begin():
        q = QueueService(s, schema=schema)
        good = [q.send("good", {"n": i}) for i in range(GOOD)]
        mine = q.send("my queue", {"n": "mine"})  # a Node-named queue, worked from Python
        parted = q.send("parted", {"n": "parted"})

    seen: list[Any] = []
    lock = threading.Lock()

    def handle(job: Job) -> dict[str, Any]:
        with lock:
            seen.append((job.name, job.data))
        return {"ok": True}

    worker = Worker(
        engine,
        schema=schema,
        concurrency=4,
        poll_interval=0.2,
        shutdown_timeout=2.0,
        supervisor_options={"supervise_interval": 0.5, "monitor_interval": 0.5,
                            "persist_warnings": True},
    )  # fmt: skip
    for queue in ("good", "my queue", LONG, "parted", "odd"):
        worker.register(queue, handle)
    client = starlette.TestClient(create_app(engine, schemas=[schema]), base_url="http://127.0.0.1")
    pages = [
        "/",
        f"/s/{schema}/jobs",
        f"/s/{schema}/schedules",
        f"/s/{schema}/warnings",
        f"/s/{schema}/instances",
        *(f"/s/{schema}/queues/{name}" for name in ("good", "my%20queue", LONG, "odd")),
        f"/s/{schema}/jobs/{planted['poison']}?queue=good",
    ]

    def done() -> bool:
        st = states(engine, schema, "good")
        scheduled = sum(1 for name, data in seen if data == {"from": "schedule"})
        expired = all(
            r.state == "completed"
            for r in rows(
                engine, schema, "SELECT state FROM {s}.job WHERE data = :d", d='{"crashed": true}'
            )
        )
        return st.get("completed", 0) >= GOOD + 2 and scheduled >= 1 and expired

    worker.start()
    try:
        answers: dict[str, set[int]] = {}
        while not done():
            for page in pages:  # the dashboard, while everything runs
                answers.setdefault(page, set()).add(client.get(page).status_code)
            assert deadline.left() > 0, (states(engine, schema, "good"), seen)
            time.sleep(0.3)
    finally:
        worker.stop()

    assert {p: c for p, c in answers.items() if c != {200}} == {}
    by_id = {r.id: r for r in rows(engine, schema, "SELECT id, name, state, output FROM {s}.job")}
    assert all(by_id[j].state == "completed" for j in [*good, mine, parted])
    # The jobs crashed workers left, in every queue whatever its name, expired and ran.
    assert all(by_id[j].state == "completed" for j in planted["expired"].values())
    # The poison job failed on its own; the unknown policy's job waits, untouched.
    assert by_id[planted["poison"]].state == "failed"
    assert by_id[planted["poison"]].output["name"] == "PoisonJob"
    assert [r.state for r in by_id.values() if r.name == "odd"] == ["created"]
    # Each bad schedule was reported; the good one fired.
    reported = {
        r.data["key"]
        for r in rows(
            engine, schema, "SELECT data FROM {s}.warning WHERE type = 'invalid_schedule'"
        )
    }
    assert reported == set(BAD_SCHEDULES), reported
    assert any(data == {"from": "schedule"} for _, data in seen)
    # The bam row that is not an index build was refused, never run.
    [bam] = rows(engine, schema, "SELECT status, error FROM {s}.bam WHERE name = 'evil'")
    assert bam.status == "failed" and bam.error.startswith("not run:")
    assert rows(engine, schema, "SELECT count(*) FROM {s}.queue")[0][0] == 6
    # Listed, each: the rows Python cannot decode with what and why.
    with Session(engine) as s:
        listed = {i.key: i for i in QueueService(s, schema=schema).get_schedules()}
    assert set(listed) == {*BAD_SCHEDULES, "tick"}
    assert {k for k, i in listed.items() if i.unreadable} == {"deep-data", "long-number"}
    print(
        f"\nbad rows: {len(BAD_SCHEDULES)} schedules, 1 poison job, 3 foreign queues, "
        f"2 warnings, 1 instance, 1 bam row; {len(seen)} good jobs ran; "
        f"{len(answers)} dashboard pages answered 200 throughout"
    )
