"""One bad source never stops a catalog build: whatever its fetch raises is that source's
failure, recorded with its reason and a backoff, and the set's other sources are built."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.rss.catalog import TickMemo
from sluice.rss.store import RssStore, Source
from tests.providers.feeds import FeedServer
from tests.rss_support import FakeClock, catalog, feed_services


class PoisonedFetcher:
    """The real fetcher, except that one source's fetch raises what no fetch expects."""

    def __init__(self, real: Any, poisoned_id: str) -> None:
        self.real = real
        self.poisoned_id = poisoned_id

    def fetch(self, source: Source, now: datetime, deadline_at: float,
              budget: Any = None) -> Any:
        if source.id == self.poisoned_id:
            raise RuntimeError("a parser bug this feed alone triggers")
        return self.real.fetch(source, now, deadline_at, budget)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def test_a_source_whose_fetch_raises_fails_alone_with_a_backoff(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, sqlite_url)
    store = RssStore(svc.db)
    good = [store.add_source(feeds.add_rss(f"/good{i}", items=2)).id for i in range(2)]
    bad = store.add_source(feeds.add_rss("/bad", items=2)).id
    store.put_scope("scope-1", "tenant-1", (good[0], bad, good[1]), "en", True)
    clock = FakeClock()

    with catalog(svc, clock, memo=TickMemo()) as cat:
        cat.fetcher = PoisonedFetcher(cat.fetcher, bad)
        refreshed = cat.refresh_scope("scope-1", force=True)

    assert refreshed.build is not None
    assert len(refreshed.build.stories) == 4, "both good sources were built"
    [poisoned] = store.sources_by_ids((bad,))
    assert poisoned.consecutive_failures == 1
    assert poisoned.next_attempt_at is not None and poisoned.next_attempt_at > clock.now()
    assert "RuntimeError: a parser bug" in (poisoned.last_error or "")
