"""Fetching real feeds from the local feed server: conditional GET, gzip, the size cap,
timeouts, redirect limits, refused redirects, Retry-After. Loopback only: 127.0.0.1 is
allowed, 127.0.0.2 is not, and nothing is ever sent anywhere else."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from sluice.egress import AddressGuard
from sluice.rss.fetch import Fetched, Fetcher, feed_client
from sluice.rss.store import Source
from tests.providers.feeds import FeedServer

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer(slow_s=2.0) as server:
        yield server


@pytest.fixture
def fetcher() -> Iterator[Fetcher]:
    guard = AddressGuard(["127.0.0.1"])
    with feed_client(guard, timeout_s=0.5, max_connections=4) as client:
        yield Fetcher(client, timeout_s=0.5, max_bytes=100_000, max_redirects=3)


def source(url: str, *, etag: str | None = None, last_modified: str | None = None,
           failures: int = 0) -> Source:
    return Source(id="src", url=url, title=None, is_global=False, etag=etag,
                  last_modified=last_modified, last_fetched_at=None, last_success_at=None,
                  last_status=None, last_error=None, consecutive_failures=failures,
                  next_attempt_at=None, created_at=NOW)


def fetch(fetcher: Fetcher, src: Source) -> Fetched:
    return fetcher.fetch(src, NOW, deadline_at=fetcher.monotonic() + 30)


def test_rss_and_atom_are_fetched_gzipped_with_their_validators(fetcher: Fetcher,
                                                                feeds: FeedServer) -> None:
    rss = fetch(fetcher, source(feeds.add_rss("/news", items=4)))
    atom = fetch(fetcher, source(feeds.add_atom("/wire", items=2)))
    assert rss.state.ok and rss.state.status == 200 and len(rss.stories or []) == 4
    assert atom.state.ok and [s.title for s in atom.stories or []] == ["wire entry 0",
                                                                       "wire entry 1"]
    assert rss.state.etag == feeds.feeds["/news"].etag
    assert rss.state.last_modified == feeds.feeds["/news"].last_modified
    # the body travelled gzipped (the server only compresses when asked) and was decoded
    assert rss.bytes == len(feeds.feeds["/news"].body) > 0
    request = next(r for r in feeds.http.requests if r["path"] == "/news")
    assert "gzip" in request["headers"]["accept-encoding"]
    assert request["headers"]["user-agent"].startswith("Sluice/")


def test_a_gzip_body_of_several_members_gives_every_story(fetcher: Fetcher,
                                                        feeds: FeedServer) -> None:
    url = feeds.add_rss("/members", items=3)
    feeds.feeds["/members"].gzip_members = 2  # the cut falls inside the second story
    fetched = fetch(fetcher, source(url))
    assert fetched.state.ok, fetched.state
    assert [s.title for s in fetched.stories or []] == [
        "members story 0", "members story 1", "members story 2"]


def test_a_conditional_request_answered_304_costs_no_parse(fetcher: Fetcher,
                                                           feeds: FeedServer) -> None:
    url = feeds.add_rss("/news", items=3)
    first = fetch(fetcher, source(url))
    again = fetch(fetcher, source(url, etag=first.state.etag,
                                  last_modified=first.state.last_modified))
    assert again.not_modified and again.state.ok and again.state.status == 304
    assert again.stories is None and again.bytes == 0
    assert again.state.etag == first.state.etag
    assert feeds.conditional["/news"] == 1
    by_date = fetch(fetcher, source(url, last_modified=first.state.last_modified))
    assert by_date.not_modified
    feeds.add_rss("/news", items=5)  # the publisher changed the feed: a full answer again
    changed = fetch(fetcher, source(url, etag=first.state.etag))
    assert not changed.not_modified and len(changed.stories or []) == 5


@pytest.mark.parametrize(("path", "error", "status"), [
    ("/malformed", "not an RSS or Atom document", 200),
    ("/huge", "over the 100000 limit", 200),
    ("/loop", "more than 3 redirects", None),
    ("/limited", "HTTP 429", 429),
    ("/missing", "HTTP 404", 404),
])
def test_broken_publishers_are_failures_with_backoff(fetcher: Fetcher, feeds: FeedServer,
                                                     path: str, error: str,
                                                     status: int | None) -> None:
    fetched = fetch(fetcher, source(feeds.url + path, failures=1))
    assert not fetched.state.ok and fetched.stories is None
    assert error in (fetched.state.error or "") and fetched.state.status == status
    expected = timedelta(hours=1) if path == "/limited" else timedelta(minutes=10)
    assert fetched.state.next_attempt_at == NOW + expected


def test_the_redirect_loop_stops_at_the_limit(fetcher: Fetcher, feeds: FeedServer) -> None:
    fetch(fetcher, source(feeds.url + "/loop"))
    assert feeds.hits["/loop"] == 4  # the first request and three redirects


def test_a_slow_feed_times_out(fetcher: Fetcher, feeds: FeedServer) -> None:
    fetched = fetch(fetcher, source(feeds.url + "/slow"))
    assert not fetched.state.ok and "timed out" in (fetched.state.error or "")


def test_a_fetch_not_started_by_the_build_deadline_is_skipped_not_failed(
        fetcher: Fetcher, feeds: FeedServer) -> None:
    """The source did nothing wrong (others used the time): it stays due, no backoff."""
    url = feeds.add_rss("/news")
    fetched = fetcher.fetch(source(url), NOW, deadline_at=fetcher.monotonic() - 1)
    assert fetched.skipped and not fetched.state.ok and fetched.state.error is None
    assert feeds.hits["/news"] == 0


def test_a_redirect_to_an_address_that_is_not_allowed_is_refused(fetcher: Fetcher,
                                                                 feeds: FeedServer) -> None:
    fetched = fetch(fetcher, source(feeds.url + "/to-private"))
    assert not fetched.state.ok
    assert (fetched.state.error or "").startswith("refused: the destination is a loopback address")
    # the redirect was followed no further: the server saw the first request only
    assert sum(feeds.hits.values()) == 1


def test_a_name_is_connected_to_at_the_address_that_was_checked(feeds: FeedServer) -> None:
    """The guard resolves once and the socket goes to that address (no second lookup)."""
    guard = AddressGuard(["feeds.test"], resolver=lambda host, port: ["127.0.0.1"])
    url = feeds.add_rss("/news", items=2).replace("127.0.0.1", "feeds.test")
    with feed_client(guard, timeout_s=1, max_connections=2) as client:
        fetched = Fetcher(client, timeout_s=1, max_bytes=100_000, max_redirects=1).fetch(
            source(url), NOW, deadline_at=float("inf"))
    assert fetched.state.ok and len(fetched.stories or []) == 2
    assert feeds.http.requests[-1]["headers"]["host"].startswith("feeds.test")
