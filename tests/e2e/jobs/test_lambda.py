"""Lambda handlers called in-process with real event JSON from tests/events/."""

from __future__ import annotations

import base64
import importlib
import json
import sys
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest

from sluice.jobs.runs import RunStore
from sluice.store.db import open_database, utcnow
from sluice.store.state import StateStore
from tests.conftest import BASE_ENV, admin_token, load_event
from tests.lambda_context import LambdaContext


def fresh_import(name: str, monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> ModuleType:
    """Import a function module the way a cold start does: environment first, then module scope."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # functions.X re-exports the packaged sluice.lambda_handlers.X: a cold start runs both
    sys.modules.pop(name, None)
    sys.modules.pop(name.replace("functions.", "sluice.lambda_handlers.", 1), None)
    return importlib.import_module(name)


@pytest.fixture
def lambda_env(db_url: str) -> dict[str, str]:
    return {**BASE_ENV, "SLUICE_DATABASE_URL": db_url, "SLUICE_JOB": "state-cleanup"}


@pytest.mark.parametrize("event_name", ["scheduled_event", "scheduler_event"])
def test_a_scheduled_event_runs_the_job(event_name: str, lambda_env: dict[str, str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    db = open_database(lambda_env["SLUICE_DATABASE_URL"])
    StateStore(db).put("gone", 1, expires_at=utcnow() - timedelta(seconds=5))
    cron = fresh_import("functions.cron", monkeypatch, lambda_env)
    context = LambdaContext()
    answer = cron.handler(load_event(event_name), context)
    assert answer["statusCode"] == 200 and answer["outcome"] == "ok"
    assert answer["body"]["deleted"] == 1
    [run] = RunStore(db).recent("state-cleanup")
    assert run["trigger"] == "schedule" and run["request_id"] == context.aws_request_id
    cron.SERVICES.close()
    db.close()


def test_a_job_that_errored_fails_the_invocation_after_recording_it(
        lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.jobs.registry import JOBS, Job

    monkeypatch.setitem(JOBS, "state-cleanup", Job(
        name="state-cleanup", route="/api/admin/state/cleanup", schedule="rate(1 day)",
        surface="state", target="tests.integration.jobs.test_cron_contract:boom"))
    cron = fresh_import("functions.cron", monkeypatch, lambda_env)
    context = LambdaContext()
    with pytest.raises(cron.JobErrored) as raised:
        cron.handler(load_event("scheduled_event"), context)
    assert raised.value.context["body"]["error"]["code"] == "internal_error"
    [run] = RunStore(cron.SERVICES.db).recent("state-cleanup")
    assert run["outcome"] == "error" and run["request_id"] == context.aws_request_id
    cron.SERVICES.close()


@pytest.mark.parametrize("event", [
    {"source": "aws.events"},  # a body that merely claims to be scheduled
    {"detail-type": "Scheduled Event", "source": "my.app"},
])
def test_anything_else_is_refused_by_the_scheduled_function(
        event: Any, lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    cron = fresh_import("functions.cron", monkeypatch, lambda_env)
    payload = load_event(event) if isinstance(event, str) else event
    with pytest.raises(Exception, match="not a scheduled event"):
        cron.handler(payload, LambdaContext())
    assert RunStore(cron.SERVICES.db).recent("state-cleanup") == []
    cron.SERVICES.close()


def test_the_scheduled_function_serves_its_cron_get_on_its_url(
        lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    cron = fresh_import("functions.cron", monkeypatch, lambda_env)
    answer = cron.handler(load_event("http_get_cron"), LambdaContext())
    assert answer["statusCode"] == 200 and "deleted" in json.loads(answer["body"])
    [run] = RunStore(cron.SERVICES.db).recent("state-cleanup")
    assert run["trigger"] == "cron_http"
    cron.SERVICES.close()


def test_a_cron_function_without_its_job_fails_at_cold_start(
        lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(Exception, match="SLUICE_JOB"):
        fresh_import("functions.cron", monkeypatch, {**lambda_env, "SLUICE_JOB": ""})
    with pytest.raises(Exception, match="no job named"):
        fresh_import("functions.cron", monkeypatch, {**lambda_env, "SLUICE_JOB": "nope"})


def _body(answer: dict[str, Any]) -> Any:
    raw = answer["body"]
    if answer.get("isBase64Encoded"):
        raw = base64.b64decode(raw).decode()
    return json.loads(raw)


def test_the_http_function_serves_cron_and_admin_events(
        lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    http = fresh_import("functions.http", monkeypatch, lambda_env)
    ok = http.handler(load_event("http_get_cron"), LambdaContext())
    assert ok["statusCode"] == 200 and {"deleted", "deletedHashRecords",
                                        "processedAt"} <= set(_body(ok))

    forged = load_event("http_get_cron")
    forged["headers"]["authorization"] = "Bearer not-the-secret-not-the-sec"
    assert http.handler(forged, LambdaContext())["statusCode"] == 401

    post = load_event("http_post_admin")
    post["headers"]["origin"] = f"https://{post['headers']['host']}"
    post["cookies"] = [f"__session={admin_token(['ops'], subject='bob')}"]
    context = LambdaContext()
    answer = http.handler(post, context)
    assert answer["statusCode"] == 200, answer
    assert answer["headers"]["x-request-id"] == context.aws_request_id
    audit = RunStore(http.app.state.services.db).recent_audit()[0]
    assert (audit["actor"], audit["ip"], audit["outcome"]) == ("bob", "198.51.100.23", "200")

    post["cookies"] = [f"__session={admin_token(['billing'])}"]
    assert http.handler(post, LambdaContext())["statusCode"] == 403
    http.app.state.services.close()


def test_the_job_function_serves_the_admin_post_on_its_url(
        lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    cron = fresh_import("functions.cron", monkeypatch, lambda_env)
    post = load_event("url_post_admin")
    post["headers"]["authorization"] = f"Bearer {admin_token(['ops'], subject='erin')}"
    context = LambdaContext(timeout_ms=60_000)
    answer = cron.handler(post, context)
    assert answer["statusCode"] == 200 and "deleted" in json.loads(answer["body"])
    [run] = RunStore(cron.SERVICES.db).recent("state-cleanup")
    assert (run["trigger"], run["request_id"]) == ("admin", context.aws_request_id)
    [audit] = RunStore(cron.SERVICES.db).recent_audit()
    assert (audit["actor"], audit["action"], audit["ip"]) == \
        ("erin", "state-cleanup:admin", "198.51.100.23")
    post["headers"]["authorization"] = f"Bearer {admin_token(['billing'])}"
    assert cron.handler(post, LambdaContext())["statusCode"] == 403
    cron.SERVICES.close()


def test_the_job_function_runs_a_console_hand_off(
        lambda_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.jobs.handoff import admin_event
    from sluice.jobs.registry import JOBS

    cron = fresh_import("functions.cron", monkeypatch, lambda_env)
    event = admin_event(JOBS["state-cleanup"], admin_token(["ops"]), "run-42")
    answer = cron.handler(json.loads(json.dumps(event)), LambdaContext())
    assert answer["statusCode"] == 200
    run = RunStore(cron.SERVICES.db).by_request("state-cleanup", "run-42")
    assert run is not None and (run["trigger"], run["outcome"]) == ("admin", "ok")
    cron.SERVICES.close()
