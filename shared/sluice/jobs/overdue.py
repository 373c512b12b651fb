"""Missed runs: when a job's scheduler should have invoked it, and whether it has.

One rule, used by both sides of the watch. A job is due again one schedule step after its
last scheduled run (``rate(...)``: that interval later; ``cron(...)``: its next time), and
``overdue`` once that time plus a grace has passed without a scheduled run. The grace is
``grace(period)``: a tenth of the period, at least 5 minutes (a run is late by its own
duration and Lambda's scheduling jitter, never by minutes). The generated CloudWatch alarm
(``python -m infra.generate``) pages when the job's function had no invocation for
``alarm_window(schedule)``, the longest gap its schedule allows plus that same grace; the
state below says the same thing from the run log, for ``GET /api/admin/jobs``,
``sluice jobs`` and the console.

A schedule an operator switched off on purpose is marked so (``mark_disabled``, an
audited admin action); the mark is the job's state instead of ``overdue``.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from sluice.core.times import iso_z
from sluice.core.validate import check_text
from sluice.jobs.schedule import Schedule, parse
from sluice.store.state import StateStore

if TYPE_CHECKING:
    from sluice.jobs.registry import Job
    from sluice.store.db import Database

State = Literal["ok", "overdue", "never", "disabled"]
MIN_GRACE = timedelta(minutes=5)
GRACE_FRACTION = 0.1
# Runs the scheduler started: EventBridge's invocation, or an external scheduler's cron GET
# (the filter of last_scheduled_runs in runs.sql and of its index, migration 0030).
SCHEDULED_TRIGGERS = ("schedule", "cron_http")
DISABLED_PREFIX = "job-schedule-disabled:"
MAX_REASON = 200
# Cron schedules are measured over this many consecutive times (a weekday-only cron's
# weekend gap is among them); from a fixed start, so the window is the same every time.
_SAMPLE_FIRES = 500
_SAMPLE_FROM = datetime(2026, 1, 1, tzinfo=UTC)


def grace(period: timedelta) -> timedelta:
    return max(MIN_GRACE, period * GRACE_FRACTION)


@cache
def period(expression: str) -> timedelta:
    """The longest gap between two consecutive times of a schedule."""
    schedule = parse(expression)
    if schedule.interval is not None:
        return schedule.interval
    longest, moment = timedelta(0), _SAMPLE_FROM
    for _ in range(_SAMPLE_FIRES):
        following = schedule.next_after(moment)
        if moment != _SAMPLE_FROM:
            longest = max(longest, following - moment)
        moment = following
    return longest


def alarm_window(expression: str) -> int:
    """Seconds without an invocation after which the missed-run alarm fires: the period
    plus its grace, rounded up to a whole minute (CloudWatch periods are multiples of 60)."""
    span = period(expression) + grace(period(expression))
    return -(-int(span.total_seconds()) // 60) * 60


def due_after(schedule: Schedule, last: datetime) -> datetime:
    """When the scheduler fires next after a run that started at ``last``."""
    return schedule.next_after(last)


def job_state(expressions: list[str], last_scheduled: datetime | None, now: datetime,
              disabled: dict[str, Any] | None = None) -> dict[str, Any]:
    """``state`` with the times it is judged from: ``lastScheduledRunAt``, ``expectedRunAt``
    (when the next scheduled run was due) and ``overdueAt`` (that plus the grace)."""
    body: dict[str, Any] = {"lastScheduledRunAt": iso_z(last_scheduled) if last_scheduled
                            else None, "expectedRunAt": None, "overdueAt": None,
                            "disabled": disabled}
    if last_scheduled is not None:
        expected = min((due_after(parse(e), last_scheduled), e) for e in expressions)
        overdue_at = expected[0] + grace(period(expected[1]))
        body.update(expectedRunAt=iso_z(expected[0]), overdueAt=iso_z(overdue_at))
    state: State
    if disabled is not None:
        state = "disabled"
    elif last_scheduled is None:
        state = "never"
    else:
        state = "overdue" if now > overdue_at else "ok"
    return {"state": state, **body}


def statuses(db: Database, now: datetime, jobs: Iterable[Job] | None = None
             ) -> dict[str, dict[str, Any]]:
    """``job_state`` of every registered job (or ``jobs``), from the registry's schedules,
    the run log and the marks: what every surface shows."""
    from sluice.jobs.registry import JOBS
    from sluice.jobs.runs import RunStore

    chosen = list(JOBS.values() if jobs is None else jobs)
    last = RunStore(db).last_scheduled_runs((job.name for job in chosen), now)
    marks = DisabledMarks(db).all()
    return {job.name: job_state([job.schedule], last.get(job.name), now, marks.get(job.name))
            for job in chosen}


class DisabledMarks:
    """Which jobs an operator marked as disabled on purpose (who, when, why)."""

    def __init__(self, db: Database) -> None:
        self.state = StateStore(db)

    def all(self) -> dict[str, dict[str, Any]]:
        marks = {key[len(DISABLED_PREFIX):]: self.state.get(key)
                 for key in self.state.keys_with_prefix(DISABLED_PREFIX)}
        return {job: mark for job, mark in marks.items() if isinstance(mark, dict)}

    def mark_disabled(self, job: str, *, reason: Any, actor: str,
                      now: datetime) -> dict[str, Any]:
        mark = {"by": actor, "at": iso_z(now),
                "reason": check_text(reason, field="reason", limit=MAX_REASON)}
        self.state.put(DISABLED_PREFIX + job, mark, now=now)
        return mark

    def mark_enabled(self, job: str) -> bool:
        return self.state.delete(DISABLED_PREFIX + job)
