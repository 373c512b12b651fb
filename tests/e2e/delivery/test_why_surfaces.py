""""Why is this waiting?" on every surface, on both backends: the API, the command line and
the console's entry page (and its JSON twin) give ``sluice.delivery.why``'s one answer for
an entry, behind the delivery routes' roles; ``sluice jobs why`` and its route give
``sluice.jobs.why``'s for a job, judged by the job list's own state."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery.store import DeliveryStore
from sluice.delivery.why import why
from sluice.http.app import create_app
from sluice.jobs.overdue import DisabledMarks, statuses
from sluice.jobs.registry import get_job
from sluice.jobs.runner import run_job
from sluice.jobs.runs import RunStore
from sluice.jobs.why import KINDS
from sluice.ops.destinations import apply, parse_change
from sluice.store.db import utcnow
from tests.conftest import BASE_ENV, ROOT, admin_token, run_cli

WEBHOOK = {"SLUICE_WEBHOOK_SIGNING_SECRET": "webhook-secret-for-tests-0123456789"}
JOB = "delivery-drain"


def _headers(role: str) -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token([role], subject=f'{role}-1')}"}


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, **WEBHOOK)


@pytest.fixture
def env(db_url: str) -> dict[str, str]:
    return {**BASE_ENV, **WEBHOOK, "SLUICE_DATABASE_URL": db_url}


def test_an_entrys_answer_is_the_same_on_every_surface(svc: Services,
                                                        env: dict[str, str]) -> None:
    store = DeliveryStore(svc.db)
    entry, _ = store.enqueue("webhook", "https://hooks.example/a", {"text": "x"})
    until = utcnow() + timedelta(hours=1)
    apply(svc, parse_change("pause", "webhook:hooks.example:443", {"until": iso_z(until)}))
    expected = why(svc, entry.id).to_json()
    assert expected["kind"] == "paused" and expected["key"] == "webhook:hooks.example:443"

    client = TestClient(create_app(svc), raise_server_exceptions=False)
    api = client.get(f"/api/admin/delivery/entries/{entry.id}/why", headers=_headers("ops"))
    assert api.status_code == 200 and api.json() == expected

    cli = run_cli(["delivery", "why", entry.id, "--json"], env)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout) == expected
    plain = run_cli(["delivery", "why", entry.id], env)
    assert plain.stdout.strip() == expected["sentence"]

    client.cookies.set("__session", admin_token(["ops"]))
    page = client.get(f"/admin/deliveries/entries/{entry.id}")
    assert page.status_code == 200
    assert html.escape(expected["sentence"], quote=False) in page.text
    twin = client.get(f"/api/admin/console/deliveries/entries/{entry.id}").json()
    assert twin["why"] == expected and twin["entry"]["id"] == entry.id
    listing = client.get("/admin/deliveries").text
    assert f'href="/admin/deliveries/entries/{entry.id}"' in listing, "linked from the list"


def test_the_entry_routes_keep_the_delivery_roles(svc: Services, env: dict[str, str]) -> None:
    entry, _ = DeliveryStore(svc.db).enqueue("webhook", "https://hooks.example/a", {"text": "x"})
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    path = f"/api/admin/delivery/entries/{entry.id}/why"
    assert client.get(path).status_code == 401
    assert client.get(path, headers=_headers("billing")).status_code == 403
    missing = client.get("/api/admin/delivery/entries/nope/why", headers=_headers("ops"))
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    client.cookies.set("__session", admin_token(["ops"]))
    assert client.get("/api/admin/console/deliveries/entries/nope").status_code == 404
    refused = run_cli(["delivery", "why", "nope"], env)
    assert refused.returncode != 0 and "not_found" in refused.stderr


def test_docs_cli_names_the_job_answers_in_their_order() -> None:
    row = next(line for line in (ROOT / "docs" / "cli.md").read_text().splitlines()
               if line.startswith("| `sluice jobs why JOB"))
    named = re.findall(r"`(\w+)`", row)
    assert [kind for kind in named if kind in KINDS] == list(KINDS)


def _job_why(client: TestClient) -> dict[str, Any]:
    response = client.get(f"/api/admin/jobs/{JOB}/why", headers=_headers("ops"))
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_a_jobs_answer_follows_its_state_lease_and_mark(svc: Services,
                                                        env: dict[str, str]) -> None:
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    runs = RunStore(svc.db)
    seen: list[str] = []

    def judged(kind: str) -> dict[str, Any]:
        body = _job_why(client)
        assert body["kind"] == kind, body
        seen.append(kind)
        assert body["state"] == statuses(svc.db, utcnow(), [get_job(JOB)])[JOB], \
            "the job list's own state"
        return body

    never = judged("never")
    assert never["lastRun"] is None and never["alarm"]["state"] == "alarm"

    assert run_job(get_job(JOB), svc, "schedule").status == 200
    scheduled = judged("scheduled")
    assert scheduled["until"] == scheduled["state"]["expectedRunAt"]
    assert scheduled["alarm"]["state"] == "ok" and scheduled["lastRun"]["trigger"] == "schedule"

    with svc.db.transaction() as tx:  # its last scheduled run was a day ago
        tx.execute("UPDATE job_runs SET started_at = :at WHERE job = :job",
                   {"at": utcnow() - timedelta(days=1), "job": JOB})
    overdue = judged("overdue")
    assert overdue["state"]["state"] == "overdue" and overdue["alarm"]["state"] == "alarm"
    assert overdue["state"]["expectedRunAt"] in overdue["sentence"]

    assert runs.acquire_lease(JOB, "another-run", timedelta(minutes=2))
    running = judged("running")
    assert running["lease"]["holder"] == "another-run" and running["until"] is not None
    assert run_job(get_job(JOB), svc, "schedule").outcome == "skipped", "single-flight"

    with svc.db.transaction() as tx:
        tx.execute("UPDATE job_leases SET expires_at = :at WHERE job = :job",
                   {"at": utcnow() - timedelta(seconds=1), "job": JOB})
    judged("lease_lapsed")

    DisabledMarks(svc.db).mark_disabled(JOB, reason="moved to the new account", actor="op",
                                        now=utcnow())
    disabled = judged("disabled")
    assert "moved to the new account" in disabled["sentence"]
    assert sorted(seen) == sorted(KINDS), "every answer is walked"

    cli = run_cli(["jobs", "why", JOB, "--json"], env)
    assert cli.returncode == 0, cli.stderr
    assert json.loads(cli.stdout)["kind"] == "disabled"
    assert run_cli(["jobs", "why", JOB], env).stdout.strip() == disabled["sentence"]
    assert client.get("/api/admin/jobs/nope/why", headers=_headers("ops")).status_code == 404
    assert client.get(f"/api/admin/jobs/{JOB}/why",
                      headers=_headers("billing")).status_code == 403
