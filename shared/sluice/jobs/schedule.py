"""Schedules: AWS ``rate(...)`` and ``cron(...)`` expressions, from the job table.

Each job's entry in ``JOBS`` is the one source of truth for when it fires: the generated
serverless.yml carries that expression to EventBridge, and ``sluice dev`` fires the same
expression locally (no deployment file is read at run time, so the wheel needs none).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sluice.core.errors import ConfigurationError


class Scheduled(Protocol):
    """What a schedule is read from: a job's table entry."""

    @property
    def schedule(self) -> str: ...

_RATE = re.compile(r"^rate\(\s*(\d+)\s+(minute|minutes|hour|hours|day|days)\s*\)$")
_CRON = re.compile(r"^cron\((.+)\)$")
_UNIT = {"minute": 60, "hour": 3600, "day": 86400}


@dataclass(frozen=True)
class Schedule:
    expression: str
    interval: timedelta | None = None  # for rate(...)
    cron: str | None = None  # five-field croniter expression, for cron(...)

    def sentry_schedule(self) -> dict[str, Any]:
        """The schedule as a Sentry monitor's ``schedule`` (an interval or a crontab)."""
        if self.interval is not None:
            seconds = int(self.interval.total_seconds())
            for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
                if seconds % size == 0:
                    return {"type": "interval", "value": seconds // size, "unit": unit}
        assert self.cron is not None
        return {"type": "crontab", "value": self.cron}

    def next_after(self, moment: datetime) -> datetime:
        if self.interval is not None:
            return moment + self.interval
        from croniter import croniter

        assert self.cron is not None
        nxt: datetime = croniter(self.cron, moment).get_next(datetime)
        return nxt

    def next_run(self, now: datetime, last_scheduled: datetime | None) -> datetime | None:
        """When the scheduler fires next, as far as the schedule tells: a cron's next time;
        a rate counts from when its rule was deployed, so only from the last scheduled run
        (None without one)."""
        if self.interval is None:
            return self.next_after(now)
        if last_scheduled is None:
            return None
        missed = max(0, (now - last_scheduled) // self.interval)
        return last_scheduled + (missed + 1) * self.interval


def _aws_dow(field: str) -> str:
    # AWS numbers days 1-7 from Sunday; croniter 0-6 from Sunday. Names pass through.
    def shift(match: re.Match[str]) -> str:
        return str(int(match.group(0)) - 1)

    if "#" in field:
        day, _, nth = field.partition("#")
        return f"{re.sub(r'[1-7]', shift, day)}#{nth}"
    return re.sub(r"(?<![\w#])[1-7](?![\w])", shift, field)


def parse(expression: str) -> Schedule:
    expression = expression.strip()
    if match := _RATE.match(expression):
        count, unit = int(match.group(1)), match.group(2).rstrip("s")
        if count < 1:
            raise ConfigurationError(f"schedule {expression!r}: rate must be at least 1")
        if (count == 1) != (not match.group(2).endswith("s")):
            raise ConfigurationError(f"schedule {expression!r}: AWS wants '1 {unit}' / 'N {unit}s'")
        return Schedule(expression, interval=timedelta(seconds=count * _UNIT[unit]))
    if match := _CRON.match(expression):
        fields = match.group(1).split()
        if len(fields) != 6:
            raise ConfigurationError(f"schedule {expression!r}: AWS cron takes six fields")
        minute, hour, dom, month, dow, year = fields
        if "?" not in (dom, dow):
            raise ConfigurationError(f"schedule {expression!r}: day-of-month or day-of-week must be ?")
        if year not in ("*", "?"):
            raise ConfigurationError(f"schedule {expression!r}: only '*' years are supported locally")
        cron = " ".join([minute, hour, dom.replace("?", "*"), month,
                         _aws_dow(dow.replace("?", "*"))])
        from croniter import croniter

        if not croniter.is_valid(cron):
            raise ConfigurationError(f"schedule {expression!r} is not a valid cron expression")
        return Schedule(expression, cron=cron)
    raise ConfigurationError(f"schedule {expression!r}: expected rate(...) or cron(...)")


# How late a check-in may be before Sentry calls the run missed: EventBridge fires within
# about a minute of its time, and a cold start adds seconds.
CHECKIN_MARGIN_MINUTES = 5


def sentry_monitor_config(schedule: str, timeout_s: int) -> dict[str, Any]:
    """A job's Sentry monitor, sent with each check-in so Sentry creates (or updates) it
    from the job table as Vercel did from ``vercel.json``: its schedule (UTC, as
    EventBridge reads it), the margin, and the run's longest time (the Lambda timeout,
    rounded up to whole minutes)."""
    return {"schedule": parse(schedule).sentry_schedule(), "timezone": "UTC",
            "checkin_margin": CHECKIN_MARGIN_MINUTES,
            "max_runtime": max(1, math.ceil(timeout_s / 60))}


def job_schedules(jobs: Mapping[str, Scheduled]) -> dict[str, list[str]]:
    """Job name -> schedule expressions, from the job table (``JOBS``: Sluice's and the
    app's): the generated deployment and ``sluice dev`` both read them from there."""
    return {name: [job.schedule] for name, job in jobs.items()}
