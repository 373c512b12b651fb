"""The erasure admin API over HTTP, on both backends: lifecycle, roles, audit, typed 4xx."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.erasure.purge import count_subject
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from tests.conftest import CRON_SECRET, REDIS_URL, admin_token
from tests.integration.erasure.erasure_data import seed_redis, seed_subject

BASE = "/api/admin/erasure"


def privacy() -> dict[str, str]:
    """The privacy officer's headers, minted per request (tokens live 5 minutes)."""
    return {"authorization": f"Bearer {admin_token(['privacy'], subject='dpo-1')}"}


@pytest.fixture
def svc(db_url: str, redis_prefix: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix,
                         SLUICE_ERASURE_GRACE_DAYS="7")


@pytest.fixture
def client(svc: Services) -> TestClient:
    return TestClient(create_app(svc), raise_server_exceptions=False)


def test_the_lifecycle_over_http(client: TestClient, svc: Services) -> None:
    seed_subject(svc.db, "u1")
    seed_redis(svc, "u1")

    created = client.post(f"{BASE}/requests", json={"subjectUserId": "u1", "tenantId": "t1"},
                          headers=privacy())
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["status"] == "requested" and body["subjectUserId"] == "u1"
    assert body["requestedBy"] == "dpo-1" and body["tenantId"] == "t1"
    assert body["graceUntil"] > body["requestedAt"]  # the default 7 days
    request_id = body["id"]

    again = client.post(f"{BASE}/requests", json={"subjectUserId": "u1", "graceDays": 0},
                        headers=privacy())
    assert again.status_code == 200 and again.json() == body

    assert client.get(f"{BASE}/requests/{request_id}", headers=privacy()).json() == body
    listed = client.get(f"{BASE}/requests", params={"status": "requested"}, headers=privacy())
    assert [r["id"] for r in listed.json()["requests"]] == [request_id]

    # Not due yet: the hourly job leaves it alone.
    cron = client.get(f"{BASE}/purge", headers={"authorization": f"Bearer {CRON_SECRET}"})
    assert cron.status_code == 200 and cron.json()["due"] == 0

    preview = client.post(f"{BASE}/requests/{request_id}/confirm?dryRun=true", headers=privacy())
    assert preview.status_code == 200
    assert preview.json()["wouldPurge"]["ai_usage_ledger"] == 3
    assert preview.json()["status"] == "requested"

    confirmed = client.post(f"{BASE}/requests/{request_id}/confirm", headers=privacy())
    assert confirmed.status_code == 200, confirmed.text
    done = confirmed.json()
    assert done["status"] == "purged" and done["confirmedBy"] == "dpo-1"
    assert done["result"]["tables"]["redis:ai:ledger:retry:dlq"] == 2
    assert done["verifiedAt"] is not None
    assert not any(count_subject(svc, "u1").values())

    summary = client.get(f"{BASE}/summary", headers=privacy()).json()
    assert summary == {"due": 0, "byStatus": {"requested": 0, "cancelled": 0, "purged": 1,
                                              "failed": 0}}
    verify = client.get(f"{BASE}/subjects/u1", headers=privacy())
    assert verify.json()["clean"] is True

    audited = {(a["action"], a["outcome"]) for a in RunStore(svc.db).recent_audit()}
    assert {("erasure:create", "201"), ("erasure:create", "200"),
            ("erasure:confirm", "200")} <= audited


