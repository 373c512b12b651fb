"""A job's cron ``GET`` on its own Lambda Function URL, where the job's whole time fits.

API Gateway's HTTP API cuts a request at 30 s, so an external scheduler calling a cron
route through it gets about 25 s of a job whose budget is minutes (rss-refresh: 290 s).
Each job function therefore also has a Function URL (``url: true``, generated from
``JOBS``) on the function whose timeout is the job's. It answers exactly the cron
contract of the HTTP route: ``GET <url><job route>`` with ``Authorization: Bearer
$CRON_SECRET`` and the job's cron parameters; anything else is refused. The admin
``POST`` stays on the HTTP API, where admin identities are checked.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from sluice.core.auth import is_authorized_cron
from sluice.core.errors import RequestError
from sluice.core.query import QueryParam, check_query
from sluice.core.times import json_default
from sluice.jobs.registry import Job
from sluice.jobs.runner import run_job

if TYPE_CHECKING:
    from sluice.core.services import Services


def _answer(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"statusCode": status, "headers": {"content-type": "application/json"},
            "body": json.dumps(body, default=json_default)}


def _refused(status: int, code: str, message: str, request_id: str) -> dict[str, Any]:
    return _answer(status, {"error": {"code": code, "message": message,
                                      "requestId": request_id}})


def cron_params(job: Job, raw_query: str) -> dict[str, str]:
    """The query string against the job's cron parameters: an unknown, repeated or
    malformed one is a ``RequestError``, as on the HTTP route (the same check)."""
    items = parse_qsl(raw_query, keep_blank_values=True)
    check_query(items, {p.name: QueryParam(p.name, p.kind, p.minimum, p.maximum)
                        for p in job.params if p.cron})
    return dict(items)


def serve(job: Job, services: Services, event: dict[str, Any], context: Any) -> dict[str, Any]:
    """One Function URL request (payload format 2.0) for ``job``."""
    request_id = str(getattr(context, "aws_request_id", "") or "")
    http = (event.get("requestContext") or {}).get("http") or {}
    if event.get("rawPath") != job.route:
        return _refused(404, "not_found", f"this URL serves only GET {job.route}", request_id)
    if http.get("method") != "GET":
        return _refused(405, "method_not_allowed", f"{job.route} takes GET here (the cron "
                        "call); the admin POST is on the HTTP API", request_id)
    headers = {str(k).lower(): v for k, v in (event.get("headers") or {}).items()}
    if not is_authorized_cron(headers.get("authorization"), services.settings.cron_secret):
        return _refused(401, "unauthorized", "cron bearer missing or wrong", request_id)
    try:
        params = cron_params(job, str(event.get("rawQueryString") or ""))
    except RequestError as exc:
        body = exc.to_body()
        body["error"]["requestId"] = request_id
        return _answer(exc.status, body)
    outcome = run_job(job, services, "cron_http", request_id=request_id or None,
                      lambda_remaining_ms=getattr(context, "get_remaining_time_in_millis", None),
                      params=params)
    return _answer(outcome.status, outcome.body)
