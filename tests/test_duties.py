"""The duties of the supervise pass: one list per schema version that brings
new ones, found by one lookup (the newest list at or below the installed version)."""

from __future__ import annotations

import pytest

from alkstore_sa.ops import supervision
from alkstore_sa.ops.duties26 import DUTIES26
from alkstore_sa.ops.duties46 import DUTIES46
from alkstore_sa.ops.frame import Duty, Settings


def test_a_version_takes_the_newest_list_at_or_below_it() -> None:
    assert supervision.duties_for(26) is DUTIES26
    assert supervision.duties_for(45) is DUTIES26
    assert supervision.duties_for(46) is DUTIES46
    assert supervision.duties_for(47) is DUTIES46  # a schema that adds no duty inherits 46's
    with pytest.raises(LookupError, match="25"):
        supervision.duties_for(25)


def test_each_version_lists_its_duties_in_the_order_a_pass_takes_them() -> None:
    assert [d.name for d in DUTIES26] == [
        "monitor",
        "maintain",
        "attempt history",
        "cron",
        "send-it",
    ]
    assert [d.name for d in DUTIES46] == [
        "stats history",
        "monitor",
        "maintain",
        "monitor backoff",
        "warning retention",
        "stats retention",
        "upkeep",
        "attempt history",
        "reindex",
        "cron",
        "send-it",
        "flows",
        "bam",
    ]
    for duties in (DUTIES26, DUTIES46):
        # The monitor and the maintenance are taken chunk by chunk, together.
        assert [d.name for d in duties if d.per_chunk] == ["monitor", "maintain"]
        for duty in duties:
            if duty.interval is not None:
                assert isinstance(getattr(Settings(), duty.interval), int | float)


def test_a_duty_naming_no_switch_setting_or_report_field_is_refused() -> None:
    turn = DUTIES26[0].turn
    with pytest.raises(ValueError, match="gate 'montior'"):
        Duty("monitor", "montior", turn)
    with pytest.raises(ValueError, match="'monitor_intreval' is not an interval"):
        Duty("monitor", "monitor", turn, interval="monitor_intreval")
    with pytest.raises(ValueError, match="reports no such field"):
        Duty("monitor", "monitor", turn, reports=("monitered",))
