"""The missed-run rule: due one schedule step after the last scheduled run, overdue a grace
(a tenth of the period, at least 5 minutes) later; the alarm's window is the longest gap
plus that grace."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sluice.jobs.overdue import alarm_window, grace, job_state, period

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)


def test_the_grace_is_a_tenth_of_the_period_and_at_least_five_minutes() -> None:
    assert grace(timedelta(minutes=1)) == timedelta(minutes=5)
    assert grace(timedelta(hours=1)) == timedelta(minutes=6)
    assert grace(timedelta(days=1)) == timedelta(hours=2, minutes=24)


def test_windows_cover_the_longest_gap() -> None:
    assert period("rate(5 minutes)") == timedelta(minutes=5)
    assert period("cron(15 3 * * ? *)") == timedelta(days=1)
    # weekdays only: Friday 09:00 to Monday 09:00 is the gap that matters
    assert period("cron(0 9 ? * MON-FRI *)") == timedelta(days=3)
    assert alarm_window("rate(1 minute)") == 360
    assert alarm_window("rate(1 hour)") == 3960
    assert alarm_window("cron(15 3 * * ? *)") == 95040


def test_a_rate_job_is_overdue_only_past_the_grace() -> None:
    last = NOW - timedelta(minutes=9, seconds=59)
    state = job_state(["rate(5 minutes)"], last, NOW)
    assert state["state"] == "ok" and state["expectedRunAt"] == "2026-12-03T11:55:01.000Z"
    assert job_state(["rate(5 minutes)"], NOW - timedelta(minutes=10, seconds=1),
                     NOW)["state"] == "overdue"


def test_a_cron_job_is_due_at_its_next_time_after_the_last_run() -> None:
    # ran at 03:15 yesterday: due 03:15 today, overdue after 05:39 (2 h 24 min grace)
    last = datetime(2026, 12, 2, 3, 15, 2, tzinfo=UTC)
    at_five = job_state(["cron(15 3 * * ? *)"], last, datetime(2026, 12, 3, 5, 0, tzinfo=UTC))
    assert at_five["state"] == "ok" and at_five["expectedRunAt"] == "2026-12-03T03:15:00.000Z"
    assert job_state(["cron(15 3 * * ? *)"], last, NOW)["state"] == "overdue"


def test_never_run_and_disabled_are_states_of_their_own() -> None:
    assert job_state(["rate(1 minute)"], None, NOW)["state"] == "never"
    mark = {"by": "ops", "at": "2026-12-01T00:00:00.000Z", "reason": "paused"}
    state = job_state(["rate(1 minute)"], NOW - timedelta(days=2), NOW, mark)
    assert state["state"] == "disabled" and state["disabled"] == mark
