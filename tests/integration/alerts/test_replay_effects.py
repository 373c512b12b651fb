"""A replay never re-arms an alert: it restarts the entry in place (the same key, the same
effect record), leaves the rows that are not its status alone (an acked alert unless
``acked`` is asked, a pending or in-flight one always), and cannot bring back an entry
the retention pruned. Judged from the Slack stand-in and the sweep. Both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from sluice.alerts.rules import RulesStore
from sluice.alerts.sweep import run_alert_sweep
from sluice.core.errors import RequestError
from sluice.core.services import Services
from sluice.delivery.channels import Outbound, channels
from sluice.delivery.replay import Replay, ReplayReport, parse_filter
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline, get_job
from sluice.jobs.runner import run_job
from sluice.rss.store import RssStore
from sluice.store.db import utcnow
from tests.providers.feeds import FeedServer
from tests.providers.slack import SlackStandIn
from tests.rss_support import catalog, feed_services

RULE = {"id": "r1", "match": {"keywords": ["story 1"]},
        "destination": {"channel": "slack", "recipient": "C0ALERTS"}}
DESTINATION = "slack:C0ALERTS"


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


@pytest.fixture
def slack() -> Iterator[SlackStandIn]:
    with SlackStandIn() as stand_in:
        yield stand_in


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        slack: SlackStandIn) -> Services:
    services = feed_services(make_services, db_url, SLUICE_SLACK_BOT_TOKEN=slack.token,
                             SLUICE_SLACK_API_URL=slack.url,
                             SLUICE_SLACK_CHANNEL_RATE_PER_SECOND="1000")
    store = RssStore(services.db)
    source = store.add_source(feeds.add_rss("/a", items=3)).id
    store.put_scope("a", "tenant-a", (source,), "en", True)
    with catalog(services) as cat:
        cat.refresh_scope("a")
    RulesStore(services).put("a", [RULE])
    return services


def sweep(svc: Services) -> int:
    return int(run_alert_sweep(svc, Deadline(60))["enqueued"])


def drain(svc: Services) -> int:
    outcome = run_job(get_job("delivery-drain"), svc, "cli")
    return int(outcome.body["recovered"])


def replay(svc: Services, status: str | None = None) -> ReplayReport:
    flt = parse_filter({"destination": DESTINATION, "status": status,
                        "since": (utcnow() - timedelta(hours=1)).isoformat()},
                       channels=list(channels()))
    with Outbound.open(svc.settings) as client:
        return Replay.from_services(svc, client).run(flt, dry_run=False)


def effects(svc: Services) -> list[str]:
    with svc.db.transaction() as tx:
        return [row["idempotency_key"] for row in tx.fetchall(
            "SELECT idempotency_key FROM delivery_effects")]


def test_a_replay_does_not_re_arm_a_delivered_alert(svc: Services, slack: SlackStandIn) -> None:
    # GIVEN an alert the sweep enqueued once and Slack took
    assert sweep(svc) == 1 and drain(svc) == 1
    [entry] = DeliveryStore(svc.db).list()
    recorded = effects(svc)
    assert recorded == [entry.idempotency_key] and len(slack.messages) == 1

    # WHEN the destination's failed entries are replayed: the acked alert is not one of them
    report = replay(svc)
    assert (report.count, report.already_acknowledged) == (0, 1)
    assert drain(svc) == 0 and len(slack.messages) == 1
    # AND the sweep still knows the match: nothing new
    assert sweep(svc) == 0

    # WHEN the operator asks for the acked ones: the same entry goes once more, as asked
    assert replay(svc, "acked").count == 1
    assert drain(svc) == 1 and len(slack.messages) == 2
    # THEN it stayed one entry under one key, its effect record untouched: the sweep, and
    # every sweep after it, enqueues nothing
    assert [e.id for e in DeliveryStore(svc.db).list()] == [entry.id]
    assert effects(svc) == recorded
    assert sweep(svc) == 0 and sweep(svc) == 0 and drain(svc) == 0
    assert len(slack.messages) == 2

    # WHEN the retention prunes the entry, no replay of any status can bring it back
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET updated_at = :t",
                   {"t": utcnow() - timedelta(days=60)})
    assert DeliveryStore(svc.db).prune(utcnow() - timedelta(days=30)) == 1
    assert [replay(svc, status).count for status in ("failed", "acked", "unknown")] == [0, 0, 0]
    assert sweep(svc) == 0 and drain(svc) == 0 and len(slack.messages) == 2


def test_pending_and_in_flight_alerts_are_never_restarted(svc: Services,
                                                          slack: SlackStandIn) -> None:
    # GIVEN an alert a sender holds in flight (its request may be leaving now)
    assert sweep(svc) == 1
    [claimed] = DeliveryStore(svc.db).claim(timedelta(minutes=2))
    # WHEN every status a replay takes is replayed
    assert [replay(svc, status).count
            for status in ("failed", "expired", "acked", "unknown")] == [0, 0, 0, 0]
    # THEN it is untouched: the same attempt under the same lease
    held = DeliveryStore(svc.db).get(claimed.id)
    assert (held.status, held.attempts, held.lease_until) == (
        DeliveryStatus.IN_FLIGHT, claimed.attempts, claimed.lease_until)
    # AND pending is not a status a replay takes (the drain sends it already)
    with pytest.raises(RequestError):
        replay(svc, "pending")
    assert sweep(svc) == 0 and slack.messages == []
