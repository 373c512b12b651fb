"""Destinations named in data are checked where they are accepted: a webhook recipient or a
feed URL the sender would refuse is a 400 naming the field, at save time, with no DNS.
No storage semantics change here, so these run on SQLite only."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from tests.conftest import admin_token


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


@pytest.fixture
def client(sqlite_url: str, make_services: Callable[..., Services]) -> TestClient:
    # nothing allow-listed: loopback is as internal as the metadata address
    svc = make_services(sqlite_url, SLUICE_WEBHOOK_ALLOW_HOSTS="", SLUICE_FEED_ALLOW_HOSTS="")
    return TestClient(create_app(svc), raise_server_exceptions=False)


INSIDE = ["http://169.254.169.254/latest/meta-data/", "http://127.0.0.1:6379/", "http://[::1]/",
          "http://localhost:8080/hook", "http://10.0.0.8/hook"]
# not in the one canonical form the sender dials: refused by the door's URL rule first
MALFORMED = ["http://0177.0.0.2/", "http://[::1/x", "http://2130706433/",
             "ftp://example.com/hook", "http://a..b/"]


def test_a_webhook_rule_aimed_inside_is_refused_naming_the_field(client: TestClient) -> None:
    for recipient in INSIDE + MALFORMED:
        answer = client.put("/api/admin/alerts/rules/acme", headers=ops(), json={"rules": [
            {"id": "ok", "match": {"keywords": ["x"]},
             "destination": {"channel": "slack", "recipient": "C0123"}},
            {"id": "bad", "match": {"keywords": ["x"]},
             "destination": {"channel": "webhook", "recipient": recipient}}]})
        assert answer.status_code == 400, (recipient, answer.text)
        error = answer.json()["error"]
        assert error["field"] == "rules[1].destination.recipient"
        assert error["code"] == ("address_refused" if recipient in INSIDE else "bad_request"), \
            (recipient, error)
    assert client.get("/api/admin/alerts/rules/acme", headers=ops()).json()["rules"] == []


def test_a_public_webhook_recipient_is_accepted_without_resolving_it(client: TestClient) -> None:
    answer = client.put("/api/admin/alerts/rules/acme", headers=ops(), json=[
        {"id": "ok", "match": {"keywords": ["x"]},
         "destination": {"channel": "webhook", "recipient": "https://hooks.example.invalid/x"}}])
    assert answer.status_code == 200, answer.text


def test_a_feed_url_the_fetcher_would_refuse_is_refused_at_save_time(
        client: TestClient) -> None:
    for url in ("http://0177.0.0.2/feed", "http://1.2.3.04/feed", "http://[::1/feed",
                "http://xn--/feed", "http://127.1/feed", "http://169.254.169.254/feed",
                "http://\u2460\u2461\u2466.0.0.1/feed", "http://exa mple.com/feed"):
        answer = client.post("/api/admin/rss/sources", headers=ops(),
                             json={"url": url, "global": True})
        assert answer.status_code == 400, (url, answer.text)
        assert answer.json()["error"]["field"] == "url"
    assert client.get("/api/admin/rss/sources", headers=ops()).json()["sources"] == []
