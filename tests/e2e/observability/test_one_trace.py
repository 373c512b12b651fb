"""One alert's whole story as ONE OpenTelemetry trace, as a collector receives it: a local
OTLP/HTTP receiver decodes what Sluice exports with the protocol's protobuf definitions.

The tick (the RSS job that matched the story) -> the match -> the enqueue -> two sends
failed by the webhook's outage (503) -> the send that succeeded, in order, each attempt a child of the
enqueue span and linked to it and to the drain run that made it; the operator's actions
are spans too, and the EMF figures arrive as OpenTelemetry metrics. Both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from sluice.core import trace
from sluice.core.services import Services
from sluice.core.times import iso_z
from sluice.delivery import drain
from sluice.delivery.store import DeliveryStore
from sluice.http.app import create_app
from sluice.rss.store import RssStore
from sluice.store.db import utcnow
from tests.conftest import CRON_SECRET, admin_token
from tests.e2e.alerts.test_alerts_e2e import FIRST, rss
from tests.integration.delivery.helpers import WEBHOOK_SECRET, drain_once, due_now
from tests.providers.feeds import FeedServer
from tests.providers.otlp import OtlpReceiver, ReceivedSpan, exporting
from tests.providers.webhook import WebhookReceiver
from tests.rss_support import FEED_ENV


def ops() -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(['ops'], subject='ops-1')}"}


@pytest.fixture
def collector() -> Iterator[OtlpReceiver]:
    with exporting() as receiver:
        yield receiver


@pytest.fixture(autouse=True)
def no_sleeps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(drain, "SLEEP", lambda seconds: None)


def _by_id(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {span.span_id: span for span in spans}


def test_one_alert_is_one_trace_from_the_tick_to_the_send_that_went(
        db_url: str, make_services: Callable[..., Services], collector: OtlpReceiver) -> None:
    with FeedServer() as feeds, WebhookReceiver(WEBHOOK_SECRET) as webhook:
        # GIVEN a tenant whose rule matches one story of its feed, and a receiver that is down
        svc = make_services(db_url, **FEED_ENV, SLUICE_WEBHOOK_SIGNING_SECRET=WEBHOOK_SECRET,
                            SLUICE_RSS_SCOPE_MIN_INTERVAL_SECONDS="0",
                            SLUICE_DELIVERY_OUTAGE_THRESHOLD="1")
        client = TestClient(create_app(svc), raise_server_exceptions=False)
        store = RssStore(svc.db)
        source = store.add_source(feeds.add_rss("/wire", items=1)).id
        feeds.feeds["/wire"].set(rss(FIRST))
        store.put_scope("acme", "tenant-acme", (source,), "en", True)
        # a second rule's alert goes to another hook of the same receiver: two entries
        # failing there make the outage the receiver's, and it holds the story's entry
        put = client.put("/api/admin/alerts/rules/acme", headers=ops(), json={"rules": [
            {"id": "results", "match": {"keywords": ["quarterly results"]},
             "destination": {"channel": "webhook", "recipient": webhook.url}},
            {"id": "fires", "match": {"keywords": ["fire"]},
             "destination": {"channel": "webhook",
                             "recipient": f"{webhook.http.url}/hooks/fires"}}]})
        assert put.status_code == 200, put.text
        webhook.answers = [503] * 1000

        # WHEN the tick matches the story, two drains meet the outage, a third sends it
        tick = client.get("/api/admin/rss/refresh",
                          headers={"authorization": f"Bearer {CRON_SECRET}"})
        assert tick.status_code == 200, tick.text
        assert tick.json()["alertSweep"]["enqueued"] == 2
        for _ in range(2):
            assert drain_once(svc)["recovered"] == 0
            due_now(svc)
        webhook.answers.clear()
        assert drain_once(svc)["recovered"] == 2
        [entry] = [e for e in DeliveryStore(svc.db).list() if e.recipient == webhook.url]
        # and an operator pauses the receiver (a preview first)
        until = iso_z(utcnow() + timedelta(hours=1))
        pause = f"/api/admin/delivery/destinations/{entry.receiver}/pause"
        for dry_run in (True, False):
            paused = client.post(pause, headers=ops(), json={"until": until, "dryRun": dry_run})
            assert paused.status_code == 200, paused.text
        trace.flush()

    # THEN the collector holds the story as one trace
    spans = collector.spans
    [enqueue] = [s for s in collector.named("enqueue ") if s.attributes["sluice.entry_id"]
                 == entry.id]
    story = sorted((s for s in spans if s.trace_id == enqueue.trace_id),
                   key=lambda s: s.start_ns)
    by_id = _by_id(spans)
    [tick_span] = [s for s in story if s.name == "job rss-refresh"]
    assert tick_span.parent_span_id == "" and tick_span.attributes["sluice.job"] == "rss-refresh"
    assert tick_span.attributes["sluice.outcome"] == "ok"
    # the enqueue happened inside the tick (whatever spans lie between them)
    ancestor = enqueue
    while ancestor.parent_span_id:
        ancestor = by_id[ancestor.parent_span_id]
    assert ancestor == tick_span
    assert enqueue.kind == "producer"
    assert enqueue.attributes["messaging.system"] == "sluice"
    assert enqueue.attributes["messaging.operation.type"] == "send"
    assert enqueue.attributes["messaging.destination.name"] == entry.destination
    assert enqueue.attributes["sluice.destination"] == entry.destination
    assert enqueue.attributes["sluice.receiver"] == entry.receiver
    assert enqueue.attributes["messaging.message.id"] == entry.id
    assert enqueue.attributes["sluice.outcome"] == "enqueued"

    attempts = [s for s in story if s.name.startswith("deliver ")
                and s.attributes["sluice.entry_id"] == entry.id]
    outcomes = [s.attributes["sluice.outcome"] for s in attempts]
    # the policy's own names: the second failure at least is the receiver's outage
    assert len(attempts) == 3 and outcomes[2] == "acked", outcomes
    assert "receiver failing" in outcomes[:2] and "acked" not in outcomes[:2], outcomes
    assert tick_span.start_ns < enqueue.start_ns < attempts[0].start_ns
    assert attempts[0].end_ns <= attempts[1].start_ns
    assert attempts[1].end_ns <= attempts[2].start_ns
    drains = set()
    for attempt in attempts:
        assert attempt.parent_span_id == enqueue.span_id
        assert attempt.kind == "consumer"
        assert attempt.attributes["messaging.operation.type"] == "process"
        assert attempt.attributes["sluice.entry_id"] == entry.id
        assert attempt.attributes["messaging.message.id"] == entry.id
        assert attempt.attributes["sluice.destination"] == entry.destination
        links = {link.attributes["sluice.link"]: link for link in attempt.links}
        assert (links["enqueue"].trace_id, links["enqueue"].span_id) == (
            enqueue.trace_id, enqueue.span_id)
        drain_run = by_id[links["drain"].span_id]
        assert drain_run.name == "drain delivery"
        assert by_id[drain_run.parent_span_id].name == "job delivery-drain"
        drains.add(drain_run.span_id)
    assert len(drains) == 3  # each attempt in its own drain run, each run its own trace
    assert attempts[0].attributes["sluice.attempt"] == 1

    # the operator's action that set the rule
    [rules_set] = collector.named("operator alerts:rules_set")
    assert rules_set.kind == "server"
    assert rules_set.attributes["sluice.actor"] == "ops-1"
    assert rules_set.attributes["http.response.status_code"] == 200
    previewed, pause_span = sorted(collector.named("operator delivery:destination_pause"),
                                   key=lambda s: s.start_ns)
    assert previewed.attributes["sluice.preview"] is True
    assert "sluice.preview" not in pause_span.attributes
    assert pause_span.attributes["sluice.destination"] == entry.receiver
    assert pause_span.attributes["sluice.outcome"] == "200"
    # and the drain's figures as metrics, beside EMF
    assert {"sluice.queue_drained.recovered", "sluice.job_duration_ms",
            "sluice.queue_drained.destinations_down"} <= set(collector.metrics)
