"""Recurrence-rule schedules across the two clients at schema 46: a rule Python
stores is read and fired by Node pg-boss 12.38.0's timekeeper, and a rule Node
stores is read back by ``get_schedules``."""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import Engine, text
from support.interop46 import schema46_by, sql, wait_until
from support.node import in_tx, node46, node46_modules, node_url, py_engine, run_node46

from alkstore_sa.names import SEND_IT_QUEUE

__all__ = ["node46", "node46_modules", "node_url", "py_engine", "schema46_by"]

pytestmark = pytest.mark.interop

NODE_CRON: dict[str, Any] = {
    "schedule": True,
    "migrate": False,
    "cronMonitorIntervalSeconds": 1,
    "cronWorkerIntervalSeconds": 1,
}
RULE = "DTSTART:20260101T000000Z\nRRULE:FREQ=SECONDLY;INTERVAL=20"


def test_a_rule_python_stores_is_fired_by_nodes_timekeeper(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("rule_q"))
    in_tx(
        engine,
        schema,
        lambda q: q.schedule(
            "rule_q", RULE, {"from": "python"}, key="py", tz="Europe/Paris", priority=4
        ),
    )
    boss = node46(schema, **NODE_CRON)
    [theirs] = boss.call("getSchedules", "rule_q")
    assert (theirs["kind"], theirs["cron"], theirs["timezone"]) == ("rrule", RULE, "Europe/Paris")

    def sent() -> list[Any]:
        return sql(engine, schema, "SELECT id, data, priority FROM {s}.job WHERE name = 'rule_q'")

    assert wait_until(lambda: len(sent()) >= 1, timeout=30)
    boss.close()
    jobs = sent()
    assert {(j.data["from"], j.priority) for j in jobs} == {("python", 4)}
    keys = sql(
        engine, schema, "SELECT DISTINCT singleton_key FROM {s}.job WHERE name = :n",
        n=SEND_IT_QUEUE,
    )  # fmt: skip
    assert [k[0] for k in keys] == ["rule\\_q__py"]
    [info] = in_tx(engine, schema, lambda q: q.get_schedules("rule_q"))
    assert info.last_job_id in {j.id for j in jobs}
    assert boss.errors() == []


def test_get_schedules_reads_a_rule_node_stores(
    engine: Engine, schema46_by: str, node46: Any
) -> None:
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("rule_q"))
    boss = node46(schema, migrate=False)
    rule = "FREQ=WEEKLY;BYDAY=MO;BYHOUR=9;BYMINUTE=0"
    boss.call("schedule", "rule_q", rule, {"n": 1}, {"key": "node", "tz": "Europe/Paris"})
    [info] = in_tx(engine, schema, lambda q: q.get_schedules("rule_q", "node"))
    assert (info.kind, info.cron, info.timezone, info.data) == (
        "rrule",
        rule,
        "Europe/Paris",
        {"n": 1},
    )
    # Node and we store the same row for the same call.
    in_tx(
        engine,
        schema,
        lambda q: q.schedule("rule_q", rule, {"n": 1}, key="py", tz="Europe/Paris"),
    )
    rows = sql(
        engine, schema,
        "SELECT key, kind, cron, timezone, data, options FROM {s}.schedule ORDER BY key",
    )  # fmt: skip
    node_row, py_row = rows
    assert node_row[1:5] == py_row[1:5]
    assert {k: v for k, v in node_row.options.items() if k != "key"} == {
        k: v for k, v in py_row.options.items() if k != "key"
    }


def test_node_refuses_what_we_refuse(schema46_by: str, node46: Any, engine: Engine) -> None:
    # A spent rule and an out-of-range part: refused by both clients.
    schema = schema46_by
    in_tx(engine, schema, lambda q: q.create_queue("rule_q"))
    boss = node46(schema, migrate=False)
    for bad in ("FREQ=DAILY;UNTIL=20200101T000000Z", "FREQ=DAILY;BYHOUR=25"):
        with pytest.raises(Exception, match="rrule"):
            boss.call("schedule", "rule_q", bad, None, {})
        with pytest.raises(Exception, match="rrule"):
            in_tx(engine, schema, lambda q, bad=bad: q.schedule("rule_q", bad))  # type: ignore[misc]
    assert sql(engine, schema, "SELECT count(*) FROM {s}.schedule")[0][0] == 0


# Node 12.38's verdict on an expression, from its own rrule module: what its
# schedule() checks (assertRrule, then assertRruleSends at "now").
NODE_VERDICT = """
import { assertRrule, assertRruleSends } from './node_modules/pg-boss/dist/rrule.js'
const [cases, now] = JSON.parse(process.argv[1])
console.log(JSON.stringify(cases.map(([expr, tz]) => {
  try { assertRrule(expr, tz); assertRruleSends(expr, tz, new Date(now)); return true }
  catch (err) { return false }
})))
"""
VERDICT_CASES = [
    ("FREQ=DAILY;BYHOUR=9", "Europe/Paris"),
    ("DTSTART;TZID=Europe/Paris:20260105T083000\nRRULE:FREQ=WEEKLY;INTERVAL=2;BYDAY=MO", "UTC"),
    ("FREQ=MONTHLY;BYDAY=-1FR", "UTC"),
    ("FREQ=MONTHLY;BYMONTHDAY=-1;BYHOUR=23", "UTC"),
    ("FREQ=HOURLY;UNTIL=20990101T000000Z", "UTC"),
    ("FREQ=DAILY;BYHOUR=25", "UTC"),
    ("FREQ=DAILY;INTERVAL=0", "UTC"),
    ("FREQ=WEEKLY;BYMONTHDAY=3", "UTC"),
    ("FREQ=DAILY;BYDAY=1MO", "UTC"),
    ("FREQ=DAILY;BYHOURS=9", "UTC"),
    ("FREQ=DAILY;COUNT=3", "UTC"),
    ("FREQ=DAILY;UNTIL=20200101T000000Z", "UTC"),
    ("DTSTART:20200101T090000Z\nRRULE:FREQ=DAILY;COUNT=3", "UTC"),
    ("FREQ=DAILY;BYHOUR=9", "Mars/Olympus"),
]


def test_schedule_accepts_and_refuses_the_rules_node_does(
    engine: Engine, node46_modules: None
) -> None:
    from alkstore_sa import rrule
    from alkstore_sa.errors import InvalidOptionsError

    with engine.connect() as conn:
        now = conn.execute(text("SELECT now()")).scalar_one()
    node = json.loads(
        run_node46(
            "--input-type=module", "-e", NODE_VERDICT,
            json.dumps([VERDICT_CASES, now.isoformat()]),
        )
    )  # fmt: skip
    ours = []
    for expr, tz in VERDICT_CASES:
        try:
            rrule.validate(expr, tz)
            ours.append(rrule.parse(expr, tz).sends_after(now))
        except InvalidOptionsError:
            ours.append(False)
    assert ours == node
