"""The HTTP surface on both backends: cron GET, admin POST, audit, typed errors."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.jobs.registry import JOBS, Job
from sluice.jobs.runs import RunStore
from sluice.store.db import utcnow
from tests.conftest import CRON_SECRET, admin_token

ROUTE = "/api/admin/state/cleanup"
CLEANUP_KEYS = {"deleted", "deletedHashRecords", "deletedSamples", "deletedFeedCaches",
                "deletedBuildLocks", "deletedJobRuns",
                "deletedAuditRecords", "deletedDestinations", "deletedRateLimits", "failed",
                "errors", "processedAt"}


@pytest.fixture
def client(services: Services) -> TestClient:
    return TestClient(create_app(services), raise_server_exceptions=False)


def _expired_row(services: Services) -> None:
    services.state.put("gone", {"x": 1}, expires_at=utcnow() - timedelta(minutes=1))


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ([], 401),
        ([(b"authorization", b"Bearer wrong-secret-wrong-secret-00")], 401),
        ([(b"authorization", b"Bearer " + CRON_SECRET[:-1].encode())], 401),
        ([(b"authorization", CRON_SECRET.encode())], 401),
        ([(b"authorization", b"Basic " + CRON_SECRET.encode())], 401),
        ([(b"authorization", b"Bearer  " + CRON_SECRET.encode())], 401),
        ([(b"authorization", b"Bearer " + "é".encode("latin-1") * 32)], 401),
        ([(b"authorization", b"Bearer " + CRON_SECRET.encode() + b"\x00")], 400),
    ],
)
def test_cron_get_refuses_anything_but_the_bearer(client: TestClient, services: Services,
                                                  headers: list[tuple[bytes, bytes]],
                                                  status: int) -> None:
    _expired_row(services)
    response = client.get(ROUTE, headers=headers)
    assert response.status_code == status
    assert response.json()["error"]["code"] == ("unauthorized" if status == 401 else "bad_request")
    assert services.state.keys_with_prefix("") == [] and _count(services) == 1, "nothing ran"


def test_every_jobs_routes_check_the_bearer_and_the_surface(client: TestClient,
                                                             services: Services) -> None:
    """Each job's GET takes only the cron bearer and its POST only an admin with its surface:
    the checks come with the routes, so no job has a route without them."""
    from sluice.core.surfaces import SURFACE_ROLES

    assert len(JOBS) > 1
    for name in JOBS:
        job = JOBS[name]
        wrong = next(role for role in ("privacy", "billing", "ops")
                     if role not in SURFACE_ROLES[job.surface])
        refused = [
            client.get(job.route).status_code,
            client.get(job.route, headers={"authorization": "Bearer wrong"}).status_code,
            client.post(job.route).status_code,
            client.post(job.route, headers={
                "authorization": f"Bearer {CRON_SECRET}"}).status_code,  # no admin token
            client.post(job.route, headers={
                "authorization": f"Bearer {admin_token([wrong])}"}).status_code,
        ]
        assert refused == [401, 401, 401, 401, 403], name
        assert RunStore(services.db).recent(name) == [], f"{name} ran"


def _count(services: Services) -> int:
    with services.db.transaction() as tx:
        row = tx.fetchone("SELECT count(*) AS n FROM platform_state")
    return int(row["n"]) if row else -1


def test_cron_get_with_the_bearer_runs_the_job(client: TestClient, services: Services) -> None:
    _expired_row(services)
    response = client.get(ROUTE, headers={"authorization": f"Bearer {CRON_SECRET}"})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == CLEANUP_KEYS
    assert body["deleted"] == 1
    assert RunStore(services.db).recent("state-cleanup")[0]["trigger"] == "cron_http"


def test_no_cron_secret_authorises_nothing(db_url: str, make_services: Any) -> None:
    services = make_services(db_url, CRON_SECRET="")
    client = TestClient(create_app(services))
    response = client.get(ROUTE, headers={"authorization": "Bearer "})
    assert response.status_code == 401


@pytest.mark.parametrize(
    ("how", "roles", "status"),
    [
        ("none", [], 401),
        ("header", ["billing"], 403),
        ("header", ["privacy"], 403),
        ("header", ["ops"], 200),
        ("cookie", ["super_admin"], 200),
        ("garbage", [], 401),
    ],
)
def test_admin_post(client: TestClient, services: Services, how: str, roles: list[str],
                    status: int) -> None:
    headers = {}
    if how == "header":
        headers["authorization"] = f"Bearer {admin_token(roles, subject='alice')}"
    elif how == "cookie":
        headers["cookie"] = f"__session={admin_token(roles, subject='alice')}"
        headers["origin"] = "http://testserver"
    elif how == "garbage":
        headers["authorization"] = "Bearer not.a.jwt"
    response = client.post(ROUTE, headers=headers)
    assert response.status_code == status, response.text
    [audit] = RunStore(services.db).recent_audit()
    assert audit["outcome"] == str(status)
    assert audit["target"] == ROUTE
    assert audit["action"] == "state-cleanup:admin"
    assert audit["actor"] == ("alice" if how in ("header", "cookie") else "anonymous")
    if status == 200:
        assert set(response.json()) == CLEANUP_KEYS
    else:
        assert response.json()["error"]["code"] in ("unauthorized", "forbidden")


def test_a_crashing_job_answers_a_typed_500(services: Services, monkeypatch: Any) -> None:
    monkeypatch.setitem(JOBS, "state-cleanup", Job(
        name="state-cleanup", route=ROUTE, schedule="rate(1 day)", surface="state",
        target="tests.integration.jobs.test_cron_contract:boom"))
    client = TestClient(create_app(services), raise_server_exceptions=False)
    response = client.get(ROUTE, headers={"authorization": f"Bearer {CRON_SECRET}"})
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "internal_error" and error["job"] == "state-cleanup"
    assert error["requestId"] == response.headers["x-request-id"]


def test_unknown_routes_and_health(client: TestClient) -> None:
    assert client.get("/api/health").json()["ok"] is True
    assert client.get("/api/admin/nope").status_code == 404


def test_jobs_listing_shows_last_runs(client: TestClient) -> None:
    client.get(ROUTE, headers={"authorization": f"Bearer {CRON_SECRET}"})
    listing = client.get("/api/admin/jobs",
                         headers={"authorization": f"Bearer {admin_token(['ops'])}"}).json()
    [cleanup] = [j for j in listing["jobs"] if j["name"] == "state-cleanup"]
    assert cleanup["lastRun"]["outcome"] == "ok" and cleanup["lastRun"]["trigger"] == "cron_http"
