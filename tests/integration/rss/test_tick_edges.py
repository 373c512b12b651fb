"""The tick against a feed that trickles its headers, among good ones: it finishes within its
budget, builds the good scopes, runs ingestion and the sweep, and records the slow source as
failed with backoff (before, one such feed held the tick until Lambda killed it).
No storage semantics change here, so these run on SQLite only."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from sluice.queues.runtime import REGISTRY
from sluice.rss.catalog import peek, peek_scope
from sluice.rss.store import GLOBAL_KEY, RssStore
from tests.providers.feeds import FeedServer
from tests.providers.hostile import HostilePeer
from tests.rss_support import catalog, feed_services

FETCH_TIMEOUT_S = 1.0


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


@pytest.fixture
def peer() -> Iterator[HostilePeer]:
    with HostilePeer(drip_s=0.05) as server:
        yield server


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    REGISTRY.clear()


def test_one_trickling_feed_costs_its_own_fetch_timeout_and_nothing_else(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        peer: HostilePeer) -> None:
    svc = feed_services(make_services, sqlite_url,
                        SLUICE_RSS_FETCH_TIMEOUT_SECONDS=str(FETCH_TIMEOUT_S),
                        SLUICE_RSS_BUILD_DEADLINE_SECONDS="3")
    store = RssStore(svc.db)
    good = store.add_source(feeds.add_rss("/global", items=3), "Wire", True)
    slow = store.add_source(peer.url + "/trickle-headers", "Slow", True)
    tenant = tuple(store.add_source(feeds.add_rss(f"/t/{j}", items=2)).id for j in range(2))
    store.put_scope("scope-good", "tenant-1", tenant, "en", True)
    store.put_scope("scope-mixed", "tenant-2", (tenant[0], slow.id), "en", True)

    started = time.monotonic()
    outcome = run_job(JOBS["rss-refresh"], svc, "cron_http")
    elapsed = time.monotonic() - started

    assert outcome.status == 200, outcome.body
    # the slow feed is fetched once per tick (shared by the global set and a scope) and
    # cut off at the fetch timeout; everything else is local and quick
    assert elapsed < FETCH_TIMEOUT_S + 6, elapsed
    body = outcome.body
    assert body["inlineRefreshed"] is True
    assert body["tenantIngestion"]["refreshed"] == 2 and body["tenantIngestion"]["failed"] == 0
    assert "alertSweep" in body and body["alertSweep"]["failed"] == 0
    global_build = peek(svc, GLOBAL_KEY)
    assert global_build is not None and {s.source_id for s in global_build.stories} == {good.id}
    assert peek_scope(svc, "scope-good") is not None
    mixed = peek_scope(svc, "scope-mixed")
    assert mixed is not None and {s.source_id for s in mixed.stories} == {tenant[0]}
    recorded = store.source(slow.id)
    assert recorded.consecutive_failures == 1 and recorded.next_attempt_at is not None
    assert "timed out" in (recorded.last_error or "") or "no answer" in (
        recorded.last_error or "").lower()
    assert peer.hits["/trickle-headers"] == 1


def test_a_build_never_outlives_the_runs_deadline(
        sqlite_url: str, make_services: Callable[..., Services], peer: HostilePeer) -> None:
    """A fetch timeout and build deadline far longer than what is left of the run: the run's
    deadline wins, and the cut-off source is recorded as failed."""
    svc = feed_services(make_services, sqlite_url, SLUICE_RSS_FETCH_TIMEOUT_SECONDS="30",
                        SLUICE_RSS_BUILD_DEADLINE_SECONDS="60")
    store = RssStore(svc.db)
    slow = store.add_source(peer.url + "/trickle-headers", "Slow", True)
    started = time.monotonic()
    with catalog(svc, stop_at=started + 1.0) as built:
        refreshed = built.refresh_global(force=True)
    assert refreshed.outcome == "built"
    assert time.monotonic() - started < 1.0 + 2.5
    assert store.source(slow.id).consecutive_failures == 1
