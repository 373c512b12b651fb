"""Helpers for the rss tests: an injected clock, services pointed at the local feed server."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sluice.core.services import Services
from sluice.rss.catalog import Catalog
from sluice.rss.fetch import settings_fetcher

FEED_ENV = {"SLUICE_FEED_ALLOW_HOSTS": "127.0.0.1", "SLUICE_RSS_FETCH_TIMEOUT_SECONDS": "1",
            "SLUICE_RSS_MAX_FEED_BYTES": "100000", "SLUICE_RSS_LOCK_WAIT_SECONDS": "20"}


class FakeClock:
    """Wall time and monotonic time that move only when a test says so."""

    def __init__(self, start: datetime | None = None) -> None:
        # Starts at the real time so builds stored under it are unexpired for peeks.
        self.wall = start or datetime.now(UTC)
        self.mono = 1000.0
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self.wall

    def monotonic(self) -> float:
        with self._lock:
            return self.mono

    def advance(self, seconds: float) -> None:
        with self._lock:
            self.wall += timedelta(seconds=seconds)
            self.mono += seconds


def feed_services(make_services: Callable[..., Services], db_url: str, **env: str) -> Services:
    return make_services(db_url, **{**FEED_ENV, **env})


def catalog(services: Services, clock: FakeClock | None = None, **kwargs: Any) -> Catalog:
    """A catalog on the real HTTP client; with ``clock``, its wall time is the fake one (fetch
    timeouts stay on real monotonic time: they guard real sockets)."""
    fetcher = settings_fetcher(services.settings)
    if clock is not None:
        kwargs.setdefault("now", clock.now)
    return Catalog(services, fetcher, **kwargs)


def scope_with_a_rule(services: Services, feeds: Any, clock: FakeClock) -> None:
    """Scope ``scope-a`` on one feed of two stories, built once, with an alert rule matching
    every story (to Slack ``C0ALERTS``); the feed then gains two new stories."""
    from sluice.alerts.rules import RulesStore
    from sluice.rss.store import RssStore

    store = RssStore(services.db)
    source = store.add_source(feeds.add_rss("/t/live", items=2))
    store.put_scope("scope-a", "tenant-a", (source.id,), "en", True)
    with catalog(services, clock) as cat:
        cat.refresh_scope("scope-a")
    RulesStore(services).put("scope-a", [{"id": "r1", "match": {"keywords": ["story"]},
                                          "destination": {"channel": "slack",
                                                          "recipient": "C0ALERTS"}}])
    feeds.add_rss("/t/live", items=4)
