"""A retry delay past PostgreSQL's interval range stops nobody else.

pg-boss's backoff at schema 46 multiplies ``retry_delay`` (up to 2^31 - 1 seconds,
which ``send`` accepts) by up to 2^17: about 2.8e14 seconds, past the interval range
(about 9.2e12 seconds). Unclamped, such a job made the whole fail statement raise
(every job failed in that batch stayed active) and expiry fail for every queue of the
job table. The delay is capped at ``LONGEST_RETRY_DELAY`` (100 years); below the cap
it is pg-boss's value. Rows are set up through raw SQL, as Node could write them.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

from sqlalchemy import text

from alkstore_sa.limits import LONGEST_RETRY_DELAY

HUGE = 2**31 - 1
CAP = dt.timedelta(seconds=LONGEST_RETRY_DELAY)


def active_jobs(env: Any) -> tuple[uuid.UUID, uuid.UUID, uuid.UUID]:
    """Three active jobs: a normal one, one with the longest plain delay, and one whose
    next backoff is past the interval range."""
    env.tx(lambda q: q.create_queue("q", retry_limit=1))
    normal = env.tx(lambda q: q.send("q", {"n": 1}))
    plain = env.tx(lambda q: q.send("q", {"n": 2}, retry_delay=HUGE))
    huge = env.tx(
        lambda q: q.send("q", {"n": 3}, retry_delay=HUGE, retry_backoff=True, retry_limit=30)
    )
    assert len(env.tx(lambda q: q.fetch("q", batch_size=3))) == 3
    # 20 attempts so far, as Node's pg-boss may have recorded.
    env.sql("UPDATE {s}.job SET retry_count = 20 WHERE id = :id", id=huge)
    return normal, plain, huge


def states(env: Any) -> dict[Any, tuple[str, Any]]:
    got = env.sql("SELECT id, state::text, start_after FROM {s}.job WHERE name = 'q'")
    return {r.id: (r.state, r.start_after) for r in got}


def test_fail_batch_at_46_caps_the_backoff_past_the_interval_range(env46_sync: Any) -> None:
    env = env46_sync
    normal, plain, huge = active_jobs(env)
    svc = env.service()
    settled = svc.fail("q", [normal, plain, huge], {"why": "x"})
    now = env.session.execute(text("SELECT now()")).scalar_one()
    env.commit()
    assert sorted(settled.affected) == sorted([normal, plain, huge])
    got = states(env)
    assert got[normal] == ("retry", now)
    assert got[plain] == ("retry", now + dt.timedelta(seconds=HUGE))
    # pg-boss's value would be 2^31 * 2^16 * (1 + random()) seconds: capped.
    assert got[huge] == ("retry", now + CAP)


def test_expiry_at_46_retries_a_job_whose_backoff_is_past_the_interval_range(
    env46_sync: Any,
) -> None:
    env = env46_sync
    normal, plain, huge = active_jobs(env)
    env.sql("UPDATE {s}.job SET started_on = now() - interval '1 hour' WHERE name = 'q'")
    report = env.tx(lambda q: q.supervise(force=True))
    assert report.errors == ()
    assert report.expired == {"q": 3}
    got = states(env)
    assert got[normal][0] == got[plain][0] == got[huge][0] == "retry"
    assert got[plain][1] - got[normal][1] == dt.timedelta(seconds=HUGE)
    assert got[huge][1] - got[normal][1] == CAP


def test_fail_at_26_keeps_pg_boss_value_for_the_largest_delay(env: Any) -> None:
    """At 26 the backoff adds to ``retry_delay`` (at most 2^31 - 1 + 2^17 seconds, 68
    years): under the cap, so the value is pg-boss's, not the cap."""
    normal, plain, huge = active_jobs(env)
    svc = env.service()
    svc.fail("q", [normal, plain, huge])
    now = env.session.execute(text("SELECT now()")).scalar_one()
    env.commit()
    got = states(env)
    assert got[normal] == ("retry", now)
    assert got[plain] == ("retry", now + dt.timedelta(seconds=HUGE))
    state, start_after = got[huge]
    assert state == "retry"
    half = 2**16 // 2  # 2^min(16, 21) / 2
    low, high = HUGE + half, HUGE + 2 * half
    assert dt.timedelta(seconds=low) <= start_after - now <= dt.timedelta(seconds=high)
    assert start_after - now < CAP
