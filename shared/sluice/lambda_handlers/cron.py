"""Job functions: EventBridge invokes a job's Lambda directly (IAM guards that path); on the
function's own URL, where the job's whole timeout applies (``sluice.jobs.cron_url``), an
external scheduler calls the cron ``GET`` and an admin the ``POST``; the console's "run
now" invokes the function with that same ``POST`` (``sluice.jobs.handoff``).

One handler serves every job; each function names its job in ``SLUICE_JOB``. A run
that errored is recorded and reported first, then fails the invocation
(``JobErrored``), so Lambda's ``Errors`` metric counts it.
"""

from __future__ import annotations

import os
from typing import Any

from sluice.lambda_handlers import cold_start

with cold_start():
    from sluice.core.errors import ConfigurationError, SluiceError
    from sluice.core.events import kind_of
    from sluice.core.observe import logger
    from sluice.core.services import Services
    from sluice.jobs.cron_url import serve
    from sluice.jobs.registry import get_job
    from sluice.jobs.runner import run_job

    if not os.environ.get("SLUICE_JOB"):
        raise ConfigurationError("SLUICE_JOB must name the job this function runs")
    JOB = get_job(os.environ["SLUICE_JOB"])
    JOB.resolve()  # import the drain during init, not on the first tick
    SERVICES = Services.from_env()


class JobErrored(SluiceError):
    """The job's run errored (recorded in job_runs and reported)."""

    code = "job_error"


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    kind = kind_of(event)
    if kind == "http":  # the function URL (or a hand-off): cron GET or admin POST, checked
        return serve(JOB, SERVICES, event, context)
    if kind != "schedule":
        raise ConfigurationError(f"{JOB.name}: not a scheduled event; refusing to run")
    outcome = run_job(JOB, SERVICES, "schedule", request_id=context.aws_request_id,
                      lambda_remaining_ms=context.get_remaining_time_in_millis)
    if outcome.outcome == "error":
        raise JobErrored(f"{JOB.name}: the run errored", body=outcome.body)
    return {"statusCode": outcome.status, "outcome": outcome.outcome, "body": outcome.body}
