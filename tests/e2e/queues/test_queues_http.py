"""Flags and DLQ admin routes over HTTP: roles, audit, per-tenant overrides, redrive."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.queues.consumer import Consumer, InboundMessage
from sluice.queues.publish import REGISTRY
from sluice.queues.runtime import publisher_of
from sluice.rss.store import RssStore
from sluice.store.flags import FlagStore
from sluice.store.redis_clients import LEDGER_RETRY_DLQ, LEDGER_RETRY_QUEUE
from tests.conftest import REDIS_URL, admin_token

SECRET = "queue-secret-for-tests-0123456789"


def auth(*roles: str, subject: str = "admin-1") -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(list(roles), subject=subject)}"}


@pytest.fixture
def client(services: Services) -> TestClient:
    return TestClient(create_app(services), raise_server_exceptions=False)


def test_flags_are_super_admin_only_and_audited(client: TestClient, services: Services) -> None:
    assert client.get("/api/admin/flags").status_code == 401
    assert client.get("/api/admin/flags", headers=auth("ops")).status_code == 403
    put = client.put("/api/admin/flags", headers=auth("ops", subject="ops-1"),
                     json={"key": "rssQueuePipeline", "enabled": True})
    assert put.status_code == 403
    [flag] = client.get("/api/admin/flags", headers=auth("super_admin")).json()["flags"]
    assert flag["key"] == "rssQueuePipeline" and flag["enabled"] is False
    assert flag["label"] == "RSS queue pipeline" and flag["overrides"] == {}

    assert flag["overridesTakeEffect"] is False and "a new override is refused" in flag["overrideNote"]
    unknown = client.put("/api/admin/flags", headers=auth("super_admin"),
                         json={"key": "rssQueuePipeline", "enabled": False,
                               "tenantScopeId": "tenant-a"})
    assert unknown.status_code == 400 and unknown.json()["error"]["field"] == "tenantScopeId"
    RssStore(services.db).put_scope("tenant-a", "a", (), "en", True)
    on = client.put("/api/admin/flags", headers=auth("super_admin"),
                    json={"key": "rssQueuePipeline", "enabled": True})
    assert on.status_code == 200 and on.json()["flag"]["enabled"] is True
    # The flag is read globally, so an override would change nothing: refused, typed.
    off_for = client.put("/api/admin/flags", headers=auth("super_admin"),
                         json={"key": "rssQueuePipeline", "enabled": False,
                               "tenantScopeId": "tenant-a"})
    assert off_for.status_code == 400, off_for.text
    error = off_for.json()["error"]
    assert (error["code"], error["field"]) == ("override_not_honoured", "tenantScopeId")
    assert "would change nothing" in error["message"]
    store = FlagStore(services.state)
    assert store.overrides("rssQueuePipeline") == {}
    # One stored before overrides were refused can still be cleared.
    store.set("rssQueuePipeline", False, "tenant-a")
    assert store.enabled("rssQueuePipeline") is True
    cleared = client.put("/api/admin/flags", headers=auth("super_admin"),
                         json={"key": "rssQueuePipeline", "clearOverride": True,
                               "tenantScopeId": "tenant-a"})
    assert cleared.json()["flag"]["overrides"] == {}
    assert store.enabled("rssQueuePipeline", "tenant-a") is True

    for body, status in (({"key": "nope", "enabled": True}, 404),
                         ({"key": "rssQueuePipeline", "enabled": "yes"}, 400),
                         ({"key": "rssQueuePipeline", "clearOverride": True}, 400)):
        assert client.put("/api/admin/flags", headers=auth("super_admin"),
                          json=body).status_code == status

    audit = [(r["actor"], r["action"], r["outcome"]) for r in RunStore(services.db).recent_audit()]
    assert ("ops-1", "flags:set", "403") in audit and ("admin-1", "flags:set", "400") in audit
    assert audit.count(("admin-1", "flags:set", "200")) == 2, "on, and the clear"


@pytest.fixture
def registry() -> Any:
    yield REGISTRY
    REGISTRY.clear()  # the in-process registry is per process; leave it empty for others


def test_dlq_routes_list_show_redrive_and_purge(
        db_url: str, redis_prefix: str, make_services: Callable[..., Services],
        registry: Any) -> None:
    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET,
                             SLUICE_REDIS_URL=REDIS_URL, SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    client = TestClient(create_app(services), raise_server_exceptions=False)
    runs: list[str] = []
    healthy: list[bool] = []

    def handler(message: dict[str, Any], inbound: InboundMessage) -> None:
        runs.append(message["batchId"])
        if not healthy:
            raise RuntimeError("not yet")

    publisher = publisher_of(services)  # registers this services' consumers in process
    Consumer("rss.ingest", handler, services, registry=registry)  # and this one over its own
    publisher.publish("rss.ingest", {"batchId": "b-http"})
    services.redis.lpush(LEDGER_RETRY_DLQ, json.dumps({
        "id": "led-1", "attempts": 10, "enqueuedAt": "2026-11-29T00:00:00Z", "lastError": "x",
        "entry": {"id": "led-1"}, "reason": "max attempts", "deadLetteredAt": "2026-11-29T00:01:00Z"}))

    assert client.get("/api/admin/dlq", headers=auth("billing")).status_code == 403
    overview = client.get("/api/admin/dlq", headers=auth("ops")).json()["queues"]
    assert {"queue": "rss.ingest", "depth": 1} in overview
    assert {"queue": "ledger", "depth": 1} in overview
    assert client.get("/api/admin/dlq/nope", headers=auth("ops")).status_code == 404

    [item] = client.get("/api/admin/dlq/rss.ingest", headers=auth("ops")).json()["items"]
    shown = client.get(f"/api/admin/dlq/rss.ingest/{item['id']}", headers=auth("ops")).json()
    assert shown["body"]["originalMessage"]["batchId"] == "b-http"
    assert shown["body"]["deliveryCount"] == 5

    healthy.append(True)
    redriven = client.post("/api/admin/dlq/rss.ingest/redrive", headers=auth("ops"),
                           json={"ids": [item["id"]]})
    assert redriven.status_code == 200 and redriven.json()["count"] == 1
    assert runs == ["b-http"] * 6
    assert client.post("/api/admin/dlq/ledger/redrive", headers=auth("ops"),
                       json={"dryRun": True}).json()["count"] == 1
    assert services.redis.llen(LEDGER_RETRY_QUEUE) == 0
    assert client.post("/api/admin/dlq/ledger/redrive", headers=auth("ops"),
                       json={"limit": "ten"}).status_code == 400
    assert client.post("/api/admin/dlq/ledger/purge", headers=auth("ops"),
                       json={}).status_code == 400
    assert client.post("/api/admin/dlq/ledger/purge", headers=auth("ops"),
                       json={"all": True}).json() == {"queue": "ledger", "purged": 1}

    actions = [(r["action"], r["target"]) for r in RunStore(services.db).recent_audit()]
    assert ("dlq:redrive", "dlq:rss.ingest") in actions
    assert ("dlq:redrive", "/api/admin/dlq/rss.ingest/redrive") in actions
    assert ("dlq:purge", "dlq:ledger") in actions


def test_dlq_routes_show_the_quarantine_and_refuse_what_does_not_verify(
        db_url: str, make_services: Callable[..., Services], registry: Any) -> None:
    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    client = TestClient(create_app(services), raise_server_exceptions=False)
    runs: list[str] = []
    consumer = Consumer("rss.ingest", lambda m, i: runs.append(m["batchId"]), services,
                        registry=registry)
    forged = {"topic": "rss.ingest", "batchId": "forged", "sourceId": "s", "feedUrl": "",
              "publishedAt": "p", "signature": "0" * 64}
    consumer.deliver_local(json.dumps(forged), "m-forged")
    assert runs == []

    overview = client.get("/api/admin/dlq", headers=auth("ops")).json()["queues"]
    assert {"queue": "quarantine", "depth": 1} in overview
    [item] = client.get("/api/admin/dlq/quarantine", headers=auth("ops")).json()["items"]
    assert item == {**item, "id": "m-forged", "queue": "quarantine",
                    "reason": "signature does not match"}
    shown = client.get("/api/admin/dlq/quarantine/m-forged", headers=auth("ops")).json()
    assert shown["body"]["message"] == forged and shown["body"]["topic"] == "rss.ingest"

    answer = client.post("/api/admin/dlq/quarantine/redrive", headers=auth("ops"), json={})
    assert answer.status_code == 200
    assert answer.json()["count"] == 0 and answer.json()["refused"] == [{
        "id": "m-forged",
        "reason": "does not verify against a current or retired secret (signature does not match)"}]
    assert runs == []
    purged = client.post("/api/admin/dlq/quarantine/purge", headers=auth("ops"),
                         json={"ids": ["m-forged"]})
    assert purged.json() == {"queue": "quarantine", "purged": 1}
