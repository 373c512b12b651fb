"""A job's routes on its own Lambda Function URL, where the job's whole time fits.

API Gateway's HTTP API cuts a request at 30 s, so a call through it gets about 25 s of a
job whose budget is minutes (rss-refresh: 290 s). Each job function therefore also has a
Function URL (``url: true``, generated from ``JOBS``) on the function whose timeout is the
job's. It answers the job's two routes exactly as the HTTP API does:

* ``GET <url><job route>`` with ``Authorization: Bearer $CRON_SECRET`` and the job's cron
  parameters: the cron call of an external scheduler;
* ``POST <url><job route>`` with ``Authorization: Bearer <admin token>`` whose roles grant
  the job's surface, and any of the job's parameters: the admin run, audited like every
  admin action (a dry run is a preview and leaves no row). The token is taken from the
  header only, never from a cookie, so no other site can make a browser post here. The
  console hands its "run now" to this same path (``sluice.jobs.handoff``).

Anything else is refused with a typed error.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from sluice.core.auth import Identity, bearer_token, is_authorized_cron
from sluice.core.errors import RequestError, SluiceError
from sluice.core.query import QueryParam, check_query
from sluice.core.times import json_default
from sluice.jobs.registry import Job
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore

if TYPE_CHECKING:
    from sluice.core.services import Services

# A caller's X-Request-Id names the run when it looks like one (the console's hand-off
# sets it, to find the run again); otherwise the invocation's own id.
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _answer(status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {"statusCode": status, "headers": {"content-type": "application/json"},
            "body": json.dumps(body, default=json_default)}


def _refused(status: int, code: str, message: str, request_id: str) -> dict[str, Any]:
    return _answer(status, {"error": {"code": code, "message": message,
                                      "requestId": request_id}})


def _error(exc: SluiceError, request_id: str) -> dict[str, Any]:
    body = exc.to_body()
    body["error"]["requestId"] = request_id
    return _answer(exc.status, body)


def url_params(job: Job, raw_query: str, *, cron: bool) -> dict[str, str]:
    """The query string against the job's parameters (the cron ones only on ``GET``): an
    unknown, repeated or malformed one is a ``RequestError``, as on the HTTP route."""
    items = parse_qsl(raw_query, keep_blank_values=True)
    check_query(items, {p.name: QueryParam(p.name, p.kind, p.minimum, p.maximum)
                        for p in job.params if p.cron or not cron})
    return dict(items)


def serve(job: Job, services: Services, event: dict[str, Any], context: Any) -> dict[str, Any]:
    """One Function URL request (payload format 2.0) for ``job``."""
    headers = {str(k).lower(): v for k, v in (event.get("headers") or {}).items()}
    given = headers.get("x-request-id")
    request_id = given if isinstance(given, str) and _REQUEST_ID.match(given) else \
        str(getattr(context, "aws_request_id", "") or "")
    http = (event.get("requestContext") or {}).get("http") or {}
    if event.get("rawPath") != job.route:
        return _refused(404, "not_found", f"this URL serves only {job.route}", request_id)
    method = http.get("method")
    if method not in ("GET", "POST"):
        return _refused(405, "method_not_allowed", f"{job.route} takes GET (the cron call, "
                        "with the cron bearer) or POST (an admin run, with an admin token)",
                        request_id)
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    raw_query = str(event.get("rawQueryString") or "")
    if method == "GET":
        if not is_authorized_cron(headers.get("authorization"), services.settings.cron_secret):
            return _refused(401, "unauthorized", "cron bearer missing or wrong", request_id)
        try:
            params = url_params(job, raw_query, cron=True)
        except RequestError as exc:
            return _error(exc, request_id)
        outcome = run_job(job, services, "cron_http", request_id=request_id or None,
                          lambda_remaining_ms=remaining, params=params)
        return _answer(outcome.status, outcome.body)
    return _admin(job, services, headers, raw_query, request_id, str(http.get("sourceIp") or ""),
                  remaining)


def _admin(job: Job, services: Services, headers: dict[str, Any], raw_query: str,
           request_id: str, ip: str, remaining: Any) -> dict[str, Any]:
    """The admin ``POST``: identity and role, then the run, audited before and after."""
    runs = RunStore(services.db)
    detail: dict[str, Any] = {"requestId": request_id, "query": dict(parse_qsl(raw_query)),
                              "via": "function-url"}
    action = f"{job.name}:admin"
    identity: Identity | None = None
    try:
        identity = services.admin.verify(bearer_token(headers.get("authorization")))
        services.admin.authorize_identity(identity, job.surface)
        params = url_params(job, raw_query, cron=False)
    except RequestError as exc:  # refused: audited too, as the HTTP API audits refusals
        try:
            runs.audit(actor=identity.subject if identity else "anonymous", action=action,
                       target=job.route, outcome=str(exc.status), ip=ip or None, detail=detail)
        except SluiceError as audit_exc:  # the refusal stands either way
            services.reporter.error("cron_url.audit", audit_exc)
        return _error(exc, request_id)
    preview = params.get("dryRun") == "true"
    # The row is written before the run: an action whose row cannot be written does not run.
    audit_id = None if preview else runs.audit(actor=identity.subject, action=action,
                                               target=job.route, outcome="started",
                                               ip=ip or None, detail=detail)
    outcome = run_job(job, services, "admin", request_id=request_id or None,
                      lambda_remaining_ms=remaining, params=params)
    if audit_id is not None:
        try:
            runs.complete_audit(audit_id, str(outcome.status), detail)
        except SluiceError as exc:  # the run happened and is recorded; the answer stands
            services.reporter.error("cron_url.audit", exc, auditId=audit_id)
    return _answer(outcome.status, outcome.body)
