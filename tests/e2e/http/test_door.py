"""Validation at the door, over HTTP and the command line, on both backends: each break of
the issue's Inbound list is a 400 (exit 64) naming the field, never a 5xx, a store error, or
a value stored to fail later."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from tests.conftest import BASE_ENV, CRON_SECRET, admin_token, run_cli
from tests.rss_support import FEED_ENV

CRON = {"authorization": f"Bearer {CRON_SECRET}"}
NON_CANONICAL_HOSTS = ["http://0177.0.0.2/feed", "http://1.2.3.04/feed", "http://①②⑦.0.0.1/feed",
                       "http://a..b/feed", "http://xn--/feed", "http://127.1/feed",
                       "http://0x7f.0.0.1/feed", "http://[::1/feed"]
LONG_KEY = "k" * 3000  # over Postgres's btree entry limit (~2.7 KB)


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['super_admin'], subject='ops-1')}"}


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, **FEED_ENV)


@pytest.fixture
def client(svc: Services) -> TestClient:
    """Both backends: where a value would reach a key or an index."""
    return TestClient(create_app(svc), raise_server_exceptions=False)


@pytest.fixture
def lite(sqlite_url: str, make_services: Callable[..., Services]) -> TestClient:
    """One backend: refusals that never reach the store."""
    return TestClient(create_app(make_services(sqlite_url, **FEED_ENV)),
                      raise_server_exceptions=False)


def refused(answer: Any, field: str) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["code"] == "bad_request" and error["field"] == field, error
    assert "psycopg" not in answer.text and "index row" not in answer.text


def test_a_feed_url_with_a_non_canonical_host_is_refused_and_the_tick_runs(
        client: TestClient) -> None:
    for url in NON_CANONICAL_HOSTS:
        refused(client.post("/api/admin/rss/sources", json={"url": url, "global": True},
                            headers=ops()), "url")
    assert client.get("/api/admin/rss/sources", headers=ops()).json()["sources"] == []
    tick = client.get("/api/admin/rss/refresh", headers=CRON)
    assert tick.status_code == 200, tick.text


def rule(channel: str, recipient: str) -> dict[str, Any]:
    return {"id": f"r-{channel}", "match": {"keywords": ["breach"]},
            "destination": {"channel": channel, "recipient": recipient}}


def test_a_malformed_webhook_or_email_recipient_is_refused_by_the_rules_put(
        lite: TestClient) -> None:
    client = lite
    good = rule("slack", "C0ALERTS")
    for recipient in ("http://[::1/x", "http://0177.0.0.2/hook", "http://u:p@example.com/"):
        refused(client.put("/api/admin/alerts/rules/acme", headers=ops(),
                           json={"rules": [good, rule("webhook", recipient)]}),
                "rules[1].destination.recipient")
    for recipient in ("ops@example.com\r\nBcc: all@example.com", "ops@example.com\n",
                      "ops@example.com\x0b"):
        refused(client.put("/api/admin/alerts/rules/acme", headers=ops(),
                           json={"rules": [good, rule("email", recipient)]}),
                "rules[1].destination.recipient")
    assert client.get("/api/admin/alerts/rules/acme", headers=ops()).json()["rules"] == []
    kept = client.put("/api/admin/alerts/rules/acme", headers=ops(),
                      json={"rules": [good, rule("email", "Ops@Example.com")]})
    assert kept.status_code == 200
    assert kept.json()["rules"][1]["destination"]["recipient"] == "Ops@example.com"


def test_nested_json_is_a_400_on_any_route_without_authentication(lite: TestClient) -> None:
    client = lite
    for path in ("/api/admin/rss/sources", "/api/admin/erasure/requests",
                 "/api/admin/delivery/redrive", "/api/admin/flags", "/api/no/such/route"):
        for method in ("POST", "PUT"):
            answer = client.request(method, path, content=b"[" * 1024,
                                    headers={"content-type": "application/json"})
            assert answer.status_code == 400, (method, path, answer.text)
            assert "nested deeper" in answer.json()["error"]["message"]


def test_oversized_keys_are_a_400_never_a_store_error(client: TestClient) -> None:
    refused(client.put("/api/admin/flags", headers=ops(), json={
        "key": "rssQueuePipeline", "enabled": True, "tenantScopeId": LONG_KEY}), "tenantScopeId")
    refused(client.post("/api/admin/rss/sources", headers=ops(),
                        json={"url": "http://127.0.0.1/" + LONG_KEY}), "url")
    refused(client.put(f"/api/admin/rss/scopes/{LONG_KEY}", headers=ops(),
                       json={"tenantId": "t", "sourceIds": ["s"], "locale": "en"}), "scopeId")
    refused(client.put(f"/api/admin/alerts/rules/{LONG_KEY}", headers=ops(),
                       json={"rules": []}), "scopeId")
    refused(client.post("/api/admin/erasure/requests", headers=ops(),
                        json={"subjectUserId": "u-1", "tenantId": LONG_KEY}), "tenantId")
    flags = client.get("/api/admin/flags", headers=ops()).json()["flags"]
    assert all(flag["overrides"] == {} for flag in flags)


def test_a_locale_with_a_newline_crlf_in_a_url_and_a_huge_title_are_not_stored(
        client: TestClient) -> None:
    refused(client.post("/api/admin/rss/sources", headers=ops(),
                        json={"url": "http://127.0.0.1/feed\r\nX-Injected: 1"}), "url")
    refused(client.post("/api/admin/rss/sources", headers=ops(),
                        json={"url": "http://127.0.0.1/feed", "title": "t" * 900_000}), "title")
    source = client.post("/api/admin/rss/sources", headers=ops(),
                         json={"url": "http://127.0.0.1/feed", "title": "Feed"})
    assert source.status_code == 201, source.text
    source_id = source.json()["id"]
    for locale in ("en\n", "en\r\n", "e n"):
        refused(client.put("/api/admin/rss/scopes/newsroom", headers=ops(), json={
            "tenantId": "t", "sourceIds": [source_id], "locale": locale}), "locale")
    refused(client.put("/api/admin/rss/scopes/newsroom", headers=ops(), json={
        "tenantId": "t\n", "sourceIds": [source_id], "locale": "en"}), "tenantId")
    assert client.get("/api/admin/rss/scopes", headers=ops()).json()["scopes"] == []


def test_the_command_line_refuses_hostile_values_with_exit_64(sqlite_url: str,
                                                             tmp_path: Any) -> None:
    env = {**BASE_ENV, **FEED_ENV, "SLUICE_DATABASE_URL": sqlite_url}
    rules = tmp_path / "rules.json"
    rules.write_text('{"rules": [{"id": "r", "match": {"keywords": ["x"]}, "destination": '
                     '{"channel": "webhook", "recipient": "http://[::1/x"}}]}')
    cases: list[tuple[list[str], str | None, str]] = [
        (["rss", "sources", "add", "http://0177.0.0.2/feed", "--global"], None, "url"),
        (["delivery", "enqueue", "email", "a@example.com\r\nBcc: b@example.com", "--text",
          "hi"], None, "recipient"),
        (["flags", "rssQueuePipeline", "on", "--tenant", LONG_KEY], None, "tenantScopeId"),
        (["alerts", "rules", "acme", "--set", str(rules)], None, "recipient"),
        (["publish", "rss.ingest"], "[" * 1024, "nested deeper"),
    ]
    for args, stdin, named in cases:
        done = run_cli(args, env, stdin=stdin)
        assert done.returncode == 64, (args, done.stderr)
        assert "bad_request" in done.stderr and named in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
