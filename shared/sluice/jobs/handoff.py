"""Hand an admin run to the job's own function, so it gets the job's whole time.

The console and the HTTP API run behind API Gateway, which cuts a request at 30 s; a job's
budget is minutes. So "run now", and the API's admin ``POST`` of a job whenever the HTTP
function has less time left than the job's own timeout (``hands_off``), do not run the
job in the request: they hand the run to the job's function, as the admin ``POST`` on the job's Function URL (``sluice.jobs.cron_url``), with
the admin's own token (the job function checks identity and roles and audits the run, as
for any caller of that URL) and an ``X-Request-Id`` that names the run. The console then
shows the run by that id (``job_runs.request_id``) until it ends.

* ``SLUICE_JOB_FUNCTION_PREFIX`` set (on AWS): an asynchronous Lambda Invoke of
  ``<prefix><function key>`` (``sluice-prod-rssRefresh``) carrying the Function URL event;
  Lambda answers 202 once it has queued it.
* unset (``sluice dev``, tests): the same event served by the same code on a background
  thread of this process, with the job's budget as its only limit.
"""

from __future__ import annotations

import json
import threading
import uuid
from typing import TYPE_CHECKING, Any, Literal, NamedTuple
from urllib.parse import urlencode

from sluice.core.errors import RequestError, UpstreamUnavailable
from sluice.core.observe import logger
from sluice.jobs.cron_url import serve
from sluice.jobs.registry import Job

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from sluice.core.services import Services

HANDOFF_HOST = "handoff.sluice.internal"


class Handoff(NamedTuple):
    run_id: str  # the run's request id in job_runs
    via: Literal["lambda", "local"]
    function: str | None  # the invoked function's name (lambda)


def function_name(job: Job, prefix: str) -> str:
    return prefix + job.function_key


def hands_off(job: Job, services: Services, remaining_ms: Callable[[], int] | None) -> bool:
    """Whether an admin run asked of a function with ``remaining_ms`` left goes to the
    job's own function: when its job functions are deployed (``SLUICE_JOB_FUNCTION_PREFIX``)
    and a Lambda context says less is left here than the job's timeout (the HTTP function:
    30 s). Without a context (``sluice dev``, a test) the job has its whole budget where it
    is, and without job functions there is nowhere else for it to go."""
    return (bool(services.settings.job_function_prefix) and remaining_ms is not None
            and remaining_ms() < job.timeout_s * 1000)


def admin_event(job: Job, token: str, run_id: str,
                params: Mapping[str, str] | None = None, *,
                source_ip: str | None = None) -> dict[str, Any]:
    """The admin ``POST`` of ``job`` as a Function URL request (payload format 2.0).

    ``source_ip`` is the operator's address as the console saw it: the job function audits
    the run under it. It is trusted as a URL request's is (Lambda sets that one): the event
    reaches the function only through an Invoke that IAM allowed."""
    query = urlencode(sorted((params or {}).items()))
    return {
        "version": "2.0", "routeKey": "$default", "rawPath": job.route, "rawQueryString": query,
        "headers": {"host": HANDOFF_HOST, "authorization": f"Bearer {token}",
                    "x-request-id": run_id, "content-length": "0"},
        "isBase64Encoded": False,
        "requestContext": {"http": {"method": "POST", "path": job.route,
                                    "protocol": "HTTP/1.1",
                                    "sourceIp": source_ip or "",
                                    "userAgent": "sluice-handoff"},
                           "requestId": run_id, "domainName": HANDOFF_HOST},
    }


class _LocalContext:
    """A context without Lambda's remaining time: the job's budget is the only limit."""

    def __init__(self, request_id: str) -> None:
        self.aws_request_id = request_id


def hand_off(job: Job, services: Services, *, token: str | None,
             params: Mapping[str, str] | None = None, source_ip: str | None = None,
             ) -> Handoff:
    """Start ``job``'s admin run in its own function; returns at once with the run's id."""
    if not token:
        raise RequestError("a hand-off carries the admin's token; none was given")
    run_id = str(uuid.uuid4())
    event = admin_event(job, token, run_id, params, source_ip=source_ip)
    prefix = services.settings.job_function_prefix
    if prefix:
        from botocore.exceptions import BotoCoreError, ClientError  # type: ignore[import-untyped]

        name = function_name(job, prefix)
        try:
            answer = services.lambda_client.invoke(
                FunctionName=name, InvocationType="Event", Payload=json.dumps(event).encode())
        except (BotoCoreError, ClientError) as exc:  # the run never started
            raise UpstreamUnavailable(f"could not hand {job.name} to {name}: {exc}",
                                      job=job.name, function=name) from exc
        if answer.get("StatusCode") != 202:
            raise UpstreamUnavailable(f"Lambda did not queue {job.name}'s run "
                                      f"(status {answer.get('StatusCode')})", function=name)
        return Handoff(run_id, "lambda", name)

    def run() -> None:
        try:
            answer = serve(job, services, event, _LocalContext(run_id))
        except Exception as exc:  # noqa: BLE001 - a thread's error reaches the sink, not stderr
            services.reporter.error(f"{job.name}.handoff", exc, runId=run_id)
            return
        logger.info(f"[{job.name}] handed-off run {run_id} answered {answer['statusCode']}")

    threading.Thread(target=run, name=f"sluice-run-{job.name}", daemon=True).start()
    return Handoff(run_id, "local", None)
