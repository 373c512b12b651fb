"""Alerts end to end on the local stand-ins, both backends: feed server -> the tick over
HTTP -> build -> rules -> delivery queue -> drain -> webhook / Slack / Telegram, each
match received once (chunked where long); new stories evaluated after the response; a
rule edited later matched by the next sweep; the sweep never fetching; the rules routes
(roles, 400 naming the field, audit) and the command line."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any
from xml.sax.saxutils import escape

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.delivery import drain
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.rss.store import RssStore
from tests.conftest import BASE_ENV, CRON_SECRET, admin_token, run_cli
from tests.integration.delivery.helpers import WEBHOOK_SECRET, drain_settled
from tests.providers.feeds import FeedServer
from tests.providers.slack import SlackStandIn
from tests.providers.telegram import TelegramStandIn
from tests.providers.webhook import WebhookReceiver
from tests.rss_support import FEED_ENV

CRON = {"authorization": f"Bearer {CRON_SECRET}"}


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


def billing() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['billing'], subject='bill-1')}"}
LONG = " ".join(["R&D&M&A"] * 250)  # past the parser's cap once escaped: cut to it


def rss(items: list[tuple[str, str, str]]) -> bytes:
    entries = "".join(
        f"<item><title>{escape(title)}</title><link>https://news.example/{guid}</link>"
        f"<guid isPermaLink=\"false\">{guid}</guid>"
        f"<description>{escape(escape(summary))}</description></item>"
        for guid, title, summary in items)
    return (f"<?xml version=\"1.0\" encoding=\"utf-8\"?><rss version=\"2.0\"><channel>"
            f"<title>wire</title><link>https://news.example</link><description>wire"
            f"</description>{entries}</channel></rss>").encode()


FIRST = [("q1", "Quarterly results beat forecasts", "Revenue grew."),
         ("f1", "Factory fire in the north", "No one was hurt.")]
# A story at the parser's caps (title 500 characters, summary 2,000 of HTML) whose
# ampersands Telegram's HTML escaping multiplies: past 4,096 once converted.
MERGER = "Merger talks resume " + "&" * 480
LATER = [("m1", MERGER, LONG), ("f2", "Another factory FIRE", "Crews on site.")]


@pytest.fixture(autouse=True)
def no_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain, "SLEEP", lambda seconds: None)


@pytest.fixture
def stand_ins() -> Iterator[tuple[FeedServer, WebhookReceiver, SlackStandIn, TelegramStandIn]]:
    with (FeedServer() as feeds, WebhookReceiver(WEBHOOK_SECRET) as webhook,
          SlackStandIn() as slack, TelegramStandIn(chats=("1001",)) as telegram):
        yield feeds, webhook, slack, telegram


def provider_env(slack: SlackStandIn, telegram: TelegramStandIn) -> dict[str, str]:
    return {**FEED_ENV, "SLUICE_WEBHOOK_SIGNING_SECRET": WEBHOOK_SECRET,
            "SLUICE_SLACK_BOT_TOKEN": slack.token, "SLUICE_SLACK_API_URL": slack.url,
            "SLUICE_TELEGRAM_BOT_TOKEN": telegram.token,
            "SLUICE_TELEGRAM_API_URL": telegram.url,
            "SLUICE_RSS_SCOPE_MIN_INTERVAL_SECONDS": "0"}


def test_stories_reach_each_channel_once_from_the_tick(
        db_url: str, make_services: Callable[..., Services],
        stand_ins: tuple[FeedServer, WebhookReceiver, SlackStandIn, TelegramStandIn]) -> None:
    feeds, webhook, slack, telegram = stand_ins
    svc = make_services(db_url, **provider_env(slack, telegram))
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    store = RssStore(svc.db)
    source = store.add_source(feeds.add_rss("/wire", items=1)).id
    feeds.feeds["/wire"].set(rss(FIRST))
    store.put_scope("acme", "tenant-acme", (source,), "en", True)
    store.put_scope("globex", "tenant-globex", (source,), "en", True)
    put = client.put("/api/admin/alerts/rules/acme", headers=ops(), json={"rules": [
        {"id": "results", "match": {"keywords": ["quarterly results"]},
         "destination": {"channel": "webhook", "recipient": webhook.url}},
        {"id": "fires", "match": {"keywords": ["fire"]},
         "destination": {"channel": "slack", "recipient": "C0ALERTS"}}]})
    assert put.status_code == 200, put.text
    assert client.put("/api/admin/alerts/rules/globex", headers=ops(), json=[
        {"id": "deals", "match": {"keywords": ["merger"]},
         "destination": {"channel": "telegram", "recipient": "1001"}}]).status_code == 200

    first = client.get("/api/admin/rss/refresh", headers=CRON)
    assert first.status_code == 200, first.text
    sweep = first.json()["alertSweep"]
    assert (sweep["tenantsWithRules"], sweep["evaluated"], sweep["skippedNoFeedCache"],
            sweep["failed"], sweep["enqueued"]) == (2, 2, 0, 0, 2)
    drain_settled(svc)
    [hook] = webhook.delivered.values()
    assert hook["alert"]["ruleId"] == "results"
    assert hook["alert"]["story"]["title"] == FIRST[0][1]
    assert [m["text"].splitlines()[0] for m in slack.messages] == [
        "*Factory fire in the north*"]

    # New stories: evaluated when the tenant build brings them (after the response), and
    # seen again by the same tick's sweep; one delivery each all the same.
    feeds.feeds["/wire"].set(rss(FIRST + LATER))
    second = client.get("/api/admin/rss/refresh", headers=CRON)
    assert second.status_code == 200, second.text
    drain_settled(svc)
    assert len(slack.messages) == 2 and "Another factory FIRE" in slack.messages[1]["text"]
    # The long one arrives in chunks, split at the paragraph: title and link, then the
    # summary; together the whole message.
    chunks = [m["text"] for m in telegram.messages]
    assert len(chunks) == 2
    assert chunks[0] == f"{MERGER}\nhttps://news.example/m1"
    assert chunks[1].startswith("R&D&M&A") and chunks[1].endswith("R&D&M&A")

    # A rule added after the stories arrived: the next sweep (admin POST, no tenant
    # ingestion and no fetch) matches it.
    hits = dict(feeds.hits)
    rules = client.get("/api/admin/alerts/rules/acme", headers=ops()).json()["rules"]
    rules.append({"id": "late", "match": {"keywords": ["quarterly"]},
                  "destination": {"channel": "telegram", "recipient": "1001"}})
    assert client.put("/api/admin/alerts/rules/acme", headers=ops(),
                      json={"rules": rules}).status_code == 200
    admin = client.post("/api/admin/rss/refresh", headers=ops())
    assert admin.status_code == 200, admin.text
    assert admin.json()["alertSweep"]["enqueued"] == 1
    assert dict(feeds.hits) == hits
    drain_settled(svc)
    assert telegram.messages[-1]["text"].startswith("Quarterly results beat forecasts")

    # Re-run ticks: nothing is delivered twice.
    sent = (len(webhook.received), len(slack.messages), len(telegram.messages))
    for _ in range(2):
        assert client.get("/api/admin/rss/refresh", headers=CRON).status_code == 200
        drain_settled(svc)
    assert (len(webhook.received), len(slack.messages), len(telegram.messages)) == sent
    assert len(webhook.delivered) == 1


def test_the_rules_routes_check_roles_and_fields_and_are_audited(
        db_url: str, make_services: Callable[..., Services]) -> None:
    svc = make_services(db_url)
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    path = "/api/admin/alerts/rules/acme"
    assert client.get(path).status_code == 401
    assert client.get(path, headers=billing()).status_code == 403
    assert client.get(path, headers=ops()).json() == {"scopeId": "acme", "rules": []}
    bad = client.put(path, headers=ops(), json=[{"id": "r", "match": {"keywords": ["x"]},
                                               "destination": {"channel": "fax",
                                                               "recipient": "1"}}])
    assert bad.status_code == 400
    assert bad.json()["error"]["field"] == "rules[0].destination.channel"
    assert client.get(path, headers=ops(), params={"all": "1"}).status_code == 400
    audit = [(row["action"], row["outcome"]) for row in RunStore(svc.db).recent_audit()]
    assert ("alerts:rules_set", "400") in audit


def test_the_command_line_shows_and_sets_rules(db_url: str, tmp_path: Any) -> None:
    env = {**BASE_ENV, "SLUICE_DATABASE_URL": db_url}
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps([{"id": "r1", "match": {"keywords": ["breach"]},
                                  "destination": {"channel": "slack",
                                                  "recipient": "C0ALERTS"}}]))
    done = run_cli(["alerts", "rules", "acme", "--set", str(rules), "--by", "ana"], env)
    assert done.returncode == 0, done.stderr
    assert "r1: breach -> slack:C0ALERTS" in done.stdout
    shown = run_cli(["alerts", "rules", "acme", "--json"], env)
    assert json.loads(shown.stdout)["rules"][0]["id"] == "r1"
    rules.write_text(json.dumps([{"id": "r1"}]))
    bad = run_cli(["alerts", "rules", "acme", "--set", str(rules)], env)
    assert bad.returncode != 0 and "rules[0].match" in bad.stderr
