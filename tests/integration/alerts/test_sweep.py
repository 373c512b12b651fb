"""The alert sweep on both backends: tenants by prefix, peek only (no fetch, no build),
skippedNoFeedCache, per-tenant isolation with its log line, exactly one delivery per
(rule, story) across re-runs, a rule edited after the stories arrived, the deadline."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest

from sluice.alerts.evaluate import EvaluationFailed, evaluate_new_stories, match_key
from sluice.alerts.rules import RulesStore, rules_key
from sluice.alerts.sweep import run_alert_sweep
from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.jobs.registry import JOBS, Deadline
from sluice.jobs.runner import run_job
from sluice.rss import sweep as rss_sweep
from sluice.rss.catalog import peek_scope
from sluice.rss.store import RssStore
from sluice.store.state import StateStore
from tests.providers.feeds import FeedServer
from tests.rss_support import catalog, feed_services


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def rule(rule_id: str, *keywords: str, recipient: str = "C0ALERTS",
         **match: Any) -> dict[str, Any]:
    return {"id": rule_id, "match": {"keywords": list(keywords), **match},
            "destination": {"channel": "slack", "recipient": recipient}}


def setup(svc: Services, feeds: FeedServer) -> RssStore:
    """Scopes a and b share one built source set; c has a set never built."""
    store = RssStore(svc.db)
    built = store.add_source(feeds.add_rss("/a", items=5)).id
    unbuilt = store.add_source(feeds.add_rss("/z", items=5)).id
    store.put_scope("a", "tenant-a", (built,), "en", True)
    store.put_scope("b", "tenant-b", (built,), "en", True)
    store.put_scope("c", "tenant-c", (unbuilt,), "en", True)
    with catalog(svc) as cat:
        cat.refresh_scope("a")
    return store


def entries(svc: Services) -> list[tuple[str, str]]:
    return sorted((e.recipient, e.payload["payloads"][0].splitlines()[0])
                  for e in DeliveryStore(svc.db).list(limit=500))


def test_the_sweep_counts_and_delivers_each_match_once(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        caplog: pytest.LogCaptureFixture) -> None:
    svc = feed_services(make_services, db_url)
    setup(svc, feeds)
    rules = RulesStore(svc)
    rules.put("a", [rule("r1", "story 1", "STORY 3")])
    rules.put("b", [rule("r1", "story 1", recipient="C0B"),
                    {**rule("off", "story"), "enabled": False}])
    rules.put("c", [rule("r1", "story")])
    rules.put("d", [])  # a rules row without rules
    rules.put("e", [{**rule("off", "story"), "enabled": False}])  # only a disabled rule
    StateStore(svc.db).put(rules_key("broken"), {"rules": [{"id": "x"}]})
    hits = dict(feeds.hits)

    result = run_alert_sweep(svc, Deadline(60))
    assert result == {"tenantsWithRules": 3, "evaluated": 2, "skippedNoFeedCache": 1,
                      "failed": 1, "skippedDeadline": 0, "evaluations": 10,
                      "enqueued": 3}
    assert any(r.getMessage().startswith(
        "[alerts] sweep evaluation failed for broken: rules[0].match: must be an object")
        for r in caplog.records)
    assert entries(svc) == [("C0ALERTS", "**a story 1**"), ("C0ALERTS", "**a story 3**"),
                            ("C0B", "**a story 1**")]

    again = run_alert_sweep(svc, Deadline(60))  # a re-run tick: nothing new
    assert again["enqueued"] == 0 and again["evaluated"] == 2
    assert len(entries(svc)) == 3
    assert dict(feeds.hits) == hits  # the sweep never fetched
    assert RssStore(svc.db).build(RssStore(svc.db).scope("c").build_key) is None  # nor built


def test_a_rule_edited_after_the_stories_arrived_is_matched_by_the_next_sweep(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    setup(svc, feeds)
    rules = RulesStore(svc)
    rules.put("a", [rule("r1", "nothing matches this")])
    assert run_alert_sweep(svc, Deadline(60))["enqueued"] == 0
    rules.put("a", [rule("r1", "story 4")])
    assert run_alert_sweep(svc, Deadline(60))["enqueued"] == 1
    assert entries(svc) == [("C0ALERTS", "**a story 4**")]


def test_the_deadline_stops_the_sweep_between_batches(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    setup(svc, feeds)
    rules = RulesStore(svc)
    for n in range(12):
        rules.put(f"t{n:02d}", [rule("r1", "story")])
    now = [0.0]
    deadline = Deadline(1, clock=lambda: now[0])
    now[0] = 5.0  # expired before the first batch
    result = run_alert_sweep(svc, deadline)
    assert result["skippedDeadline"] == 12 and result["tenantsWithRules"] == 0


def test_a_redriven_match_is_the_same_entry_and_no_second_one(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    setup(svc, feeds)
    RulesStore(svc).put("a", [rule("r1", "story 2")])
    run_alert_sweep(svc, Deadline(60))
    store = DeliveryStore(svc.db)
    [entry] = store.list(limit=500)
    assert entry.idempotency_key == match_key("a", "r1", _story_id(svc, "a story 2"))
    [claimed] = store.claim(timedelta(seconds=30))
    assert store.fail(claimed, "permanent, for the test")
    store.redrive(entry.id)
    assert run_alert_sweep(svc, Deadline(60))["enqueued"] == 0
    assert [(e.id, e.status.value) for e in store.list(limit=500)] == [(entry.id, "pending")]


def _story_id(svc: Services, title: str) -> str:
    build = peek_scope(svc, "a")
    assert build is not None
    return next(s.id for s in build.stories if s.title == title)


def test_new_story_evaluation_isolates_scopes_and_raises_their_failures_together(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    setup(svc, feeds)
    RulesStore(svc).put("b", [rule("r1", "story 0")])
    StateStore(svc.db).put(rules_key("a"), {"rules": [{"id": "x"}]})
    build = peek_scope(svc, "b")
    assert build is not None
    with pytest.raises(EvaluationFailed, match=r"1 scope\(s\) failed: a: rules\[0\]"):
        evaluate_new_stories(svc, build, list(build.stories), ["a", "b"])
    assert entries(svc) == [("C0ALERTS", "**a story 0**")]


def test_a_tick_whose_sweep_target_does_not_resolve_reports_one_failure(
        db_url: str, make_services: Callable[..., Services],
        monkeypatch: pytest.MonkeyPatch) -> None:
    svc = feed_services(make_services, db_url)
    monkeypatch.setattr(rss_sweep, "ALERT_SWEEP_TARGET", "sluice.alerts.sweep:no_such_sweep")
    outcome = run_job(JOBS["rss-refresh"], svc, "cli")
    assert outcome.body["alertSweep"]["failed"] == 1 and outcome.body["failed"] == 1
    monkeypatch.undo()
    assert rss_sweep.resolve_alert_sweep() is run_alert_sweep


def test_the_sweep_uses_the_builds_the_tick_hands_over(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """The tick hands its builds to the sweep: a scope whose build the tick holds is
    evaluated against it without reading the store (c's set was never stored here)."""
    svc = feed_services(make_services, db_url)
    store = setup(svc, feeds)
    RulesStore(svc).put("c", [rule("r1", "z story 2")])
    assert run_alert_sweep(svc, Deadline(60))["skippedNoFeedCache"] == 1
    held = store.build(store.scope("a").build_key)
    assert held is not None
    key = store.scope("c").build_key
    stories = tuple(s._replace(title=s.title.replace("a story", "z story"))
                    for s in held.stories)
    handed = {key: held._replace(key=key, stories=stories)}
    result = run_alert_sweep(svc, Deadline(60), builds=handed)
    assert result["skippedNoFeedCache"] == 0 and result["evaluated"] == 1
    assert result["enqueued"] == 1
    assert entries(svc) == [("C0ALERTS", "**z story 2**")]
