"""A job's routes on its own function URL: the cron GET (bearer, the job's cron parameters)
and the admin POST (an admin token whose roles grant the job's surface, any of the job's
parameters, audited), each run with the job's whole remaining time; nothing else."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sluice.core.services import Services
from sluice.jobs.cron_url import serve
from sluice.jobs.registry import JOBS
from sluice.jobs.runs import RunStore
from tests.conftest import CRON_SECRET, admin_token


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
             (url_event(job.route, method="PUT"), 405),
             (url_event(job.route, method="POST"), 401),  # the cron bearer is no admin token
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


def test_the_admin_post_runs_with_the_admins_roles_and_is_audited(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    job = JOBS["ledger-redrive"]  # `batches` is an admin parameter, not a cron one
    event = url_event(job.route, method="POST", query="batches=2",
                      bearer=admin_token(["billing"], subject="carol"))
    answer = serve(job, services, event, Context(remaining_ms=55_000))
    assert answer["statusCode"] == 200, answer["body"]
    [run] = RunStore(services.db).recent("ledger-redrive")
    assert (run["trigger"], run["request_id"], run["outcome"]) == ("admin", "req-url-1", "ok")
    [audit] = RunStore(services.db).recent_audit()
    assert (audit["actor"], audit["action"], audit["outcome"], audit["ip"]) == \
        ("carol", "ledger-redrive:admin", "200", "127.0.0.1")
    assert audit["detail"]["via"] == "function-url"
    refused = serve(job, services, url_event(job.route, query="batches=2"),
                    Context(remaining_ms=55_000))
    assert refused["statusCode"] == 400, "an admin parameter is not a cron one"


def test_the_admin_post_refuses_missing_tokens_and_roles_and_audits_them(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    job = JOBS["metering-flush"]
    cases = [(None, 401, "anonymous"), ("not-a-jwt", 401, "anonymous"),
             (admin_token(["ops"], expires_in=-60), 401, "anonymous"),
             (admin_token(["privacy"], subject="dan"), 403, "dan")]
    for bearer, status, actor in cases:
        answer = serve(job, services, url_event(job.route, method="POST", bearer=bearer),
                       Context(remaining_ms=55_000))
        assert answer["statusCode"] == status, answer
        audit = RunStore(services.db).recent_audit()[0]
        assert (audit["actor"], audit["outcome"]) == (actor, str(status))
    assert RunStore(services.db).recent("metering-flush") == [], "nothing ran"


def test_an_admin_dry_run_on_the_url_is_a_preview(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    job = JOBS["erasure-purge"]
    event = url_event(job.route, method="POST", query="dryRun=true",
                      bearer=admin_token(["privacy"]))
    answer = serve(job, services, event, Context(remaining_ms=280_000))
    assert answer["statusCode"] == 200 and json.loads(answer["body"])["dryRun"] is True
    assert RunStore(services.db).recent_audit() == [], "a dry run changes nothing: no row"
