"""The turns on ``version`` at schema 46 against Node pg-boss 12.38.0: flows, BAM,
reindex and recurrence-rule cron, each done by our supervisor as Node does it, on a
schema made by our migrations and on one made by Node."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.interop46 import job_row, schema46_by, sql, wait_until
from support.node import in_tx, node46, node46_modules, node_url, py_engine, run_node46

from alkstore_sa import rrule
from alkstore_sa.names import SEND_IT_QUEUE
from alkstore_sa.supervision import Supervisor

__all__ = ["node46", "node46_modules", "node_url", "py_engine", "schema46_by"]

pytestmark = pytest.mark.interop

ONLY_FLOWS: dict[str, Any] = {"schedule": False, "bam": False, "reindex": False}
ONLY_BAM: dict[str, Any] = {"supervise": False, "schedule": False}


def autocommit(engine: Engine, schema: str, statement: str) -> None:
    with engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(text(statement.replace("{s}", f'"{schema}"')))


# --------------------------------------------------------------- flows


def test_a_flow_node_sent_is_released_by_our_supervisor(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: [q.create_queue("parents"), q.create_queue("kids")])
    boss = node46(schema, migrate=False)  # no flow resolver and no BAM runner on Node's side
    refs = boss.call(
        "flow",
        [
            {"ref": "a", "name": "parents", "data": {"step": 1}},
            {"ref": "b", "name": "kids", "data": {"step": 2}, "dependsOn": ["a"]},
        ],
    )
    child = refs["b"]
    sent = job_row(engine, schema, child, "blocked, pending_dependencies, start_after")
    assert sent["blocked"] and sent["pending_dependencies"] == 1
    assert boss.call("fetch", "kids") == []
    [parent] = boss.call("fetch", "parents")
    boss.call("complete", "parents", parent["id"])
    done = job_row(engine, schema, refs["a"], "completed_on, blocking")
    assert done["blocking"]  # completion leaves the release to the resolver
    report = Supervisor(py_engine, schema=schema, **ONLY_FLOWS).run_once(force=True)
    assert (report.flows_resolved, report.released) == (1, 1)
    released = job_row(engine, schema, child, "blocked, pending_dependencies, start_after")
    assert not released["blocked"] and released["pending_dependencies"] == 0
    assert released["start_after"] >= done["completed_on"] > sent["start_after"]
    assert not job_row(engine, schema, refs["a"], "blocking")["blocking"]
    [kid] = boss.call("fetch", "kids")
    assert kid["id"] == child
    assert sql(engine, schema, "SELECT flow_on FROM {s}.version")[0][0] is not None
    # We hold flow_on: a Node resolver polling at its start within the interval skips.
    refs = boss.call(
        "flow",
        [
            {"ref": "a", "name": "parents", "data": {"step": 3}},
            {"ref": "b", "name": "kids", "data": {"step": 4}, "dependsOn": ["a"]},
        ],
    )
    [parent] = boss.call("fetch", "parents")
    boss.call("complete", "parents", parent["id"])
    resolver = {"supervise": True, "migrate": False, "flowIntervalSeconds": 60}
    node46(schema, **resolver)
    time.sleep(2)
    assert job_row(engine, schema, refs["b"], "blocked")["blocked"]
    # With the turn free, a resolver starting now releases the child.
    sql(engine, schema, "UPDATE {s}.version SET flow_on = NULL")
    node46(schema, **resolver)
    assert wait_until(lambda: not job_row(engine, schema, refs["b"], "blocked")["blocked"])
    assert boss.errors() == []


# --------------------------------------------------------------- BAM


def queue_bam(engine: Engine, schema: str, suffix: str, definition: str) -> list[str]:
    """A pending build of pg-boss's index ``suffix`` on every job table, queued as a
    Node migration queues one: through the schema's ``job_table_run_async``, one
    ``bam`` row per table. The index is dropped first, as a database being migrated
    would not have it yet."""
    tables = [r[0] for r in sql(engine, schema, "SELECT DISTINCT table_name FROM {s}.queue")]
    tables = sorted({"job_common", *tables})
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        for table in tables:
            conn.execute(text(f'DROP INDEX IF EXISTS "{schema}"."{table}_{suffix}"'))
    command = f"CREATE INDEX CONCURRENTLY IF NOT EXISTS job_{suffix} ON {schema}.job {definition}"
    sql(
        engine, schema, "SELECT {s}.job_table_run_async(:name, 46, :command)",
        name=suffix, command=command,
    )  # fmt: skip
    return [f"{t}_{suffix}" for t in tables]


def valid(engine: Engine, schema: str, index: str) -> bool | None:
    rows = sql(
        engine, schema,
        "SELECT x.indisvalid FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
        "JOIN pg_namespace n ON n.oid = i.relnamespace WHERE n.nspname = :s AND i.relname = :i",
        s=schema, i=index,
    )  # fmt: skip
    return rows[0][0] if rows else None


def test_a_pending_bam_build_is_run_by_us_and_node_skips_the_turn(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("parted", partition=True))
    built = queue_bam(engine, schema, "i15", "(name, created_on)")
    assert len(built) == 2
    report = Supervisor(py_engine, schema=schema, **ONLY_BAM).run_once(force=True)
    assert [b.split(":")[-1].strip() for b in report.bam] == ["completed", "completed"]
    assert all(valid(engine, schema, index) for index in built)
    # Node reads the rows as its own runner leaves them.
    boss = node46(schema)  # migrate: true, Node's default: its BAM runner polls at start
    entries = [e for e in boss.call("getBamEntries") if e["name"] == "i15"]
    assert [e["status"] for e in entries] == ["completed", "completed"]
    assert all(e["error"] is None for e in entries)
    # We hold bam_on for 60 s: Node's runner, polling at its start, leaves a new row alone.
    later = queue_bam(engine, schema, "i16", "(name, completed_on) WHERE completed_on IS NOT NULL")
    boss2 = node46(schema)
    time.sleep(2)
    assert boss.events_of("bam") == boss2.events_of("bam") == []
    statuses = sql(engine, schema, "SELECT DISTINCT status FROM {s}.bam WHERE name = 'i16'")
    assert [r[0] for r in statuses] == ["pending"]
    # With the turn free, a Node runner starting now builds them: the stamp kept it away.
    sql(engine, schema, "UPDATE {s}.version SET bam_on = NULL")
    boss3 = node46(schema)
    assert wait_until(lambda: all(valid(engine, schema, index) for index in later), timeout=20)
    assert boss3.events_of("bam")
    assert boss.errors() == boss2.errors() == boss3.errors() == []


# --------------------------------------------------------------- reindex


def test_node_skips_the_reindex_turn_we_claimed(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("bloat"))
    settings: dict[str, Any] = {"schedule": False, "bam": False, "flows": False}
    report = Supervisor(py_engine, schema=schema, **settings).run_once()
    assert report.reindexed == ()  # nothing bloated yet, but the day's turn is ours
    sql(engine, schema, "INSERT INTO {s}.job (name) SELECT 'bloat' FROM generate_series(1, 60000)")
    sql(engine, schema, "DELETE FROM {s}.job WHERE name = 'bloat'")
    autocommit(engine, schema, "VACUUM ANALYZE {s}.job_common")
    size = "SELECT pg_relation_size(to_regclass(:i))"
    pkey = f'"{schema}".job_common_pkey'
    bloated = sql(engine, schema, size, i=pkey)[0][0]
    assert bloated > 128 * 8192
    boss = node46(schema, migrate=False)
    boss.call("supervise")  # Node's whole pass, reindex last: its claim finds our stamp
    assert sql(engine, schema, size, i=pkey)[0][0] == bloated
    # With the turn free, the same call rebuilds: the stamp is what kept Node away.
    sql(engine, schema, "UPDATE {s}.version SET reindex_on = NULL")
    boss.call("supervise")
    assert sql(engine, schema, size, i=pkey)[0][0] < 128 * 8192
    # Node's claim holds us off in turn.
    report = Supervisor(py_engine, schema=schema, **settings).run_once()
    assert report.reindexed == ()
    assert boss.errors() == []


# --------------------------------------------------------------- rrule cron

CRON_SETTINGS: dict[str, Any] = {
    "supervise": False,
    "bam": False,
    "cron_monitor_interval": 1,
    "cron_worker_interval": 1,
}
NODE_CRON: dict[str, Any] = {
    "schedule": True,
    "migrate": False,
    "cronMonitorIntervalSeconds": 1,
    "cronWorkerIntervalSeconds": 1,
}
RULES = {
    "plain": "FREQ=MINUTELY;INTERVAL=1",
    "dated": "DTSTART:20260101T000000Z\nRRULE:FREQ=SECONDLY;INTERVAL=20",
}


def send_it_slots(engine: Engine, schema: str, key: str) -> Counter[Any]:
    rows = sql(
        engine, schema,
        "SELECT singleton_on FROM {s}.job WHERE name = :n AND singleton_key = :k",
        n=SEND_IT_QUEUE, k=key,
    )  # fmt: skip
    return Counter(r.singleton_on for r in rows)


def sent_to(engine: Engine, schema: str, queue: str) -> list[Any]:
    return sql(engine, schema, "SELECT data FROM {s}.job WHERE name = :q", q=queue)


def test_rrule_schedules_node_stored_fire_through_our_timekeeper(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("rule_q"))
    boss = node46(schema, migrate=False)  # no timekeeper on the Node side
    for key, rule in RULES.items():
        boss.call("schedule", "rule_q", rule, {"key": key}, {"key": key})
    kinds = sql(engine, schema, "SELECT DISTINCT kind FROM {s}.schedule")
    assert [r[0] for r in kinds] == ["rrule"]
    supervisor = Supervisor(py_engine, schema=schema, **CRON_SETTINGS)
    supervisor.start()
    try:
        assert wait_until(lambda: len(sent_to(engine, schema, "rule_q")) >= 2, timeout=10)
    finally:
        supervisor.stop(5)
    keys = Counter(r.data["key"] for r in sent_to(engine, schema, "rule_q"))
    assert set(keys) == set(RULES)
    for key in RULES:
        slots = send_it_slots(engine, schema, f"rule\\_q__{key}")
        assert slots and set(slots.values()) == {1}, (key, slots)
    last = sql(engine, schema, "SELECT count(*) FROM {s}.schedule WHERE last_job_id IS NOT NULL")
    assert last[0][0] == 2
    assert boss.errors() == []


def test_both_timekeepers_send_each_rrule_occurrence_once(
    engine: Engine, py_engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("rule_q"))
    boss = node46(schema, **NODE_CRON)
    for key, rule in RULES.items():
        boss.call("schedule", "rule_q", rule, {"key": key}, {"key": key})
    supervisor = Supervisor(py_engine, schema=schema, **CRON_SETTINGS)
    supervisor.start()
    try:
        time.sleep(6)
    finally:
        supervisor.stop(5)
        boss.close()
    for key in RULES:
        slots = send_it_slots(engine, schema, f"rule\\_q__{key}")
        assert slots and set(slots.values()) == {1}, (key, slots)
    sent = Counter(r.data["key"] for r in sent_to(engine, schema, "rule_q"))
    for key in RULES:
        [(done,)] = sql(
            engine, schema,
            "SELECT count(*) FROM {s}.job WHERE name = :n AND singleton_key = :k "
            "AND state = 'completed'",
            n=SEND_IT_QUEUE, k=f"rule\\_q__{key}",
        )  # fmt: skip
        assert sent[key] == done >= 1
    assert boss.errors() == []


# Node 12.38's own reading of a rule (its rrule module, on rrule-temporal): every
# occurrence in (after, until], and the latest one.
NODE_RRULE = """
import { occurrencesInWindow, latestOccurrenceBefore } from './node_modules/pg-boss/dist/rrule.js'
const cases = JSON.parse(process.argv[1])
const iso = d => d === null ? null : d.toISOString().replace('.000Z', '+00:00')
console.log(JSON.stringify(cases.map(([expr, tz, after, until]) => [
  occurrencesInWindow(expr, new Date(after), new Date(until), tz).map(iso),
  iso(latestOccurrenceBefore(expr, new Date(after), new Date(until), tz)),
])))
"""

PARIS = "Europe/Paris"
SPRING = ("2026-03-28T23:00:00", "2026-03-29T04:00:00")  # Paris: 02:00 -> 03:00
AUTUMN = ("2026-10-24T23:00:00", "2026-10-25T04:00:00")  # Paris: 03:00 -> 02:00
RULE_CASES = [
    # (expression, zone, after, until)
    ("FREQ=HOURLY;BYMINUTE=30", PARIS, *SPRING),
    ("FREQ=HOURLY;BYMINUTE=30", PARIS, *AUTUMN),
    ("FREQ=HOURLY;BYHOUR=2,3;BYMINUTE=30", PARIS, *SPRING),
    ("FREQ=HOURLY;BYHOUR=2,3;BYMINUTE=30", PARIS, *AUTUMN),
    ("FREQ=HOURLY", PARIS, *AUTUMN),
    ("FREQ=HOURLY;INTERVAL=2", PARIS, "2026-10-24T20:10:00", "2026-10-25T06:50:00"),
    ("FREQ=HOURLY;INTERVAL=3", PARIS, "2026-03-28T20:10:00", "2026-03-29T08:50:00"),
    ("FREQ=MINUTELY;INTERVAL=20", PARIS, *SPRING),
    ("FREQ=MINUTELY;INTERVAL=20", PARIS, *AUTUMN),
    ("FREQ=MINUTELY;INTERVAL=20;BYHOUR=2", PARIS, *AUTUMN),
    ("FREQ=DAILY;BYHOUR=2;BYMINUTE=30", PARIS, "2026-03-27T00:00:00", "2026-03-31T00:00:00"),
    ("FREQ=DAILY;BYHOUR=2;BYMINUTE=30", PARIS, "2026-10-23T00:00:00", "2026-10-27T00:00:00"),
    ("FREQ=DAILY;INTERVAL=2;BYHOUR=9", "UTC", "2026-12-01T00:00:00", "2026-12-08T00:00:00"),
    ("FREQ=MINUTELY;INTERVAL=7", "America/New_York", "2026-12-01T09:00:00", "2026-12-01T10:00:00"),
    ("FREQ=WEEKLY;INTERVAL=2;BYDAY=MO,TH;BYHOUR=8", "UTC", "2026-11-01T00:00:00",
     "2026-12-31T00:00:00"),
    ("FREQ=MONTHLY;BYDAY=-1FR;BYHOUR=17", PARIS, "2026-01-01T00:00:00", "2026-07-01T00:00:00"),
    ("FREQ=MONTHLY;BYDAY=MO,TU,WE,TH,FR;BYSETPOS=-1", "UTC", "2026-01-01T00:00:00",
     "2026-05-01T00:00:00"),
    ("FREQ=YEARLY;BYMONTH=2;BYMONTHDAY=29", "UTC", "2020-01-01T00:00:00", "2033-01-01T00:00:00"),
    (
        "DTSTART;TZID=America/New_York:20260105T090000\\nRRULE:FREQ=WEEKLY;BYDAY=MO,WE;COUNT=5",
        "UTC", "2026-01-01T00:00:00", "2026-03-01T00:00:00",
    ),
    (
        "DTSTART:20261201T090000Z\\nRRULE:FREQ=DAILY;UNTIL=20261210T000000Z\\n"
        "EXDATE:20261203T090000Z\\nRDATE:20261203T120000Z",
        "UTC", "2026-11-30T00:00:00", "2026-12-31T00:00:00",
    ),
    ("FREQ=SECONDLY;INTERVAL=20", "UTC", "2026-12-01T09:00:15", "2026-12-01T09:01:15"),
    # A zone offset by half an hour: minutes are the wall clock's.
    ("FREQ=HOURLY;BYMINUTE=0,45", "Asia/Kolkata", "2026-12-01T00:00:00", "2026-12-01T04:00:00"),
    ("FREQ=MINUTELY;INTERVAL=45;BYMINUTE=0,30", "Asia/Kolkata", "2026-12-01T00:00:00",
     "2026-12-01T04:00:00"),
]  # fmt: skip


def test_recurrence_rules_read_as_node_reads_them(node46_modules: None) -> None:
    cases = [
        (expr.replace("\\n", "\n"), tz, after + "Z", until + "Z")
        for expr, tz, after, until in RULE_CASES
    ]
    node = json.loads(run_node46("--input-type=module", "-e", NODE_RRULE, json.dumps(cases)))
    for (expr, tz, after, until), (window, latest) in zip(cases, node, strict=True):
        rule = rrule.parse(expr, tz)
        lower = dt.datetime.fromisoformat(after)
        upper = dt.datetime.fromisoformat(until)
        ours = [o.astimezone(dt.UTC).isoformat() for o in rule.between(lower, upper)]
        assert ours == window, expr
        found = rule.latest(lower, upper)
        assert (found.astimezone(dt.UTC).isoformat() if found else None) == latest, expr
