from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sluice.core.errors import ConfigurationError
from sluice.jobs.registry import JOBS
from sluice.jobs.schedule import job_schedules, parse

T0 = datetime(2026, 11, 29, 10, 7, tzinfo=UTC)  # a Sunday


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("rate(1 minute)", T0 + timedelta(minutes=1)),
        ("rate(5 minutes)", T0 + timedelta(minutes=5)),
        ("rate(1 hour)", T0 + timedelta(hours=1)),
        ("rate(2 days)", T0 + timedelta(days=2)),
        ("cron(15 3 * * ? *)", datetime(2026, 11, 30, 3, 15, tzinfo=UTC)),
        ("cron(0/10 * * * ? *)", datetime(2026, 11, 29, 10, 10, tzinfo=UTC)),
        ("cron(0 9 ? * 2 *)", datetime(2026, 11, 30, 9, 0, tzinfo=UTC)),  # AWS 2 = Monday
        ("cron(0 9 ? * MON-FRI *)", datetime(2026, 11, 30, 9, 0, tzinfo=UTC)),
        ("cron(0 12 1 * ? *)", datetime(2026, 12, 1, 12, 0, tzinfo=UTC)),
    ],
)
def test_next_fire_time(expression: str, expected: datetime) -> None:
    assert parse(expression).next_after(T0) == expected


@pytest.mark.parametrize(
    "expression",
    ["rate(0 minutes)", "rate(1 minutes)", "rate(5 minute)", "rate(5 weeks)", "every day",
     "cron(0 3 * * *)", "cron(0 3 * * 1 *)", "cron(0 3 ? * * 2027)", "cron(99 3 * * ? *)"],
)
def test_bad_expressions_are_refused(expression: str) -> None:
    with pytest.raises(ConfigurationError):
        parse(expression)


def test_every_registered_job_is_scheduled_as_its_table_entry_says() -> None:
    schedules = job_schedules(JOBS)
    assert set(schedules) == set(JOBS)
    for name, job in JOBS.items():
        assert schedules[name] == [job.schedule], name
        parse(job.schedule)


def test_a_rate_counts_from_its_last_scheduled_run_not_from_now() -> None:
    rate = parse("rate(10 minutes)")
    assert rate.next_run(T0, None) is None, "unknown before the first scheduled run"
    last = T0 - timedelta(minutes=3)
    assert rate.next_run(T0, last) == T0 + timedelta(minutes=7)
    assert rate.next_run(T0, T0 - timedelta(minutes=25)) == T0 + timedelta(minutes=5)
    assert parse("cron(15 3 * * ? *)").next_run(T0, None) == datetime(2026, 11, 30, 3, 15,
                                                                        tzinfo=UTC)
