"""Durations, queue settings and a job's attempt as the CLI, the dashboard and the
worker's log say them."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from alkstore_sa._humanize import (
    attempt_of,
    duration,
    job_attempt,
    job_attempt_short,
    queue_note,
    queue_settings,
)
from alkstore_sa.models.enums import JobState, QueuePolicy
from alkstore_sa.records import Job, QueueInfo


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "-"),
        (0, "0 s"),
        (0.25, "250 ms"),
        (45, "45 s"),
        (240, "4 min"),
        (3599, "59 min 59 s"),
        (5400, "1 h 30 min"),
        (86_400, "1 day"),
        (90_061, "1 day 1 h"),
        (1_209_600, "14 days"),
        (-5, "-5 s"),
    ],
)
def test_duration_uses_at_most_two_units(seconds: float | None, text: str) -> None:
    assert duration(seconds) == text


def _queue(**changes: object) -> QueueInfo:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    values: dict[str, object] = dict(
        name="payments",
        policy=QueuePolicy.STANDARD,
        retry_limit=2,
        retry_delay=4,
        retry_backoff=True,
        retry_delay_max=None,
        expire_seconds=900,
        retention_seconds=1_209_600,
        deletion_seconds=604_800,
        dead_letter="payments-dlq",
        partition=False,
        table_name="job_common",
        deferred_count=0,
        queued_count=0,
        warning_queued=0,
        active_count=0,
        total_count=0,
        singletons_active=None,
        monitor_on=None,
        maintain_on=None,
        created_on=now,
        updated_on=now,
    )
    values.update(changes)
    return QueueInfo(**values)  # type: ignore[arg-type]


def test_queue_settings_read_in_human_units() -> None:
    shown = {s.option: s.value for s in queue_settings(_queue())}
    assert shown["retry_limit"] == "2 retries (3 attempts)"
    assert shown["retention_seconds"] == "14 days"
    assert shown["deletion_seconds"] == "7 days"
    assert shown["expire_seconds"] == "15 min"
    assert shown["dead_letter"] == "payments-dlq"
    assert shown["warning_queued"] == "off"
    assert "heartbeat_seconds" not in shown


def test_queue_settings_show_the_heartbeat_at_46() -> None:
    shown = {s.option: s for s in queue_settings(_queue(heartbeat_seconds=30))}
    assert shown["heartbeat_seconds"].value == "30 s"
    assert shown["retention_seconds"].meaning != shown["deletion_seconds"].meaning


def test_queue_note_names_the_internal_queues_only() -> None:
    note = queue_note("__pgboss__send-it")
    assert note is not None and "cron" in note
    assert queue_note("__pgboss__other") == "internal to pg-boss"
    assert queue_note("payments") is None


def _job(state: str, retry_count: int, retry_limit: int, *, started: bool = True) -> Job:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    return Job(
        id=uuid.uuid4(),
        name="payments",
        data=None,
        state=JobState(state),
        priority=0,
        retry_limit=retry_limit,
        retry_count=retry_count,
        retry_delay=0,
        retry_backoff=False,
        retry_delay_max=None,
        expire_seconds=900,
        deletion_seconds=604_800,
        singleton_key=None,
        singleton_on=None,
        start_after=now,
        created_on=now,
        started_on=now if started else None,
        completed_on=None,
        keep_until=now,
        output=None,
        dead_letter=None,
        policy=None,
    )


@pytest.mark.parametrize(
    ("job", "long", "short"),
    [
        # pg-boss raises retry_count when it claims a job that ran before: while active,
        # retry_count + 1 is the attempt that runs.
        (_job("created", 0, 2, started=False), "no attempt yet, 3 allowed", "0 of 3"),
        (_job("active", 0, 2), "attempt 1 of 3", "1 of 3"),
        (_job("retry", 0, 2), "attempt 1 of 3 failed, attempt 2 next", "1 of 3"),
        (_job("active", 2, 2), "attempt 3 of 3", "3 of 3"),
        (_job("failed", 2, 2), "attempt 3 of 3", "3 of 3"),
        (_job("completed", 1, 2), "attempt 2 of 3", "2 of 3"),
        (_job("cancelled", 0, 0, started=False), "no attempt yet, 1 allowed", "0 of 1"),
    ],
)
def test_a_jobs_attempt_reads_as_attempts_made_of_attempts_allowed(
    job: Job, long: str, short: str
) -> None:
    assert (job_attempt(job), job_attempt_short(job)) == (long, short)


def test_attempt_of_is_the_one_wording_of_an_attempt_number() -> None:
    assert attempt_of(2, 3) == "attempt 2 of 3"
