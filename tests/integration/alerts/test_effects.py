"""An alert is sent once for the life of its story, not once per delivery retention:
weeks compressed by moving the rows' timestamps. Both backends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta

import pytest

from sluice.alerts.effects import KEEP, prune_effects
from sluice.alerts.evaluate import evaluate_new_stories, match_key
from sluice.alerts.rules import RulesStore
from sluice.alerts.sweep import run_alert_sweep
from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.rss.catalog import peek_scope
from sluice.rss.store import RssStore
from sluice.store.db import utcnow
from tests.providers.feeds import FeedServer
from tests.rss_support import catalog, feed_services

RULE = {"id": "r1", "match": {"keywords": ["story 1"]},
        "destination": {"channel": "slack", "recipient": "C0ALERTS"}}


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


@pytest.fixture
def svc(db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> Services:
    services = feed_services(make_services, db_url)
    store = RssStore(services.db)
    source = store.add_source(feeds.add_rss("/a", items=3)).id
    store.put_scope("a", "tenant-a", (source,), "en", True)
    with catalog(services) as cat:
        cat.refresh_scope("a")
    RulesStore(services).put("a", [RULE])
    return services


def sweep(svc: Services) -> int:
    return run_alert_sweep(svc, Deadline(60))["enqueued"]


def settle_weeks_ago(svc: Services, status: DeliveryStatus, days: int = 400) -> None:
    """The alert's entry settled long ago (the quiet feed kept its story in the build)."""
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_queue SET status = :status, updated_at = :t, "
                   "failure_reason = CASE WHEN :status = 'failed' THEN 'permanent' END",
                   {"status": status.value, "t": utcnow() - timedelta(days=days)})


@pytest.mark.parametrize("status", [DeliveryStatus.ACKED, DeliveryStatus.FAILED])
def test_a_pruned_entry_is_never_enqueued_again(svc: Services, status: DeliveryStatus) -> None:
    # GIVEN a match delivered (or failed for good) a year ago
    assert sweep(svc) == 1
    settle_weeks_ago(svc, status)
    # WHEN the retention prunes its entry
    assert DeliveryStore(svc.db).prune(utcnow() - timedelta(days=7)) == 1
    assert DeliveryStore(svc.db).list() == []
    # THEN neither the sweep nor the new-story path enqueues it again
    assert sweep(svc) == 0
    build = peek_scope(svc, "a")
    assert build is not None
    assert evaluate_new_stories(svc, build, list(build.stories), ["a"]).enqueued == 0
    assert DeliveryStore(svc.db).list() == []
    with svc.db.transaction() as tx:
        [effect] = tx.fetchall("SELECT outcome FROM delivery_effects")
    assert effect["outcome"] == status.value, "the record keeps the final state"


def test_a_purged_alert_is_never_sent_again(svc: Services) -> None:
    assert sweep(svc) == 1
    [entry] = DeliveryStore(svc.db).list()
    settle_weeks_ago(svc, DeliveryStatus.FAILED, days=0)
    DeliveryStore(svc.db).purge(entry.id)
    assert sweep(svc) == 0
    assert DeliveryStore(svc.db).list() == []
    with svc.db.transaction() as tx:
        [effect] = tx.fetchall("SELECT outcome FROM delivery_effects")
    assert effect["outcome"] == "purged"


def test_deleting_and_recreating_a_rule_does_not_rearm_it(svc: Services) -> None:
    # The match key is (scope, rule id, story): a rule recreated with the same id is the
    # same rule; a rule with a new id is a new rule and alerts on the stories it matches.
    assert sweep(svc) == 1
    settle_weeks_ago(svc, DeliveryStatus.ACKED)
    DeliveryStore(svc.db).prune(utcnow() - timedelta(days=7))
    rules = RulesStore(svc)
    rules.put("a", [])
    assert sweep(svc) == 0
    rules.put("a", [RULE])
    assert sweep(svc) == 0, "same id: not re-armed"
    rules.put("a", [{**RULE, "id": "r2"}])
    assert sweep(svc) == 1, "a new id is a new rule"


def test_effect_records_go_only_once_their_story_is_gone(svc: Services) -> None:
    assert sweep(svc) == 1
    settle_weeks_ago(svc, DeliveryStatus.ACKED)
    DeliveryStore(svc.db).prune(utcnow() - timedelta(days=7))
    long_ago = utcnow() - KEEP - timedelta(days=1)
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_effects SET updated_at = :t", {"t": long_ago})
    assert sweep(svc) == 0, "the story is still stored: the record stays (and is touched)"
    with svc.db.transaction() as tx:
        tx.execute("UPDATE delivery_effects SET updated_at = :t", {"t": long_ago})
        tx.execute("DELETE FROM rss_stories")
    assert prune_effects(svc.db) == 1, "story gone from every source and unseen for KEEP"
    key = match_key("a", "r1", "unused")
    assert DeliveryStore(svc.db).known_effects([key]) == set()
