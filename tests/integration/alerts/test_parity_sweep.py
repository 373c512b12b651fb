"""The alert sweep as the reference documents describe it, run inside the rss-refresh job
through the job runner (``run_job``) against a local feed publisher: which tenants it
reads, five at a time between deadline checks, stored builds only (never a fetch), one
tenant's failure its own, and rules written after their stories arrived."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from sluice.alerts.rules import RulesStore, rules_key
from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.rss.store import RssStore
from sluice.store.state import StateStore
from tests.integration.alerts.test_sweep import entries, rule
from tests.integration.rss.test_parity_tick import tick
from tests.providers.feeds import FeedServer
from tests.rss_support import feed_services


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def scopes(svc: Services, feeds: FeedServer, *names: str, path: str = "/wire") -> RssStore:
    """Completed scopes sharing one source set (one build)."""
    store = RssStore(svc.db)
    source = store.add_source(feeds.add_rss(path, items=3)).id
    for name in names:
        store.put_scope(name, f"tenant-{name}", (source,), "en", True)
    return store


def test_the_tick_sweeps_only_the_tenants_with_a_rules_row(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, sqlite_url)
    scopes(svc, feeds, "a", "b", "c")
    RulesStore(svc).put("a", [rule("r1", "story 1", recipient="C0A")])
    RulesStore(svc).put("c", [rule("r1", "story 1", recipient="C0C")])
    sweep = tick(svc).body["alertSweep"]
    assert (sweep["tenantsWithRules"], sweep["evaluated"], sweep["enqueued"]) == (2, 2, 2)
    assert [recipient for recipient, _ in entries(svc)] == ["C0A", "C0C"]


def test_the_sweep_takes_five_tenants_between_two_deadline_checks(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """The run's clock passes its deadline once the sweep's first batch has started: the
    check before the second batch stops it, so five tenants were evaluated and two left."""
    svc = feed_services(make_services, sqlite_url)
    names = [f"t{n}" for n in range(7)]
    scopes(svc, feeds, *names)
    for name in names:
        RulesStore(svc).put(name, [rule("r1", "story 1")])
    budget = JOBS["rss-refresh"].budget_s
    start = time.monotonic()

    def clock() -> float:  # past the deadline (within the run's margin) once a batch began
        swept = any(t.name.startswith("alert-sweep") for t in threading.enumerate())
        return start + budget + 1 if swept else time.monotonic()

    sweep = tick(svc, deadline_clock=clock).body["alertSweep"]
    assert (sweep["evaluated"], sweep["skippedDeadline"]) == (5, 2)


def test_the_admin_post_sweeps_stored_builds_and_fetches_nothing_for_them(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """A scope whose build is stored is evaluated from it; one never built is counted in
    ``skippedNoFeedCache``; neither scope's feed is asked for by the sweep."""
    svc = feed_services(make_services, sqlite_url)
    store = scopes(svc, feeds, "built")
    tick(svc)  # builds the scope
    store.put_scope("never", "tenant-never",
                    (store.add_source(feeds.add_rss("/never", items=3)).id,), "en", True)
    RulesStore(svc).put("built", [rule("r1", "story 1")])
    RulesStore(svc).put("never", [rule("r1", "story 1")])
    before = dict(feeds.hits)
    sweep = tick(svc, "admin").body["alertSweep"]
    assert (sweep["tenantsWithRules"], sweep["evaluated"], sweep["skippedNoFeedCache"],
            sweep["enqueued"]) == (2, 1, 1, 1)
    assert dict(feeds.hits) == before, "the admin POST's sweep fetched nothing"
    assert "/never" not in feeds.hits


def test_a_tenant_whose_rules_cannot_be_read_fails_alone_and_is_logged(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        caplog: pytest.LogCaptureFixture) -> None:
    svc = feed_services(make_services, sqlite_url)
    scopes(svc, feeds, "good", "broken")
    RulesStore(svc).put("good", [rule("r1", "story 1")])
    StateStore(svc.db).put(rules_key("broken"), {"rules": [{"id": "x"}]})
    outcome = tick(svc)
    sweep = outcome.body["alertSweep"]
    assert (sweep["failed"], sweep["evaluated"], sweep["enqueued"]) == (1, 1, 1)
    assert outcome.outcome == "failures"
    [line] = [r.getMessage() for r in caplog.records
              if r.levelname == "ERROR" and "sweep evaluation failed" in r.getMessage()]
    assert line.startswith("[alerts] sweep evaluation failed for broken: ")


def test_a_rule_written_after_its_stories_arrived_is_matched_by_the_next_tick(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, sqlite_url)
    scopes(svc, feeds, "a")
    RulesStore(svc).put("a", [rule("r1", "nothing matches this")])
    assert tick(svc).body["alertSweep"]["enqueued"] == 0
    RulesStore(svc).put("a", [rule("r1", "wire story 2")])
    again = tick(svc).body  # inside the throttle: no build, no new story
    assert again["tenantIngestion"]["throttled"] == 1
    assert again["alertSweep"]["enqueued"] == 1
    assert entries(svc) == [("C0ALERTS", "**wire story 2**")]