def test_grace_days_zero_is_due_at_once_and_the_job_dry_run_changes_nothing(
        client: TestClient, svc: Services) -> None:
    seed_subject(svc.db, "u2")
    created = client.post(f"{BASE}/requests", json={"subjectUserId": "u2", "graceDays": 0},
                          headers=privacy()).json()
    assert created["graceUntil"] == created["requestedAt"]

    assert client.get(f"{BASE}/summary", headers=privacy()).json()["due"] == 1
    dry = client.post(f"{BASE}/purge?dryRun=true", headers=privacy())
    assert dry.status_code == 200
    assert dry.json()["dryRun"] is True and dry.json()["due"] == 1
    assert dry.json()["results"][0]["tables"]["ai_usage_ledger"] == 3
    assert count_subject(svc, "u2")["ai_usage_ledger"] == 3

    run = client.post(f"{BASE}/purge", headers=privacy()).json()
    assert (run["due"], run["purged"], run["failed"]) == (1, 1, 0)
    assert {"due", "purged", "failed", "results", "processedAt"} <= set(run) and \
        {"due", "purged", "failed", "results", "processedAt"} <= set(dry.json())
    assert client.post(f"{BASE}/purge", headers=privacy()).json()["due"] == 0


@pytest.mark.parametrize("payload,message", [
    ({"subjectUserId": "u1", "graceDays": -1}, "graceDays must be between 0 and 365"),
    ({"subjectUserId": "u1", "graceDays": 366}, "graceDays must be between 0 and 365"),
    ({"subjectUserId": "u1", "graceDays": "7"}, "graceDays must be a whole number"),
    ({"subjectUserId": "u1", "graceDays": 1.5}, "graceDays must be a whole number"),
    ({"subjectUserId": "u1", "graceDays": True}, "graceDays must be a whole number"),
    ({"subjectUserId": ""}, "subjectUserId must be a non-empty string"),
    ({"subjectUserId": "a b"}, "must not contain spaces"),
    ({"subjectUserId": 12}, "subjectUserId must be a non-empty string"),
    ({"graceDays": 1}, "subjectUserId is required"),
    ({"subjectUserId": "u1", "grace": 1}, "unknown field(s): grace"),
])
def test_bad_input_is_a_clear_400(client: TestClient, payload: dict[str, object],
                                  message: str) -> None:
    response = client.post(f"{BASE}/requests", json=payload, headers=privacy())
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "bad_request"
    assert message in response.json()["error"]["message"]


def test_unknown_ids_and_wrong_states_are_typed_4xx(client: TestClient) -> None:
    for method, path in (("get", "/requests/nope"), ("post", "/requests/nope/cancel"),
                         ("post", "/requests/nope/confirm")):
        response = client.request(method, BASE + path, headers=privacy())
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"]["code"] == "not_found"
        assert "no erasure request 'nope'" in response.json()["error"]["message"]

    request_id = client.post(f"{BASE}/requests", json={"subjectUserId": "u3"},
                             headers=privacy()).json()["id"]
    cancelled = client.post(f"{BASE}/requests/{request_id}/cancel", headers=privacy())
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    for action in ("confirm", "cancel"):
        response = client.post(f"{BASE}/requests/{request_id}/{action}", headers=privacy())
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "conflict"
        assert "cancelled" in response.json()["error"]["message"]
    bad_status = client.get(f"{BASE}/requests", params={"status": "done"}, headers=privacy())
    assert bad_status.status_code == 400 and "status must be one of" in bad_status.text


def test_only_privacy_and_super_admin_may_touch_erasure(client: TestClient, svc: Services) -> None:
    ops = {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}
    assert client.post(f"{BASE}/requests", json={"subjectUserId": "u1"}).status_code == 401
    forbidden = client.post(f"{BASE}/requests", json={"subjectUserId": "u1"}, headers=ops)
    assert forbidden.status_code == 403
    assert client.get(f"{BASE}/requests", headers=ops).status_code == 403
    assert client.post(f"{BASE}/purge", headers=ops).status_code == 403
    root = {"authorization": f"Bearer {admin_token(['super_admin'])}"}
    assert client.get(f"{BASE}/registry", headers=root).json()["targets"][0]["how"] == "delete"
    audit = RunStore(svc.db).recent_audit()
    assert ("ops-1", "erasure:create", "403") in {(a["actor"], a["action"], a["outcome"])
                                                  for a in audit}
