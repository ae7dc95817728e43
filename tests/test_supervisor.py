"""The Supervisor: timers, background thread and task, crash recovery, many processes.

Processes are real: a worker killed with SIGKILL while it holds a job, three
supervisors racing for the same throttled steps, ``alkstore maintain`` as a
command. Time is a :class:`FakeClock` wherever waiting would otherwise be needed.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.ext.asyncio import create_async_engine
from support.direct import in_tx

from alkstore_sa import InvalidOptionsError, SchemaNotInstalledError, migrate
from alkstore_sa.clock import FakeClock
from alkstore_sa.ops import Settlement
from alkstore_sa.supervision import AsyncSupervisor, Supervisor

ROOT = Path(__file__).resolve().parents[1]
UTC = dt.UTC

WORKER_SCRIPT = """
import sys, time
from sqlalchemy import create_engine
from sqlalchemy.orm import Session
from alkstore_sa import QueueService
url, schema, queue = sys.argv[1:4]
with Session(create_engine(url)) as session, session.begin():
    [job] = QueueService(session, schema=schema).fetch(queue)
print(job.id, flush=True)
time.sleep(600)
"""

SUPERVISOR_SCRIPT = """
import datetime as dt, json, sys
from sqlalchemy import create_engine
from alkstore_sa.clock import FakeClock
from alkstore_sa.supervision import Supervisor
url, schema, start, rounds, step = sys.argv[1:6]
clock = FakeClock(dt.datetime.fromisoformat(start))
supervisor = Supervisor(
    create_engine(url), schema=schema, clock=clock, supervise_interval=float(step),
    monitor_interval=60, maintenance_interval=100, cron_monitor_interval=10,
)
print("ready", flush=True)
sys.stdin.readline()
passes = []
for _ in range(int(rounds)):
    report = supervisor.run_once()
    passes.append({
        "monitored": report.monitored, "maintained": report.maintained,
        "cron": report.cron_checked, "errors": report.errors,
    })
    clock.advance(float(step))
print(json.dumps(passes), flush=True)
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def python(script: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
        **kwargs,
    )


def db_now(engine: Engine) -> dt.datetime:
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()  # type: ignore[no-any-return]


def job_row(engine: Engine, schema: str, job_id: uuid.UUID) -> Any:
    with engine.connect() as conn:
        query = text(f'SELECT * FROM "{schema}".job WHERE id = :id')
        return conn.execute(query, {"id": job_id}).one()


def crash_while_holding_a_job(database_url: str, schema: str, queue: str) -> uuid.UUID:
    """A worker process fetches a job and dies by SIGKILL, leaving it active."""
    worker = python(WORKER_SCRIPT, database_url, schema, queue)
    assert worker.stdout is not None
    line = worker.stdout.readline()
    os.kill(worker.pid, signal.SIGKILL)
    worker.wait(10)
    assert worker.returncode == -signal.SIGKILL
    return uuid.UUID(line.strip())


# ------------------------------------------------------------------ timers and settings


def test_first_pass_runs_every_step(engine: Engine, schema: str) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    report = Supervisor(engine, schema=schema).run_once()
    assert (report.monitored, report.maintained, report.cron_checked) == (("q",), ("q",), True)


def test_pass_before_any_timer_is_due_does_nothing(engine: Engine, schema: str) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    clock = FakeClock(db_now(engine))
    supervisor = Supervisor(engine, schema=schema, clock=clock)
    supervisor.run_once()
    clock.advance(4)
    assert supervisor.run_once().idle
    assert supervisor.next_due_in() == pytest.approx(1)


def test_steps_come_due_again_as_the_clock_moves(engine: Engine, schema: str) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    clock = FakeClock(db_now(engine))
    supervisor = Supervisor(engine, schema=schema, clock=clock)
    supervisor.run_once()
    clock.advance(61)
    report = supervisor.run_once()
    assert ("q" in report.monitored, "q" in report.maintained, report.cron_checked) == (
        True,
        False,
        True,
    )


def test_force_ignores_local_timers_and_cluster_throttles(engine: Engine, schema: str) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    supervisor = Supervisor(engine, schema=schema)
    supervisor.run_once()
    report = supervisor.run_once(force=True)
    assert ("q" in report.monitored, "q" in report.maintained, report.cron_checked) == (
        True,
        True,
        True,
    )


def test_queues_setting_limits_monitoring_and_deletion(engine: Engine, schema: str) -> None:
    in_tx(engine, schema, lambda q: (q.create_queue("a"), q.create_queue("b")))
    report = Supervisor(engine, schema=schema, queues=["b"], schedule=False).run_once()
    assert (report.monitored, report.maintained) == (("b",), ("b",))


