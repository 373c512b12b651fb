"""The console's "run now" hands the run to the job's own function: on AWS an asynchronous
Lambda Invoke (against moto in server mode) carrying the admin POST of the job's Function
URL, which the real job handler then serves in-process; the run is found again by its id."""

from __future__ import annotations

import io
import json
import urllib.request
import uuid
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.core.errors import RequestError, UpstreamUnavailable
from sluice.core.services import Services
from sluice.jobs.handoff import function_name, hand_off
from sluice.jobs.registry import JOBS
from sluice.jobs.runs import RunStore
from sluice.ops.console import job_run
from tests.conftest import BASE_ENV, admin_token
from tests.e2e.jobs.test_lambda import fresh_import
from tests.lambda_context import LambdaContext

pytestmark = pytest.mark.aws


def _moto_config(endpoint: str, use_docker: bool) -> None:
    request = urllib.request.Request(f"{endpoint}/moto-api/config", method="POST",
                                     data=json.dumps({"lambda": {"use_docker": use_docker}})
                                     .encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.status in (200, 201)


@pytest.fixture
def prefix(aws_env: dict[str, str], moto_endpoint: str) -> Iterator[str]:
    """moto's Lambda without Docker (it queues an Event invoke and answers 202, running
    nothing: the test runs the handler itself), with a state-cleanup job function of this
    test's own (the server is shared by the session): its name less the job's key."""
    import boto3

    prefix = f"sluice-t{uuid.uuid4().hex[:8]}-"
    _moto_config(moto_endpoint, use_docker=False)
    try:
        iam = boto3.client("iam")
        role = iam.create_role(RoleName=f"{prefix}job", AssumeRolePolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": "sts:AssumeRole"}]}))["Role"]["Arn"]
        code = io.BytesIO()
        with zipfile.ZipFile(code, "w") as archive:
            archive.writestr("functions/cron.py", "def handler(event, context): pass\n")
        client = boto3.client("lambda")
        client.create_function(FunctionName=function_name(JOBS["state-cleanup"], prefix),
                               Runtime="python3.12", Role=role, Handler="functions/cron.handler",
                               Code={"ZipFile": code.getvalue()}, Timeout=60)
        yield prefix
    finally:
        _moto_config(moto_endpoint, use_docker=True)


def test_run_now_invokes_the_job_function_which_runs_it(
        prefix: str, db_url: str, make_services: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    services: Services = make_services(db_url, SLUICE_JOB_FUNCTION_PREFIX=prefix)
    sent: list[dict[str, Any]] = []
    services.lambda_client.meta.events.register(
        "before-send.lambda.Invoke", lambda request, **kw: sent.append(
            {"url": request.url, "headers": dict(request.headers), "body": request.body}))

    handed = hand_off(JOBS["state-cleanup"], services, token=admin_token(["ops"], subject="fay"),
                      source_ip="203.0.113.9")

    assert (handed.via, handed.function) == ("lambda", f"{prefix}stateCleanup")
    [invoke] = sent
    assert invoke["url"].endswith(f"/functions/{prefix}stateCleanup/invocations")
    assert invoke["headers"]["X-Amz-Invocation-Type"] == b"Event"
    event = json.loads(invoke["body"])
    assert job_run(services, "state-cleanup", handed.run_id)["state"] == "waiting"

    # What Lambda then does with the queued event: the job function's real handler.
    cron = fresh_import("functions.cron", monkeypatch, {
        **BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_JOB": "state-cleanup"})
    answer = cron.handler(event, LambdaContext(timeout_ms=60_000))
    assert answer["statusCode"] == 200, answer
    cron.SERVICES.close()

    shown = job_run(services, "state-cleanup", handed.run_id)
    assert shown["state"] == "ended" and shown["run"]["trigger"] == "admin"
    assert "deleted" in shown["run"]["result"]
    audit = RunStore(services.db).recent_audit()[0]
    assert (audit["actor"], audit["action"], audit["outcome"], audit["ip"]) == \
        ("fay", "state-cleanup:admin", "200", "203.0.113.9"), "the operator's address"


def test_lambda_unreachable_is_a_typed_outage_and_nothing_runs(
        aws_env: dict[str, str], db_url: str, make_services: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_LAMBDA", "http://127.0.0.1:9")  # nothing listens
    services: Services = make_services(db_url, SLUICE_JOB_FUNCTION_PREFIX="sluice-x-")
    with pytest.raises(UpstreamUnavailable, match="sluice-x-stateCleanup"):
        hand_off(JOBS["state-cleanup"], services, token=admin_token(["ops"]))
    with pytest.raises(RequestError):
        hand_off(JOBS["state-cleanup"], services, token=None)
    assert RunStore(services.db).recent("state-cleanup") == []


def test_the_apis_admin_post_hands_off_when_the_http_function_has_less_time(
        prefix: str, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """On AWS the HTTP function has 30 s and state-cleanup's own function 60 s: the API's
    admin POST answers 202 with the run's id and where to follow it, the job's function
    runs it (audited there as the run; here as the hand-off), and the run is found by
    that id. Given the job's whole time, the same POST runs the job in the request."""
    from tests.conftest import load_event

    http = fresh_import("functions.http", monkeypatch, {
        **BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_JOB_FUNCTION_PREFIX": prefix})
    services = http.app.state.services
    sent: list[bytes] = []
    services.lambda_client.meta.events.register(
        "before-send.lambda.Invoke", lambda request, **kw: sent.append(request.body))
    post = load_event("http_post_admin")
    post["headers"]["authorization"] = f"Bearer {admin_token(['ops'], subject='gus')}"

    answer = http.handler(post, LambdaContext(timeout_ms=30_000))

    assert answer["statusCode"] == 202, answer
    body = json.loads(answer["body"])
    run_id = body["runId"]
    assert body["function"] == f"{prefix}stateCleanup"
    assert answer["headers"]["location"] == body["status"] == \
        f"/api/admin/console/jobs/state-cleanup/runs/{run_id}"
    assert RunStore(services.db).recent("state-cleanup") == []  # nothing ran in the request
    [event] = [json.loads(raw) for raw in sent]
    assert event["headers"]["x-request-id"] == run_id
    cron = fresh_import("functions.cron", monkeypatch, {
        **BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_JOB": "state-cleanup"})
    assert cron.handler(event, LambdaContext(timeout_ms=60_000))["statusCode"] == 200
    cron.SERVICES.close()
    shown = job_run(services, "state-cleanup", run_id)
    assert shown["state"] == "ended" and "deleted" in shown["run"]["result"]
    actions = [(a["actor"], a["action"], a["outcome"])
               for a in RunStore(services.db).recent_audit()]
    assert ("gus", "state-cleanup:handoff", "202") in actions
    assert ("gus", "state-cleanup:admin", "200") in actions

    whole = http.handler(post, LambdaContext(timeout_ms=90_000))  # the job's time is here
    assert whole["statusCode"] == 200 and "deleted" in json.loads(whole["body"])
    assert len(sent) == 1
    services.close()
