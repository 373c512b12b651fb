"""The audit trail holds actions, not previews, and reads back through the API, the
console page and ``sluice audit`` with the same filters."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from sluice.erasure.requests import ErasureStore
from sluice.jobs.runs import RunStore
from sluice.queues.deadletters import LocalDeadLetters
from sluice.store.db import utcnow
from tests.conftest import BASE_ENV, run_cli
from tests.e2e.console.test_console_pages import SIGNING, _client, _csrf, _dead


def _actions(services: Any) -> list[tuple[str, str]]:
    return sorted((a["action"], a["outcome"]) for a in RunStore(services.db).recent_audit(500))


def test_previews_write_nothing_and_actions_are_recorded(db_url: str,
                                                         make_services: Any) -> None:
    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SIGNING)
    first, second = _dead(services, 2)
    request, _ = ErasureStore(services.db).create("user-7", requested_by="op", grace_days=7)
    client = _client(services, ["super_admin"])
    csrf = _csrf(client.get("/admin/dlq/rss.ingest").text)
    before = _actions(services)

    for path, data in (("/admin/dlq/rss.ingest/redrive", {"scope": "selected", "ids": [first]}),
                       ("/admin/dlq/rss.ingest/purge", {"scope": "all"}),
                       ("/admin/jobs/state-cleanup/run", {}),
                       (f"/admin/erasure/{request.id}/cancel", {}),
                       (f"/admin/erasure/{request.id}/confirm", {}),
                       ("/admin/deliveries/purge", {})):
        assert client.post(path, data={"csrf": csrf, **data}).status_code == 200, path
    api = client.post("/api/admin/dlq/rss.ingest/redrive", json={"dryRun": True},
                      headers={"authorization": f"Bearer {client.cookies['__session']}"})
    assert api.status_code == 200 and api.json()["dryRun"] is True
    dry = client.post(f"/api/admin/erasure/requests/{request.id}/confirm?dryRun=true",
                      headers={"authorization": f"Bearer {client.cookies['__session']}"})
    assert dry.status_code == 200, dry.text
    assert _actions(services) == before, "a confirmation page or a dry run is not an action"

    client.post("/admin/dlq/rss.ingest/purge",
                data={"csrf": csrf, "scope": "selected", "ids": [second], "confirm": "1"})
    assert ("dlq:purge", "200") in _actions(services)
    assert LocalDeadLetters(services.db).count("rss.ingest") == 1


def test_the_trail_is_readable_with_filters(db_url: str, make_services: Any) -> None:
    services = make_services(db_url)
    runs = RunStore(services.db)
    runs.audit(actor="alice", action="dlq:purge", target="/admin/dlq/rss.ingest/purge",
               outcome="200", ip=None)
    runs.audit(actor="bob", action="erasure:cancel", target="/api/admin/erasure/requests/e1",
               outcome="200", ip=None)
    client = _client(services, ["ops"])
    everything = client.get("/api/admin/audit").json()
    assert [e["actor"] for e in everything["entries"]][:2] == ["bob", "alice"]
    by_actor = client.get("/api/admin/audit?actor=alice").json()["entries"]
    assert [(e["actor"], e["action"]) for e in by_actor] == [("alice", "dlq:purge")]
    by_target = client.get("/api/admin/audit", params={"target": "/api/admin/erasure"}).json()
    assert [e["action"] for e in by_target["entries"]] == ["erasure:cancel"]
    by_action = client.get("/api/admin/audit?action=erasure:cancel&limit=1").json()
    assert by_action["count"] == 1
    future = (utcnow() + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert client.get(f"/api/admin/audit?since={future}").json()["entries"] == []
    assert len(client.get(f"/api/admin/audit?until={future}").json()["entries"]) >= 2
    assert client.get("/api/admin/audit?since=yesterday").status_code == 400
    assert client.get("/api/admin/audit?who=alice").status_code == 400
    assert _client(services, ["billing"]).get("/api/admin/audit").status_code == 403

    page = client.get("/admin/audit?actor=bob")
    assert page.status_code == 200 and "erasure:cancel" in page.text
    assert "dlq:purge" not in page.text.split("<tbody>")[1]

    listed = run_cli(["audit", "--actor", "alice", "--json"],
                     {**BASE_ENV, "SLUICE_DATABASE_URL": db_url})
    assert listed.returncode == 0, listed.stderr
    assert [e["action"] for e in json.loads(listed.stdout)["entries"]] == ["dlq:purge"]
    bad = run_cli(["audit", "--since", "soon"], {**BASE_ENV, "SLUICE_DATABASE_URL": db_url})
    assert bad.returncode == 64 and "since" in bad.stderr


def test_a_console_post_refuses_a_query_string(db_url: str, make_services: Any) -> None:
    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SIGNING)
    ids = _dead(services, 1)
    client = _client(services, ["ops"])
    csrf = _csrf(client.get("/admin/dlq/rss.ingest").text)
    refused = client.post("/admin/dlq/rss.ingest/purge?dryRun=true",
                          data={"csrf": csrf, "scope": "selected", "ids": ids, "confirm": "1"})
    assert refused.status_code == 400 and "dryRun" in refused.text
    assert LocalDeadLetters(services.db).count("rss.ingest") == 1, "nothing was purged"


def test_the_purge_every_confirmation_counts_what_it_will_change(
        sqlite_url: str, make_services: Any) -> None:
    from sluice.delivery.store import DeliveryStore

    services = make_services(sqlite_url)
    store = DeliveryStore(services.db)
    for i in range(501):
        store.enqueue("webhook", "https://hooks.example/a", {"text": f"x{i}"})
    with services.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET status = 'failed'")
    client = _client(services, ["ops"])
    csrf = _csrf(client.get("/admin/deliveries").text)
    ask = client.post("/admin/deliveries/purge", data={"csrf": csrf})
    assert "(501 now)" in ask.text