@pytest.mark.parametrize(
    "settings",
    [
        {"monitor_interval": 0},
        {"cron_monitor_interval": 46},
        {"maintenance_interval": 86_401},
        {"warning_queue_size": "many"},
        {"supervise": "yes"},
        {"queues": ["nul\x00"]},
        {"superviseIntervalSeconds": 60},
    ],
)
def test_bad_setting_is_rejected_with_its_name(engine: Engine, settings: dict[str, Any]) -> None:
    [name] = settings
    with pytest.raises(InvalidOptionsError) as caught:
        Supervisor(engine, **settings)
    assert caught.value.option == ("queues" if name == "queues" else name)


def test_start_fails_when_the_schema_is_not_installed(engine: Engine) -> None:
    with pytest.raises(SchemaNotInstalledError):
        Supervisor(engine, schema="t_not_there").start()


# ------------------------------------------------------------------ background


def wait_until(condition: Callable[[], bool], timeout: float = 5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


def test_background_thread_supervises_until_stopped(engine: Engine, schema: str) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q", expire_seconds=1, retry_limit=1))
    job_id = in_tx(engine, schema, lambda q: q.send("q"))
    in_tx(engine, schema, lambda q: q.fetch("q"))
    supervisor = Supervisor(
        engine, schema=schema, clock=FakeClock(db_now(engine) + dt.timedelta(seconds=5))
    )
    supervisor.start()
    try:
        assert wait_until(lambda: job_row(engine, schema, job_id).state == "retry")
    finally:
        assert supervisor.stop(timeout=5)


async def test_async_supervisor_runs_a_pass(database_url: str, schema: str, engine: Engine) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q", expire_seconds=1, retry_limit=0))
    job_id = in_tx(engine, schema, lambda q: q.send("q"))
    in_tx(engine, schema, lambda q: q.fetch("q"))
    async_engine = create_async_engine(database_url)
    try:
        clock = FakeClock(db_now(engine) + dt.timedelta(seconds=5))
        report = await AsyncSupervisor(async_engine, schema=schema, clock=clock).run_once()
    finally:
        await async_engine.dispose()
    assert report.expired == {"q": 1} and report.cron_checked
    assert job_row(engine, schema, job_id).state == "failed"


async def test_async_supervisor_task_supervises_until_stopped(
    database_url: str, schema: str, engine: Engine
) -> None:
    import asyncio

    in_tx(engine, schema, lambda q: q.create_queue("q"))
    async_engine = create_async_engine(database_url)
    supervisor = AsyncSupervisor(async_engine, schema=schema)
    try:
        await supervisor.start()
        for _ in range(250):
            if in_tx(engine, schema, lambda q: q.get_queue("q")).monitor_on is not None:
                break
            await asyncio.sleep(0.02)
        assert in_tx(engine, schema, lambda q: q.get_queue("q")).monitor_on is not None
        assert await supervisor.stop(timeout=5)
    finally:
        await async_engine.dispose()


# ------------------------------------------------------------------ crash recovery


def test_job_of_a_killed_worker_is_retried_and_completed_exactly_once(
    engine: Engine, database_url: str, schema: str
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q", expire_seconds=1, retry_limit=1))
    job_id = in_tx(engine, schema, lambda q: q.send("q", {"order": 1}))
    crash_while_holding_a_job(database_url, schema, "q")
    first = job_row(engine, schema, job_id)
    clock = FakeClock(db_now(engine) + dt.timedelta(seconds=2))
    assert Supervisor(engine, schema=schema, clock=clock).run_once().expired == {"q": 1}

    [again] = in_tx(engine, schema, lambda q: q.fetch("q"))
    mine = Settlement(again.id, {"done": True}, again.started_on)
    zombie = Settlement(job_id, {"done": "twice"}, first.started_on)
    assert in_tx(engine, schema, lambda q: q.complete_many("q", [zombie])).affected == []
    assert in_tx(engine, schema, lambda q: q.complete_many("q", [mine])).affected == [job_id]

    final = job_row(engine, schema, job_id)
    assert (final.state, final.retry_count, final.output) == ("completed", 1, {"done": True})
    with engine.connect() as conn:
        count = conn.execute(text(f'SELECT count(*) FROM "{schema}".job')).scalar_one()
    assert count == 1


@pytest.mark.subprocess
def test_job_of_a_killed_worker_lands_in_the_dead_letter_queue_via_alkstore_maintain(
    engine: Engine, database_url: str, schema: str
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("dlq"))
    in_tx(engine, schema, lambda q: q.create_queue("q", expire_seconds=1, dead_letter="dlq"))
    job_id = in_tx(engine, schema, lambda q: q.send("q", {"order": 2}, retry_limit=0))
    crash_while_holding_a_job(database_url, schema, "q")
    started = job_row(engine, schema, job_id).started_on
    assert wait_until(lambda: db_now(engine) > started + dt.timedelta(seconds=1.05))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "alkstore_sa.cli",
            "maintain",
            "--json",
            "--no-cron",
            "--database-url",
            database_url,
            "--schema",
            schema,
        ],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["expired"] == {"q": 1}
    assert job_row(engine, schema, job_id).state == "failed"
    [dead] = in_tx(engine, schema, lambda q: q.fetch("dlq"))
    assert (dead.data, dead.output) == ({"order": 2}, {"value": {"message": "job timed out"}})


def test_alkstore_maintain_rejects_a_bad_setting(
    database_url: str, schema: str, capsys: Any
) -> None:
    from alkstore_sa.cli import main

    code = main(
        ["maintain", "--database-url", database_url, "--schema", schema, "--monitor-interval", "0"]
    )
    assert code == 2  # bad input
    assert "monitor_interval" in capsys.readouterr().err


# ------------------------------------------------------------------ three processes


@pytest.fixture(scope="module")
def three_supervisors(
    database_url: str,
) -> Iterator[tuple[str, list[list[dict[str, Any]]], Engine]]:
    """Three supervisor processes, 20 passes each, 10 fake seconds apart, all at once.

    Queues ``a`` and ``b``; ``a`` has an every-minute schedule. The fake clock
    starts 5 s into a minute, so the passes span 00:05 to 03:15 of fake time.
    """
    from sqlalchemy import create_engine

    engine = create_engine(database_url)
    schema = "t_" + uuid.uuid4().hex[:12]
    migrate.upgrade(engine, schema, schema_version=26)
    in_tx(engine, schema, lambda q: [q.create_queue(n) for n in ("a", "b", "__pgboss__send-it")])
    in_tx(engine, schema, lambda q: q.schedule("a", "* * * * *"))
    start = (db_now(engine) + dt.timedelta(minutes=1)).replace(second=5, microsecond=0)
    procs = [
        python(
            SUPERVISOR_SCRIPT,
            database_url,
            schema,
            start.isoformat(),
            "20",
            "10",
            stdin=subprocess.PIPE,
        )
        for _ in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        passes = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        yield schema, passes, engine
    finally:
        for p in procs:
            p.kill()
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        engine.dispose()


def tally(passes: list[list[dict[str, Any]]], key: str) -> Counter[Any]:
    counts: Counter[Any] = Counter()
    for process in passes:
        for one in process:
            value = one[key]
            counts.update(value if isinstance(value, list) else [value])
    return counts


@pytest.mark.subprocess
def test_three_processes_run_into_no_errors(three_supervisors: Any) -> None:
    _, passes, _ = three_supervisors
    assert tally(passes, "errors") == Counter()


@pytest.mark.subprocess
def test_each_queue_is_monitored_once_per_interval_across_three_processes(
    three_supervisors: Any,
) -> None:
    # Monitor interval 60 s over 190 s of passes: turns at 0, 70 and 140 s.
    _, passes, _ = three_supervisors
    counts = tally(passes, "monitored")
    assert (counts["a"], counts["b"]) == (3, 3)


@pytest.mark.subprocess
def test_each_queue_is_maintained_once_per_interval_across_three_processes(
    three_supervisors: Any,
) -> None:
    # Maintenance interval 100 s: turns at 0 and 110 s.
    _, passes, _ = three_supervisors
    counts = tally(passes, "maintained")
    assert (counts["a"], counts["b"]) == (2, 2)


@pytest.mark.subprocess
def test_cron_turn_is_taken_once_per_interval_across_three_processes(
    three_supervisors: Any,
) -> None:
    # Cron interval 10 s, passes every 10 s: a turn every 20 s, 0 to 180 s.
    _, passes, _ = three_supervisors
    assert tally(passes, "cron")[True] == 10


@pytest.mark.subprocess
def test_schedule_fires_once_per_minute_across_three_timekeeper_processes(
    three_supervisors: Any,
) -> None:
    # Ten cron turns, from 00:05 to 03:05, all finding the schedule due: four minutes.
    schema, _, engine = three_supervisors
    with engine.connect() as conn:
        made = conn.execute(
            text(f"SELECT count(*) FROM \"{schema}\".job WHERE name = 'a'")
        ).scalar_one()
    assert made == 4


@pytest.mark.subprocess
def test_alkstore_maintain_loop_reports_and_stops_on_sigterm(
    engine: Engine, database_url: str, schema: str
) -> None:
    in_tx(engine, schema, lambda q: q.create_queue("q"))
    command = ["maintain", "--loop", "--json", "--database-url", database_url, "--schema", schema]
    proc = subprocess.Popen(
        [sys.executable, "-m", "alkstore_sa.cli", *command],
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while (line := proc.stdout.readline()) and line != "}\n":  # one JSON document
            lines.append(line)
        first = "".join(lines) + "}"
        assert json.loads(first)["monitored"] == ["q"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        proc.kill()
