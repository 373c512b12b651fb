"""Missed runs (``--limits``): the platform stops invoking ``state-cleanup`` for two days,
and the operator's view must say so, and only so (``missed_run_shown``).

``state-cleanup`` is the job the scheduler fires on every grid point (a daily cron; the
frequent jobs' idle firings are coalesced, ``firing.py``), so its run log is the
platform's record. From ``DAY`` the platform skips its invocations for ``FOR``; every
``EVERY`` from the window's start to a day after its end the job's state as every surface
shows it (``sluice.jobs.overdue.statuses``: ``GET /api/admin/jobs``, ``sluice jobs``, the
console) is judged against the documented rule, computed from the platform's own record
of the runs Sluice began: due one schedule step after the last scheduled run, ``overdue``
once that plus the grace (a tenth of the period, at least 5 minutes) has passed. Moments
within ``EDGE`` of the overdue instant are not judged (a run's own minutes).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from bench.simulate.peers import Window

JOB = "state-cleanup"
DAY = 4.0
FOR = timedelta(days=2)
EVERY = timedelta(minutes=30)
EDGE = timedelta(minutes=2)
MIN_GRACE = timedelta(minutes=5)


def plan(world: Any) -> None:
    start = world.start + timedelta(days=DAY)
    if start + FOR + timedelta(days=1) <= world.end:
        world.missed.append(Window(start, start + FOR, "missed"))
        world.faults["missed_runs"] = 1


class MissedRuns:
    def __init__(self, sim: Any) -> None:
        self.sim = sim

    def schedule(self) -> None:
        for window in self.sim.world.missed:
            at = window.start
            while at < window.end + timedelta(days=1):
                self.sim._schedule(at, "missed-check", None)
                at += EVERY

    def skipped(self, job: str, now: datetime) -> bool:
        """Whether the platform leaves this firing of ``job`` out."""
        return job == JOB and any(w.start <= now < w.end for w in self.sim.world.missed)

    def check(self) -> None:
        from sluice.jobs.overdue import statuses
        from sluice.jobs.registry import get_job
        from sluice.jobs.schedule import parse

        sim, now = self.sim, self.sim.clock.now()
        job = get_job(JOB)
        begun = [at for at in sim.invoked.get(JOB, ()) if at <= now]
        if begun:
            schedule = parse(job.schedule)
            expected = schedule.next_after(max(begun))
            period = schedule.next_after(expected) - expected
            overdue_at = expected + max(MIN_GRACE, period / 10)
            if abs(now - overdue_at) < EDGE:
                return
            wanted = "overdue" if now > overdue_at else "ok"
        else:
            wanted = "never"
        shown = statuses(sim.services.db, now, [job])[JOB]["state"]
        if shown != wanted:
            sim.judge.fail("missed_run_shown", now,
                           f"{JOB} shows {shown!r}; its last run began "
                           f"{max(begun) if begun else 'never'}, so it is {wanted!r} now")
