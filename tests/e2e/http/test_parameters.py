"""Query parameters, strictly: a route honours what it declares and refuses anything else."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.erasure.purge import count_subject
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from tests.conftest import CRON_SECRET, admin_token
from tests.integration.erasure.erasure_data import seed_subject

PURGE = "/api/admin/erasure/purge"


def cron() -> dict[str, str]:
    return {"authorization": f"Bearer {CRON_SECRET}"}


def privacy() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['privacy'], subject='dpo-1')}"}


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, SLUICE_ERASURE_GRACE_DAYS="0")


@pytest.fixture
def client(svc: Services) -> TestClient:
    return TestClient(create_app(svc), raise_server_exceptions=False)


def _due_request(client: TestClient, svc: Services, subject: str = "u1") -> str:
    seed_subject(svc.db, subject)
    created = client.post("/api/admin/erasure/requests", json={"subjectUserId": subject},
                          headers=privacy())
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def test_the_cron_get_honours_dry_run_and_purges_nothing(client: TestClient,
                                                         svc: Services) -> None:
    _due_request(client, svc)
    dry = client.get(f"{PURGE}?dryRun=true", headers=cron())
    assert dry.status_code == 200, dry.text
    assert dry.json()["dryRun"] is True and dry.json()["due"] == 1 and dry.json()["purged"] == 0
    assert count_subject(svc, "u1")["ai_usage_ledger"] == 3
    real = client.get(f"{PURGE}?dryRun=false", headers=cron())
    assert real.json()["purged"] == 1
    assert count_subject(svc, "u1")["ai_usage_ledger"] == 0


@pytest.mark.parametrize(("query", "named"), [
    ("dryrun=true", "dryrun"),
    ("dry_run=true", "dry_run"),
    ("dryRun=on", "dryRun"),
    ("dryRun=1", "dryRun"),
    ("dryRun=TRUE", "dryRun"),
    ("dryRun=", "dryRun"),
    ("dryRun=true&dryRun=false", "dryRun"),
    ("dryRun=true&limit=5", "limit"),
])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_loose_or_unknown_parameters_are_a_400_naming_them_and_nothing_runs(
        client: TestClient, svc: Services, query: str, named: str, method: str) -> None:
    _due_request(client, svc)
    response = client.request(method, f"{PURGE}?{query}",
                              headers=cron() if method == "GET" else privacy())
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "bad_request" and error["parameter"] == named
    assert named in error["message"]
    assert count_subject(svc, "u1")["ai_usage_ledger"] == 3, "nothing was purged"
    assert RunStore(svc.db).recent("erasure-purge") == []
    if method == "POST":
        refused = RunStore(svc.db).recent_audit()[0]
        assert (refused["actor"], refused["action"], refused["outcome"]) == (
            "dpo-1", "erasure-purge:admin", "400")


def test_an_admin_only_parameter_is_refused_on_the_cron_get(client: TestClient) -> None:
    answer = client.get("/api/admin/ai/ledger/retry/flush?batches=2", headers=cron())
    assert answer.status_code == 400
    assert answer.json()["error"]["parameter"] == "batches"
    assert "accepts: none" in answer.json()["error"]["message"]
    out_of_range = client.post("/api/admin/ai/ledger/retry/flush?batches=0",
                               headers={"authorization":
                                        f"Bearer {admin_token(['billing'])}"})
    assert out_of_range.status_code == 400 and "batches" in out_of_range.text


@pytest.mark.parametrize("query", ["dryRun=yes", "dryrun=true", "dryRun=true&dryRun=true"])
def test_the_confirm_route_is_as_strict(client: TestClient, svc: Services, query: str) -> None:
    request_id = _due_request(client, svc)
    answer = client.post(f"/api/admin/erasure/requests/{request_id}/confirm?{query}",
                         headers=privacy())
    assert answer.status_code == 400, answer.text
    assert count_subject(svc, "u1")["ai_usage_ledger"] == 3
    preview = client.post(f"/api/admin/erasure/requests/{request_id}/confirm?dryRun=true",
                          headers=privacy())
    assert preview.status_code == 200 and preview.json()["dryRun"] is True


def test_other_routes_refuse_parameters_they_do_not_declare(client: TestClient) -> None:
    listed = client.get("/api/admin/erasure/requests?status=requested&limit=5&stauts=x",
                        headers=privacy())
    assert listed.status_code == 400 and listed.json()["error"]["parameter"] == "stauts"
    assert client.get("/api/health?verbose=true").status_code == 400
    assert client.get("/api/admin/erasure/requests?limit=5", headers=privacy()).status_code == 200


def test_the_openapi_document_declares_each_job_routes_parameters(client: TestClient) -> None:
    paths = client.get("/api/openapi.json").json()["paths"]
    get_params = [p["name"] for p in paths[PURGE]["get"].get("parameters", [])]
    post_params = [p["name"] for p in paths["/api/admin/ai/ledger/retry/flush"]["post"]
                   .get("parameters", [])]
    assert get_params == ["dryRun"] and post_params == ["batches"]


def test_console_routes_check_their_own_parameters_as_strictly(client: TestClient) -> None:
    ops = {"authorization": f"Bearer {admin_token(['ops'])}"}
    ok = client.get("/api/admin/console/dlq/rss.ingest?page=1&size=10", headers=ops)
    assert ok.status_code == 200, ok.text
    twice = client.get("/api/admin/console/dlq/rss.ingest?page=1&page=2", headers=ops)
    assert twice.status_code == 400 and twice.json()["error"]["parameter"] == "page"
    unknown = client.get("/api/admin/console/dlq/rss.ingest?pgae=1", headers=ops)
    assert unknown.status_code == 400 and unknown.json()["error"]["parameter"] == "pgae"
