"""Hostile values into every argument of the public calls at schema 46, sync and
async: each is accepted or refused with a library error (``AlkstoreError``), never a
raw driver error, and the caller's transaction is never poisoned: a write made
before the call commits after it (docs/concepts/guarantees.md).

The sweep prints its tally (inputs tried, accepted, refused, poisoned); the
closing check is that nothing was poisoned and nothing escaped as a non-library
error.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from alkstore_sa import AlkstoreError

UTC = dt.UTC
HOSTILE: dict[str, Any] = {
    "none": None,
    "empty": "",
    "nul": "a\x00b",
    "lone-surrogate": "a\ud800b",
    "bidi": "a\u202eb",
    "huge-text": "x" * 100_000,
    "negative": -1,
    "huge-int": 2**63,
    "nan": float("nan"),
    "inf": float("inf"),
    "bool": True,
    "bytes": b"bytes",
    "set": {1},
    "object": object(),
    "offset+16": dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=16))),
    "offset-23:59": dt.datetime(
        2030, 1, 1, 12, tzinfo=dt.timezone(-dt.timedelta(hours=23, minutes=59))
    ),
    "datetime-max": dt.datetime.max.replace(tzinfo=dt.timezone(dt.timedelta(hours=-12))),
    "datetime-min": dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=14))),
    "naive": dt.datetime(2030, 1, 1),
    "deep": None,  # filled below: 2,000 nested lists
    "big-number": 10**5000 if False else None,  # filled below (built lazily)
}
_deep: list[Any] = []
for _ in range(2000):
    _deep = [_deep]
HOSTILE["deep"] = _deep
HOSTILE["big-number"] = {"n": int("9" * 4000)}

Call = Callable[[Any, Any], Any]
# One hostile value at a time in one argument; the others are fine.
CALLS: dict[str, Call] = {
    "send data": lambda q, v: q.send("q", v),
    "send start_after": lambda q, v: q.send("q", {}, start_after=v),
    "send singleton_key": lambda q, v: q.send("q", {}, singleton_key=v),
    "send priority": lambda q, v: q.send("q", {}, priority=v),
    "send retry_delay": lambda q, v: q.send("q", {}, retry_delay=v),
    "send retry_limit": lambda q, v: q.send("q", {}, retry_limit=v),
    "send expire_seconds": lambda q, v: q.send("q", {}, expire_seconds=v),
    "send group_id": lambda q, v: q.send("q", {}, group_id=v),
    "send dead_letter": lambda q, v: q.send("q", {}, dead_letter=v),
    "send_after": lambda q, v: q.send_after("q", {}, v),
    "send_many data": lambda q, v: q.send_many("q", [{"data": v}]),
    "fetch batch_size": lambda q, v: q.fetch("q", v),
    "complete output": lambda q, v: q.complete("q", uuid.uuid4(), v),
    "fail output": lambda q, v: q.fail("q", uuid.uuid4(), v),
    "get_job id": lambda q, v: q.get_job("q", v),
    "find_jobs queue": lambda q, v: q.find_jobs(v),
    "find_jobs text": lambda q, v: q.find_jobs("q", text=v),
    "find_jobs key": lambda q, v: q.find_jobs("q", key=v),
    "find_jobs since": lambda q, v: q.find_jobs("q", since=v),
    "find_jobs until": lambda q, v: q.find_jobs("q", until=v),
    "find_jobs after": lambda q, v: q.find_jobs("q", after=v),
    "get_warnings type": lambda q, v: q.get_warnings(type=v),
    "get_warnings since": lambda q, v: q.get_warnings(since=v),
    "get_blocked_keys": lambda q, v: q.get_blocked_keys(v),
    "get_queue_stats_history from_": lambda q, v: q.get_queue_stats_history("q", from_=v),
    "schedule cron": lambda q, v: q.schedule("q", v),
    "schedule data": lambda q, v: q.schedule("q", "* * * * *", v),
    "schedule key": lambda q, v: q.schedule("q", "* * * * *", key=v),
    "schedule tz": lambda q, v: q.schedule("q", "* * * * *", tz=v),
    "redrive to": lambda q, v: q.redrive("dlq", v),
    "redrive into key_strict_fifo ids": lambda q, v: q.redrive("dlq", "fifo", v),
    "create_queue name": lambda q, v: q.create_queue(v),
    "create_queue retry_delay": lambda q, v: q.create_queue("q2", retry_delay=v),
    "publish event": lambda q, v: q.publish(v, {}),
    "subscribe event": lambda q, v: q.subscribe(v, "q"),
    "supervise now": lambda q, v: q.supervise("q", force=True, now=v),
}


@pytest.mark.slow
def test_no_hostile_value_poisons_the_callers_transaction(env46: Any) -> None:
    env = env46
    env.tx(lambda q: q.create_queue("dlq"))
    env.tx(lambda q: q.create_queue("q", dead_letter="dlq"))
    env.tx(lambda q: q.create_queue("fifo", policy="key_strict_fifo"))
    # A keyless dead letter: redriving it into the key_strict_fifo queue conflicts.
    env.sql("INSERT INTO {s}.job (name, state) VALUES ('dlq', 'failed')")
    tally = {"tried": 0, "accepted": 0, "refused": 0}
    poisoned: list[str] = []
    escaped: list[str] = []
    for label, call in CALLS.items():
        for kind, value in HOSTILE.items():
            tally["tried"] += 1
            svc = env.service()
            marker = f"{label}/{kind}"
            svc.send("q", {"marker": marker})  # the caller's own write, first
            try:
                call(svc, value)
                tally["accepted"] += 1
            except AlkstoreError:
                tally["refused"] += 1
            except Exception as exc:  # not a library error: a defect
                escaped.append(f"{marker}: {type(exc).__name__}: {str(exc)[:120]}")
            try:
                env.commit()
            except Exception as exc:
                poisoned.append(f"{marker}: commit failed: {type(exc).__name__}")
                env.rollback()
                continue
            found = env.sql(
                "SELECT 1 FROM {s}.job WHERE data = jsonb_build_object('marker', CAST(:m AS text))",
                m=marker,
            )
            if not found:
                poisoned.append(f"{marker}: the caller's write was rolled back")
    print(f"\nhostile inputs ({env.flavour}): {tally}, poisoned {len(poisoned)}")
    assert escaped == [], "\n".join(escaped)
    assert poisoned == [], "\n".join(poisoned)
