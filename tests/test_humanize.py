"""Durations and queue settings as the CLI and the dashboard print them."""

from __future__ import annotations

import datetime as dt

import pytest

from alkstore_sa._humanize import duration, queue_note, queue_settings
from alkstore_sa.models.enums import QueuePolicy
from alkstore_sa.records import QueueInfo


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
