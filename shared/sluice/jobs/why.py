""""Why is this job not running?": one sentence from the rules the job list and the runner
use, not a copy of them.

In order: an operator's mark that its schedule is disabled on purpose
(``overdue.DisabledMarks``); a run holding its single-flight lease (``RunStore.lease``: a
trigger meanwhile is skipped) or a lease left past its expiry by a run that never finished
(the next trigger takes it over); else the missed-run state ``overdue.job_state`` gives the
job list (``overdue`` past its expected run plus the grace, ``never`` run by its scheduler,
``ok`` with its next expected run), with the missed-run alarm's state
(``overdue.alarm_window`` after the last scheduled run, as the generated alarm counts it).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sluice.core.times import iso_z, iso_z_or_none
from sluice.jobs.overdue import alarm_window, statuses
from sluice.jobs.runs import RunStore

if TYPE_CHECKING:
    from sluice.jobs.registry import Job
    from sluice.store.db import Database


# The answers, in the order they are decided (the first that holds is the answer).
KINDS = ("disabled", "running", "lease_lapsed", "overdue", "never", "scheduled")


def _time(value: Any) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value).astimezone(UTC)


def job_why(db: Database, job: Job, now: datetime) -> dict[str, Any]:
    """``kind`` (``disabled``, ``running``, ``lease_lapsed``, ``overdue``, ``never`` or
    ``scheduled``), ``until`` (when that ends by itself, if it does), ``sentence``, and what
    it is judged from: the job list's ``state``, the ``lease``, the ``lastRun`` and the
    ``alarm``."""
    runs = RunStore(db)
    state = statuses(db, now, [job])[job.name]
    lease = runs.lease(job.name)
    last = runs.last_runs([job.name]).get(job.name)
    last_scheduled = _time(state["lastScheduledRunAt"])
    window = alarm_window(job.schedule)
    alarm_at = last_scheduled + timedelta(seconds=window) if last_scheduled else None
    alarm = {"windowS": window, "at": iso_z_or_none(alarm_at),
             "state": "alarm" if alarm_at is None or now >= alarm_at else "ok"}
    ran = (f"its last run: {last['outcome']} ({last['trigger']}) at "
           f"{iso_z(_time(last['started_at']) or now)}" if last else "it has never run")
    until: datetime | None = None
    expires = _time(lease["expires_at"]) if lease else None
    if state["disabled"] is not None:
        mark = state["disabled"]
        kind, sentence = "disabled", (
            f"Its schedule is disabled on purpose by {mark['by']} at {mark['at']} "
            f"({mark['reason']}): not overdue, and the missed-run alarm is expected")
    elif expires is not None and expires > now:
        kind, until = "running", expires
        sentence = (f"A run holds its lease until {iso_z(expires)}: a trigger meanwhile is "
                    "skipped (single-flight)")
    elif expires is not None:
        kind = "lease_lapsed"
        sentence = (f"A run took its lease and never finished (expired at {iso_z(expires)}): "
                    "the next trigger takes the lease over and runs")
    elif state["state"] == "overdue":
        kind = "overdue"
        sentence = (f"Overdue: its scheduler should have run it by {state['expectedRunAt']} "
                    f"({job.schedule}; last scheduled run {state['lastScheduledRunAt']}), "
                    f"late past the grace since {state['overdueAt']}; the missed-run alarm "
                    f"{'fires' if alarm['state'] == 'alarm' else 'fires at ' + str(alarm['at'])}")
    elif state["state"] == "never":
        kind = "never"
        sentence = (f"Its scheduler has never run it ({job.schedule}): no scheduled run is "
                    "recorded, and the missed-run alarm counts no invocation as missed")
    else:
        kind = "scheduled"
        until = _time(state["expectedRunAt"])
        sentence = (f"On schedule ({job.schedule}): last scheduled run "
                    f"{state['lastScheduledRunAt']}, the next expected by "
                    f"{state['expectedRunAt']} (overdue after {state['overdueAt']})")
    return {"job": job.name, "kind": kind, "until": iso_z_or_none(until),
            "sentence": f"{sentence}; {ran}.", "state": state,
            "lease": None if lease is None else {"holder": lease["holder"],
                                                 "expiresAt": iso_z_or_none(expires)},
            "lastRun": None if last is None else {
                "outcome": last["outcome"], "trigger": last["trigger"],
                "startedAt": iso_z_or_none(_time(last["started_at"]))},
            "alarm": alarm}


__all__ = ["KINDS", "job_why"]
