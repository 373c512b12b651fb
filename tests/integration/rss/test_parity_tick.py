"""The rss-refresh tick as the reference documents describe it, run as the job through the
job runner (``run_job``) against a local feed publisher: the fixed order, the scope
listing, the time budget and the rotation that moves it, the forced refresh of each
scope, per-tenant isolation, and the builds tenants share. The wall clock is moved with
``time_machine`` (the tick's start decides its rotation); the budget runs on real
monotonic time, spent by feeds that answer slowly."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine

from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import RunOutcome, run_job
from sluice.rss.store import RssStore
from tests.providers.feeds import FeedServer
from tests.rss_support import feed_services

WINDOW = timedelta(minutes=10)  # the rotation moves one scope per window
SLOW = {"SLUICE_TENANT_INGESTION_TIME_BUDGET_MS": "2000",  # room for the scope listing
        "SLUICE_RSS_FETCH_TIMEOUT_SECONDS": "10"}


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def tick(svc: Services, trigger: str = "schedule", **kwargs: Any) -> RunOutcome:
    outcome = run_job(JOBS["rss-refresh"], svc, trigger, **kwargs)  # type: ignore[arg-type]
    assert outcome.status == 200, outcome.body
    return outcome


def in_window(offset: int, scopes: int, later: int = 0) -> datetime:
    """A moment near now whose ten-minute window puts the rotation at ``offset`` of
    ``scopes`` (``later`` windows after the first such one)."""
    now = datetime.now(UTC)
    window = int(now.timestamp() * 1000) // int(WINDOW.total_seconds() * 1000)
    ahead = (offset - window) % scopes + later
    start = datetime.fromtimestamp((window + ahead) * WINDOW.total_seconds(), UTC)
    return start + timedelta(minutes=1)


def tenant_set(store: RssStore, feeds: FeedServer, name: str, sources: int = 1) -> tuple[str, ...]:
    return tuple(store.add_source(feeds.add_rss(f"/{name}/{n}", items=2)).id
                 for n in range(sources))


def requested(feeds: FeedServer) -> list[str]:
    """The feed paths in the order their requests arrived."""
    return [r["path"] for r in feeds.http.requests]


def slow(feeds: FeedServer, path: str, seconds: float = 2.5) -> None:
    """The feed at ``path`` answers after ``seconds`` (more than the 2 s budget)."""
    feeds.on_request[path] = lambda: time.sleep(seconds)


def test_the_tick_builds_global_then_each_tenant_in_turn_then_sweeps(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """Global first, then the tenants one at a time (a slow first feed holds the next
    build back), then the sweep, which finds the builds this tick made."""
    from sluice.alerts.rules import RulesStore

    svc = feed_services(make_services, sqlite_url, SLUICE_RSS_FETCH_TIMEOUT_SECONDS="10")
    store = RssStore(svc.db)
    store.add_source(feeds.add_rss("/global", items=2), "Global wire", True)
    for name in ("a", "b", "c"):
        store.put_scope(name, f"tenant-{name}", tenant_set(store, feeds, name, 2), "en", True)
        RulesStore(svc).put(name, [{"id": "r", "match": {"keywords": ["story"]},
                                    "destination": {"channel": "slack",
                                                    "recipient": "C0ALERTS"}}])
    slow(feeds, "/a/0", 0.5)
    slow(feeds, "/b/0", 0.5)
    slow(feeds, "/c/0", 0.5)
    with time_machine.travel(in_window(0, 3), tick=True):
        body = tick(svc).body
    paths = requested(feeds)
    assert paths[0] == "/global"
    # each tenant's two feeds arrive together: one build at a time, in the listed order
    assert [p.split("/")[1] for p in paths[1:]] == ["a", "a", "b", "b", "c", "c"]
    assert body["tenantIngestion"]["refreshed"] == 3
    # the sweep ran after the builds: every scope had a build to read
    assert (body["alertSweep"]["evaluated"], body["alertSweep"]["skippedNoFeedCache"]) == (3, 0)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_scope_listing_that_fails_lists_no_scopes_and_the_tick_goes_on(
        backend: str, request: pytest.FixtureRequest, make_services: Callable[..., Services],
        feeds: FeedServer, caplog: pytest.LogCaptureFixture) -> None:
    """The listing's table is gone (a store error): no scope is ingested, and the tick still
    refreshes the global catalog and answers 200."""
    url = request.getfixturevalue("sqlite_url" if backend == "sqlite" else "pg_url")
    svc = feed_services(make_services, url)
    store = RssStore(svc.db)
    store.add_source(feeds.add_rss("/global", items=2), "Global wire", True)
    store.put_scope("a", "tenant-a", tenant_set(store, feeds, "a"), "en", True)
    with svc.db.transaction() as tx:
        tx.execute("ALTER TABLE rss_scopes RENAME TO rss_scopes_away", {})
    body = tick(svc).body
    assert body["inlineRefreshed"] is True
    assert (body["tenantIngestion"]["tenantScopes"], body["tenantIngestion"]["failed"]) == (0, 0)
    assert requested(feeds) == ["/global"]
    assert any(r.levelname == "ERROR" and r.getMessage().startswith(
        "[rss-refresh] listing tenant scopes failed; ingesting none") for r in caplog.records)


def test_the_budget_ends_tenant_ingestion_and_the_rest_is_counted_not_retried(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    assert Settings.from_env({}).tenant_ingestion_budget_ms == 240_000  # the default
    svc = feed_services(make_services, sqlite_url, **SLOW)
    store = RssStore(svc.db)
    for name in ("a", "b", "c"):
        store.put_scope(name, f"tenant-{name}", tenant_set(store, feeds, name), "en", True)
        slow(feeds, f"/{name}/0")
    with time_machine.travel(in_window(0, 3), tick=True):
        tenants = tick(svc).body["tenantIngestion"]
    assert (tenants["tenantScopes"], tenants["refreshed"], tenants["skippedTimeBudget"]) == (
        3, 1, 2)
    assert requested(feeds) == ["/a/0"], "the scopes past the budget are not fetched"
    assert [store.scope(s).last_refreshed_at is None for s in "abc"] == [False, True, True]


def test_the_run_deadline_caps_the_budget(sqlite_url: str, make_services: Callable[..., Services],
                                          feeds: FeedServer) -> None:
    """With the default budget (240 s), a run Lambda gives 3 s ends tenant ingestion at its
    own deadline (the first scope's feed takes longer than the whole run)."""
    svc = feed_services(make_services, sqlite_url, SLUICE_RSS_FETCH_TIMEOUT_SECONDS="10",
                        SLUICE_DEADLINE_MARGIN_SECONDS="5")
    assert svc.settings.tenant_ingestion_budget_ms == 240_000
    store = RssStore(svc.db)
    for name in ("a", "b", "c"):
        store.put_scope(name, f"tenant-{name}", tenant_set(store, feeds, name), "en", True)
        slow(feeds, f"/{name}/0", 4.0)
    with time_machine.travel(in_window(0, 3), tick=True):
        tenants = tick(svc, lambda_remaining_ms=lambda: 8_000).body["tenantIngestion"]
    # the first scope started within the run's 3 s (on a slow machine even that may not)
    assert tenants["tenantScopes"] == 3 and tenants["skippedTimeBudget"] >= 2
    assert requested(feeds) in (["/a/0"], [])


def test_the_rotation_starts_each_window_one_scope_further_so_the_tail_is_reached(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """The budget lets one scope through per tick: the tick of each ten-minute window starts
    at ``floor(startedAtMs / 600000) % n``, so three ticks reach all three scopes."""
    svc = feed_services(make_services, sqlite_url, **SLOW)
    store = RssStore(svc.db)
    names = ["a", "b", "c"]
    for name in names:
        store.put_scope(name, f"tenant-{name}", tenant_set(store, feeds, name), "en", True)
        slow(feeds, f"/{name}/0")
    reached = []
    for later in range(3):
        feeds.http.requests.clear()
        at = in_window(1, 3, later)
        with time_machine.travel(at, tick=True):
            tenants = tick(svc).body["tenantIngestion"]
        offset = (int(at.timestamp() * 1000) // 600_000) % 3
        assert offset == (1 + later) % 3
        assert requested(feeds) == [f"/{names[offset]}/0"], later
        assert (tenants["refreshed"], tenants["skippedTimeBudget"]) == (1, 2)
        reached.append(names[offset])
    assert reached == ["b", "c", "a"]


def test_each_scope_is_rebuilt_once_its_build_is_past_the_throttle(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """Forced: five minutes on, past the 240 s throttle but well inside the build's hour, every
    scope is built again (its feeds asked again) rather than served the stored build."""
    svc = feed_services(make_services, sqlite_url)
    store = RssStore(svc.db)
    for name in ("a", "b"):
        store.put_scope(name, f"tenant-{name}", tenant_set(store, feeds, name), "en", True)
    start = in_window(0, 2)
    with time_machine.travel(start, tick=True):
        first = tick(svc).body["tenantIngestion"]
    with time_machine.travel(start + timedelta(minutes=5), tick=True):
        second = tick(svc).body["tenantIngestion"]
    assert first["refreshed"] == second["refreshed"] == 2
    assert (feeds.hits["/a/0"], feeds.hits["/b/0"]) == (2, 2)


def test_a_failing_scope_is_counted_and_logged_and_the_others_go_on(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        caplog: pytest.LogCaptureFixture) -> None:
    """Scope b is removed while a's feed is being read (an operator deleting a tenant
    mid-tick): b's refresh fails, counted and logged as an error, and c is still built."""
    svc = feed_services(make_services, sqlite_url)
    store = RssStore(svc.db)
    for name in ("a", "b", "c"):
        store.put_scope(name, f"tenant-{name}", tenant_set(store, feeds, name), "en", True)
    feeds.on_request["/a/0"] = lambda: store.remove_scope("b")
    with time_machine.travel(in_window(0, 3), tick=True):
        outcome = tick(svc)
    tenants = outcome.body["tenantIngestion"]
    assert (tenants["refreshed"], tenants["failed"]) == (2, 1)
    assert outcome.outcome == "failures" and outcome.body["failed"] == 1
    assert feeds.hits["/c/0"] == 1
    [line] = [r.getMessage() for r in caplog.records
              if r.levelname == "ERROR" and "tenant ingestion failed" in r.getMessage()]
    assert line.startswith("[rss-refresh] tenant ingestion failed for b: ")


def test_tenants_with_the_same_sources_and_locale_share_one_build(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """Three tenants on one source set and locale cost one build; the same set in another
    locale, and another set, are builds of their own; every feed is read once."""
    svc = feed_services(make_services, sqlite_url)
    store = RssStore(svc.db)
    default = tenant_set(store, feeds, "default", 2)
    other = tenant_set(store, feeds, "other")
    for name in ("a", "b", "c"):
        store.put_scope(name, f"tenant-{name}", default, "en", True)
    store.put_scope("d", "tenant-d", default, "fr", True)
    store.put_scope("e", "tenant-e", other, "en", True)
    body = tick(svc).body
    tenants = body["tenantIngestion"]
    assert (tenants["tenantScopes"], tenants["refreshed"], tenants["shared"]) == (5, 3, 2)
    assert body["catalog"]["builds"] == 4  # the global catalog and the three tenant builds
    assert len({store.scope(s).build_key for s in "abcde"}) == 3
    assert all(count == 1 for count in feeds.hits.values()) and len(feeds.hits) == 3
