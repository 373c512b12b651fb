"""A job's cron GET on its own function URL: the same contract as the HTTP route (bearer,
the job's cron parameters, nothing else), run with the job's whole remaining time."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sluice.core.services import Services
from sluice.jobs.cron_url import serve
from sluice.jobs.registry import JOBS
from sluice.jobs.runs import RunStore
from tests.conftest import CRON_SECRET


class Context:
    aws_request_id = "req-url-1"

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


def url_event(path: str, *, method: str = "GET", query: str = "",
              bearer: str | None = CRON_SECRET) -> dict[str, Any]:
    """A Lambda function URL request, payload format 2.0."""
    headers = {"host": "abc123.lambda-url.eu-north-1.on.aws"}
    if bearer is not None:
        headers["authorization"] = f"Bearer {bearer}"
    return {"version": "2.0", "routeKey": "$default", "rawPath": path, "rawQueryString": query,
            "headers": headers, "isBase64Encoded": False,
            "requestContext": {"http": {"method": method, "path": path,
                                        "sourceIp": "127.0.0.1"}}}


def test_the_cron_get_runs_the_job_with_its_whole_time(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    job = JOBS["erasure-purge"]
    answer = serve(job, services, url_event(job.route, query="dryRun=true"),
                   Context(remaining_ms=280_000))
    assert answer["statusCode"] == 200, answer["body"]
    body = json.loads(answer["body"])
    assert {"due", "purged", "failed"} <= set(body)
    [run] = RunStore(services.db).recent("erasure-purge")
    assert (run["trigger"], run["request_id"]) == ("cron_http", "req-url-1")


def test_everything_but_the_cron_contract_is_refused(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    job = JOBS["rss-refresh"]
    cases = [(url_event(job.route, bearer=None), 401),
             (url_event(job.route, bearer="wrong-secret-0123456789abc"), 401),
             (url_event(job.route, method="POST"), 405),
             (url_event("/api/admin/state/cleanup"), 404),
             (url_event(job.route, query="dryRun=true"), 400),
             (url_event(JOBS["erasure-purge"].route, query="dryRun=maybe"), 400)]
    for event, status in cases:
        target = JOBS["erasure-purge"] if event["rawPath"] == JOBS["erasure-purge"].route \
            else job
        answer = serve(target, services, event, Context(remaining_ms=280_000))
        assert answer["statusCode"] == status, (event["rawPath"], answer)
        assert json.loads(answer["body"])["error"]["requestId"] == "req-url-1"
    assert RunStore(services.db).recent("rss-refresh") == [], "nothing ran"
