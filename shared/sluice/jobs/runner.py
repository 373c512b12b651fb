"""The cron contract: run one job guarded, budgeted, single-flight, recorded and reported.

Every path (EventBridge, ``GET`` with the cron bearer, admin ``POST``, the
command line, ``sluice dev``'s scheduler) ends in ``run_job``.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sluice.core import trace
from sluice.core.errors import SluiceError
from sluice.core.observe import logger
from sluice.core.services import Services
from sluice.jobs.registry import Deadline, Job, JobContext, Trigger
from sluice.jobs.runs import (
    ALREADY_RUNNING,
    Fence,
    RunStore,
    ended_without_release,
    lease_holder_id,
)
from sluice.jobs.schedule import sentry_monitor_config
from sluice.store.db import utcnow
from sluice.store.deadline import bounded_by
from sluice.store.history import Sample

# A crashed run's lease lapses this long after the job's own timeout.
LEASE_GRACE = timedelta(seconds=10)


class RunOutcome(NamedTuple):
    status: int
    body: dict[str, Any]
    outcome: str  # ok | failures | error | skipped


def internal_error(job: str, request_id: str, exc: BaseException) -> dict[str, Any]:
    body: dict[str, Any] = {"code": "internal_error", "job": job, "requestId": request_id}
    if isinstance(exc, SluiceError):
        body["message"] = exc.message
        body["cause"] = exc.code
    return {"error": body}


def _end(services: Services, runs: RunStore, run_id: str, outcome: str, result: dict[str, Any],
         started: datetime, job: str, holder: str, duration_s: float) -> None:
    """Record the run's end, release its lease and add its history sample, in one transaction.

    A sample that cannot be written never fails the run: should the transaction fail, the
    end is recorded again without it (and the sample's failure reported if that worked).
    """
    sample = Sample("job", job, utcnow(), round(duration_s * 1000, 1), outcome)
    try:
        runs.end(run_id, outcome, result, started, job, holder, samples=[sample])
    except SluiceError as exc:
        runs.end(run_id, outcome, result, started, job, holder)
        services.reporter.error(f"{job}.history_sample", exc)


def run_job(
    job: Job,
    services: Services,
    trigger: Trigger,
    *,
    request_id: str | None = None,
    lambda_remaining_ms: Callable[[], int] | None = None,
    params: Mapping[str, str] | None = None,
    progress: Callable[[str], None] | None = None,
    deadline_clock: Callable[[], float] = time.monotonic,
) -> RunOutcome:
    """Run ``job`` once (see the module), as the span ``job <name>``; what the span
    buffered is exported before the answer (a Lambda may be frozen right after it)."""
    request_id = request_id or str(uuid.uuid4())
    try:
        with trace.span(f"job {job.name}", attributes={
                "sluice.job": job.name, "sluice.trigger": trigger,
                "faas.invocation_id": request_id}) as span:
            outcome = _run(job, services, trigger, request_id, lambda_remaining_ms, params,
                           progress, deadline_clock)
            span.set("sluice.outcome", outcome.outcome)
            return outcome
    finally:
        trace.flush()


def _run(job: Job, services: Services, trigger: Trigger, request_id: str,
         lambda_remaining_ms: Callable[[], int] | None, params: Mapping[str, str] | None,
         progress: Callable[[str], None] | None, deadline_clock: Callable[[], float],
         ) -> RunOutcome:
    reporter = services.reporter
    runs = RunStore(services.db)
    holder = lease_holder_id()
    started = utcnow()
    clock = time.monotonic()
    deadline = Deadline.for_run(
        job.budget_s,
        lambda_remaining_ms() if lambda_remaining_ms else None,
        services.settings.deadline_margin_s,
        deadline_clock,
    )
    # Statements may run into the margin the deadline keeps before Lambda's end, never past.
    margin = services.settings.deadline_margin_s

    def time_left() -> float:  # not floored at 0: past the margin it goes negative
        return deadline.at + margin - deadline_clock()

    def drain_time_left() -> float:  # half the margin stays for the run's own record
        return time_left() - margin / 2

    leased = False  # True while this run holds the lease and has not released it
    check_in = None
    monitor = functools.partial(sentry_monitor_config, job.schedule, job.timeout_s)
    # The run's own bookkeeping (lease, run record) is bounded by the same time as the
    # drain: a store that hangs or is gone answers a typed error before Lambda's end.
    with bounded_by(time_left):
        try:
            began = runs.begin(job.name, holder,
                               timedelta(seconds=job.timeout_s) + LEASE_GRACE,
                               trigger, request_id, started)
            if began is None:
                logger.info(f"[{job.name}] skipped: already running", extra={"trigger": trigger})
                return RunOutcome(200, dict(ALREADY_RUNNING), "skipped")
            run_id, leased = began, True
            check_in = reporter.checkin(job.name, "in_progress", monitor_config=monitor)
            ctx = JobContext(services=services, deadline=deadline, trigger=trigger,
                             request_id=request_id, started_at=started, params=params or {},
                             progress=progress or (lambda message: None),
                             fence=Fence(job.name, holder))
            try:
                with bounded_by(drain_time_left):
                    result = job.resolve()(ctx)
            except Exception as exc:  # noqa: BLE001 - the guard: any drain crash becomes a typed 500
                reporter.error(job.name, exc, requestId=request_id, trigger=trigger)
                body = internal_error(job.name, request_id, exc)
                _end(services, runs, run_id, "error", body, started, job.name, holder,
                     time.monotonic() - clock)
                leased = False
                reporter.checkin(job.name, "error", check_in_id=check_in,
                                 duration_s=time.monotonic() - clock, monitor_config=monitor)
                return RunOutcome(500, body, "error")
            failed = job.failures(result)
            outcome = "failures" if failed else "ok"
            if failed:
                reporter.drain_failures(job.name, failed, result)
            duration = time.monotonic() - clock
            _end(services, runs, run_id, outcome, result, started, job.name, holder, duration)
            leased = False
            reporter.checkin(job.name, "ok", check_in_id=check_in, duration_s=duration,
                             monitor_config=monitor)
            reporter.metric("JobDurationMs", duration * 1000, "Milliseconds", job=job.name)
            logger.info(f"[{job.name}] {outcome} in {duration * 1000:.0f} ms",
                        extra={"trigger": trigger, "result": result, "requestId": request_id})
            return RunOutcome(200, result, outcome)
        except Exception as exc:  # noqa: BLE001 - the store itself failed (lease, record): still typed
            reporter.error(job.name, exc, requestId=request_id, trigger=trigger)
            if check_in:
                reporter.checkin(job.name, "error", check_in_id=check_in, monitor_config=monitor)
            return RunOutcome(500, internal_error(job.name, request_id, exc), "error")
        finally:
            if leased:  # the run's end was not recorded: release the lease on its own
                try:
                    runs.release_lease(job.name, holder)
                except SluiceError as exc:  # the lease lapses by itself; say so and move on
                    ended_without_release(holder)
                    reporter.error(f"{job.name}.release_lease", exc)
