"""The audit trail cannot be escaped, and no input turns a refusal into a 5xx (both backends)."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.conftest import CRON_SECRET, admin_token, load_event
from tests.e2e.jobs.test_lambda import fresh_import
from tests.lambda_context import LambdaContext

ROUTE = "/api/admin/state/cleanup"


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


def root() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['super_admin'], subject='root-1')}"}


@pytest.fixture
def client(services: Services) -> TestClient:
    return TestClient(create_app(services), raise_server_exceptions=False)


def _expired_row(services: Services) -> None:
    services.state.put("gone", {"x": 1}, expires_at=utcnow() - timedelta(minutes=1))


def _state_rows(services: Services) -> int:
    with services.db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM platform_state")
    return int(row["n"]) if row else -1


def test_an_admin_write_is_audited_before_it_runs_and_settled_after(
        client: TestClient, services: Services) -> None:
    _expired_row(services)
    assert client.post(ROUTE, headers=ops()).status_code == 200
    [row] = RunStore(services.db).recent_audit()
    assert (row["actor"], row["action"], row["outcome"]) == ("ops-1", "state-cleanup:admin", "200")


def test_an_action_whose_audit_row_cannot_be_written_does_not_run(
        client: TestClient, services: Services) -> None:
    _expired_row(services)
    with services.db.transaction() as tx:
        tx.execute("DROP TABLE admin_audit")
    answer = client.post(ROUTE, headers=ops())
    assert answer.status_code == 500
    assert _state_rows(services) == 1, "the cleanup did not run unaudited"
    assert RunStore(services.db).recent("state-cleanup") == []


@pytest.mark.parametrize(("method", "path", "kwargs"), [
    ("POST", ROUTE + "%00", {}),
    ("POST", ROUTE + "?x=%00", {}),
    ("POST", ROUTE + "?dryRun=%ff", {}),
    ("POST", ROUTE + "?%00=1", {}),
    ("GET", ROUTE + "?x=%00", {}),
    ("POST", ROUTE, {"headers": {"x-note": "a\x00b"}}),
    ("PUT", "/api/admin/flags", {"content": b'{"key": "rssQueuePipeline\\u0000", "enabled": true}'}),
    ("PUT", "/api/admin/flags", {"content": b'{"key": "\\ud800", "enabled": true}'}),
    ("PUT", "/api/admin/flags", {"content": b'{"key": "\xff\xfe", "enabled": true}'}),
    ("PUT", "/api/admin/flags", {"content": b'{"key": "a\x00", "enabled": true}'}),
    ("POST", "/api/admin/erasure/requests", {"content": b'{"subjectUserId": "u\\u0000"}'}),
])
def test_undecodable_input_anywhere_is_a_400_and_still_audited(
        client: TestClient, services: Services, method: str, path: str,
        kwargs: dict[str, Any]) -> None:
    _expired_row(services)
    kwargs = dict(kwargs)
    headers = {**root(), "content-type": "application/json", **kwargs.pop("headers", {})}
    if "x-note" in headers:
        raw = [(k.encode(), v.encode("latin-1")) for k, v in headers.items()]
        answer = client.request(method, path, headers=raw, **kwargs)  # type: ignore[arg-type]
    else:
        answer = client.request(method, path, headers=headers, **kwargs)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["code"] == "bad_request"
    assert _state_rows(services) == 1, "nothing ran"
    if method != "GET":
        [row] = RunStore(services.db).recent_audit()
        assert row["outcome"] == "400"


def test_a_cookie_write_needs_this_sites_origin(client: TestClient, services: Services) -> None:
    _expired_row(services)
    cookie = {"cookie": f"__session={admin_token(['ops'], subject='ops-1')}"}
    for extra in ({}, {"origin": "https://evil.example"}, {"origin": "null"},
                  {"referer": "https://evil.example/page"}):
        answer = client.post(ROUTE, headers={**cookie, **extra})
        assert answer.status_code == 403, (extra, answer.text)
        assert answer.json()["error"]["code"] == "cross_site_request"
        assert _state_rows(services) == 1
    assert client.post(ROUTE, headers={**cookie, "referer": "http://testserver/admin/queues"}
                       ).status_code == 200
    assert RunStore(services.db).recent_audit()[-1]["outcome"] == "403"
    # A bearer token is never sent by a browser on its own: no origin needed.
    assert client.post(ROUTE, headers=ops()).status_code == 200


@pytest.mark.parametrize("subject", ["", "   "])
def test_a_token_with_an_empty_subject_is_refused(client: TestClient, services: Services,
                                                  subject: str) -> None:
    _expired_row(services)
    answer = client.post(ROUTE, headers={
        "authorization": f"Bearer {admin_token(['super_admin'], subject=subject)}"})
    assert answer.status_code == 401 and "sub" in answer.json()["error"]["message"]
    assert _state_rows(services) == 1


def test_the_bearer_scheme_is_case_insensitive_on_the_cron_route(
        client: TestClient, services: Services) -> None:
    _expired_row(services)
    assert client.get(ROUTE, headers={"authorization": f"bearer {CRON_SECRET}"}).status_code == 200
    assert _state_rows(services) == 0


def test_the_audit_takes_the_address_from_the_request_context_not_x_forwarded_for(
        db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import BASE_ENV

    http = fresh_import("functions.http", monkeypatch, {**BASE_ENV, "SLUICE_DATABASE_URL": db_url})
    event = load_event("http_post_admin")
    event.pop("cookies")
    event["headers"]["authorization"] = f"Bearer {admin_token(['ops'], subject='bob')}"
    event["headers"]["x-forwarded-for"] = "127.0.0.66, 127.0.0.67"
    event["requestContext"]["http"]["sourceIp"] = "127.0.0.7"
    answer = http.handler(event, LambdaContext())
    assert answer["statusCode"] == 200, answer
    body = answer["body"]
    if answer.get("isBase64Encoded"):
        body = base64.b64decode(body).decode()
    assert "deleted" in json.loads(body)
    [row] = RunStore(http.app.state.services.db).recent_audit()
    assert row["ip"] == "127.0.0.7"
    assert row["detail"]["forwardedFor"] == "127.0.0.66, 127.0.0.67"
    http.app.state.services.close()


def test_a_form_field_with_a_nul_is_refused_before_the_console_sees_it(
        client: TestClient, services: Services) -> None:
    answer = client.post("/admin/flags", content=b"key=rssQueuePipeline%00&enabled=on",
                         headers={"content-type": "application/x-www-form-urlencoded",
                                  **root()})
    assert answer.status_code == 400 and "form" in answer.json()["error"]["message"]
    [row] = RunStore(services.db).recent_audit()
    assert row["outcome"] == "400"
