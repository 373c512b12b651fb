"""Fetching feeds over HTTP: conditional GET, a total deadline, a size cap on decoded bytes,
redirects checked hop by hop, exponential backoff with Retry-After.

Every request goes through ``sluice.egress`` with the feeds' ``AddressGuard`` (feed URLs
come from tenants: only public addresses, unless the host is in
``SLUICE_FEED_ALLOW_HOSTS``), and ends by the earlier of the fetch timeout and the build's
deadline, headers included: a fetch cut off is that source's failure, with backoff.

What the readers get is bounded too (``sluice.rss.bounds``): at most
``SLUICE_RSS_MAX_FEED_ENTRIES`` entries of one document and what is left of the build's
``SLUICE_RSS_MAX_BUILD_ENTRIES``, and at most ``PARSE_SLOTS`` documents are parsed at once
(parsing holds the interpreter lock: more at once is only more memory). No parse starts
after the build's deadline.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import urljoin, urlsplit

from sluice.core.errors import SluiceError
from sluice.egress import AddressGuard, Answer, DestinationRefused, Egress, EgressError
from sluice.egress.pacing import retry_after_header
from sluice.rss.bounds import Cut, EntryBudget, cut_document
from sluice.rss.parse import parse_feed
from sluice.rss.store import FetchState, Source, Story

if TYPE_CHECKING:
    from sluice.core.settings import Settings

USER_AGENT = "Sluice/0.1 feed fetcher (RSS 2.0, Atom 1.0; conditional GET)"
ACCEPT = "application/rss+xml, application/atom+xml, application/xml;q=0.9, text/xml;q=0.9, */*;q=0.1"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
RETRY_AFTER_STATUSES = frozenset({429, 503})
PARSE_SLOTS = 2


class FetchFailed(SluiceError):
    """The feed could not be fetched."""

    code = "fetch_failed"

    def __init__(self, message: str, status: int | None = None,
                 retry_after: timedelta | None = None) -> None:
        super().__init__(message)
        self.http_status = status
        self.retry_after = retry_after


def feed_guard(allow_hosts: tuple[str, ...] | list[str] = ()) -> AddressGuard:
    return AddressGuard(allow_hosts, setting="SLUICE_FEED_ALLOW_HOSTS", field="url")


def feed_client(guard: AddressGuard, *, timeout_s: float, max_connections: int) -> Egress:
    return Egress(timeout_s=timeout_s, guard=guard, max_connections=max_connections,
                  headers={"user-agent": USER_AGENT, "accept": ACCEPT})


def settings_fetcher(settings: Settings) -> Fetcher:
    """A fetcher on its own client, bounded as the settings say (``client.close()`` it)."""
    client = feed_client(feed_guard(settings.feed_allow_hosts),
                         timeout_s=settings.rss_fetch_timeout_s,
                         max_connections=settings.rss_fetch_concurrency)
    return Fetcher(client, timeout_s=settings.rss_fetch_timeout_s,
                   max_bytes=settings.rss_max_feed_bytes,
                   max_redirects=settings.rss_max_redirects,
                   per_host=settings.rss_per_host_connections,
                   max_entries=settings.rss_max_feed_entries)


class Backoff(NamedTuple):
    """Delay before the next attempt after ``failures`` consecutive failures: doubling from
    ``base`` up to ``cap``, forever (a source is never given up on)."""

    base: timedelta = timedelta(minutes=5)
    cap: timedelta = timedelta(days=1)

    def delay(self, failures: int) -> timedelta:
        if failures <= 0:
            return timedelta(0)
        delay: timedelta = self.base * 2 ** min(failures - 1, 32)
        return min(self.cap, delay)

    def next_attempt(self, failures: int, now: datetime,
                     retry_after: timedelta | None = None) -> datetime:
        delay = self.delay(failures)
        if retry_after is not None:
            delay = min(self.cap, max(delay, retry_after))
        return now + delay


DEFAULT_BACKOFF = Backoff()


def retry_after(value: str | None, now: datetime) -> timedelta | None:
    """``Retry-After`` as seconds or an HTTP date, parsed strictly (``sluice.egress.pacing``:
    anything else is no answer) and held to the backoff's cap."""
    found = retry_after_header(value, cap_s=DEFAULT_BACKOFF.cap.total_seconds(),
                               now=now.timestamp())
    return timedelta(seconds=found.wait_s) if found is not None else None


class Fetched(NamedTuple):
    """One fetch: what to record on the source, and the stories (None: keep the stored)."""

    state: FetchState
    stories: list[Story] | None
    bytes: int
    not_modified: bool = False
    skipped: bool = False  # never started: the build's deadline passed first (not a failure)


SKIPPED = Fetched(FetchState(ok=False, status=None), None, 0, skipped=True)


class Fetcher:
    def __init__(self, client: Egress, *, timeout_s: float, max_bytes: int,
                 max_redirects: int, per_host: int = 2, max_entries: int = 500,
                 backoff: Backoff = DEFAULT_BACKOFF,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_entries = max_entries
        self._parsing = threading.BoundedSemaphore(PARSE_SLOTS)
        self.max_redirects = max_redirects
        self.per_host = per_host
        self.backoff = backoff
        self.monotonic = monotonic
        self._hosts: dict[str, threading.BoundedSemaphore] = {}
        self._hosts_lock = threading.Lock()

    def _host_slot(self, url: str) -> threading.BoundedSemaphore:
        try:
            host = (urlsplit(url).hostname or "").lower()
        except ValueError:  # unparseable: the request refuses it; share one slot meanwhile
            host = ""
        with self._hosts_lock:
            slot = self._hosts.get(host)
            if slot is None:
                slot = self._hosts[host] = threading.BoundedSemaphore(self.per_host)
            return slot

    def fetch(self, source: Source, now: datetime, deadline_at: float,
              budget: EntryBudget | None = None) -> Fetched:
        """Fetch and parse one source; every failure is a result, never an exception.
        Skipped (not failed) when the build's deadline passed or its ``budget`` of
        entries is spent before it starts."""
        if self.monotonic() >= deadline_at or (budget is not None and budget.left <= 0):
            return SKIPPED
        try:
            return self._fetch(source, now, deadline_at, budget)
        except FetchFailed as exc:
            return self._failed(source, now, str(exc), exc.http_status, exc.retry_after)
        except DestinationRefused as exc:
            return self._failed(source, now, f"refused: {exc.message}", None, None)
        except EgressError as exc:
            status = getattr(exc, "http_status", None)
            return self._failed(source, now, exc.message, status, None)
        except SluiceError as exc:  # FeedParseError
            return self._failed(source, now, exc.message, 200, None)

    def abandoned(self, source: Source, now: datetime, why: str) -> Fetched:
        """A fetch that gave no result (still running at the build's deadline, or raised):
        that source's failure, with backoff."""
        return self._failed(source, now, why, None, None)

    def _failed(self, source: Source, now: datetime, error: str, status: int | None,
                wait: timedelta | None) -> Fetched:
        failures = source.consecutive_failures + 1
        return Fetched(FetchState(ok=False, status=status, error=error,
                                  next_attempt_at=self.backoff.next_attempt(failures, now, wait)),
                       None, 0)

    def _fetch(self, source: Source, now: datetime, deadline_at: float,
               budget: EntryBudget | None) -> Fetched:
        headers = {}
        if source.etag:
            headers["if-none-match"] = source.etag
        if source.last_modified:
            headers["if-modified-since"] = source.last_modified
        url = source.url
        stop_at = min(self.monotonic() + self.timeout_s, deadline_at)
        for _ in range(self.max_redirects + 1):
            answer = self._get(url, headers, stop_at)
            if answer.status in REDIRECTS and answer.headers.get("location"):
                url = urljoin(url, answer.headers["location"])
                if urlsplit(url).scheme not in ("http", "https"):
                    raise DestinationRefused("redirect to a non-http(s) URL")
                continue
            if answer.status == 304:
                return Fetched(FetchState(ok=True, status=304, etag=source.etag,
                                          last_modified=source.last_modified), None, 0,
                               not_modified=True)
            if answer.status >= 400:
                wait = (retry_after(answer.headers.get("retry-after"), now)
                        if answer.status in RETRY_AFTER_STATUSES else None)
                raise FetchFailed(f"HTTP {answer.status}", answer.status, wait)
            if answer.cut == "cap":
                raise FetchFailed(f"the feed is over the {self.max_bytes} limit (decoded bytes)",
                                  answer.status)
            if answer.cut:
                raise FetchFailed("timed out while reading the feed", answer.status)
            most = self.max_entries if budget is None else budget.take(self.max_entries)
            if most <= 0:
                return SKIPPED  # the other feeds of the build took what was left
            cut = Cut(b"", 0)  # a parse that raised read nothing: all is given back
            try:
                why = ("" if most == self.max_entries or budget is None else
                       f"SLUICE_RSS_MAX_BUILD_ENTRIES is {budget.total}")
                cut, stories = self._parse(answer, source, most, why, deadline_at)
            finally:
                if budget is not None:
                    budget.give_back(most - cut.entries)
            return Fetched(FetchState(ok=True, status=answer.status,
                                      etag=answer.headers.get("etag"),
                                      last_modified=answer.headers.get("last-modified"),
                                      error=cut.reason or None),
                           stories, len(answer.body))
        raise FetchFailed(f"more than {self.max_redirects} redirects")

    def _parse(self, answer: Answer, source: Source, most: int, why: str,
               deadline_at: float) -> tuple[Cut, list[Story]]:
        """The document cut to ``most`` entries and parsed, in one of the parse slots."""
        if not self._parsing.acquire(timeout=max(0.0, deadline_at - self.monotonic())):
            raise FetchFailed("timed out: the build's deadline passed before the feed was "
                              "parsed", answer.status)
        try:
            if self.monotonic() >= deadline_at:
                raise FetchFailed("timed out: the build's deadline passed before the feed "
                                  "was parsed", answer.status)
            cut = cut_document(answer.body, max_entries=most, why=why)
            return cut, parse_feed(cut.body, source.id, base_url=answer.url)
        finally:
            self._parsing.release()

    def _get(self, url: str, headers: dict[str, str], stop_at: float) -> Answer:
        """One hop, holding one of its host's slots (waiting for a slot counts against
        the deadline too)."""
        slot = self._host_slot(url)
        if not slot.acquire(timeout=max(0.0, stop_at - self.monotonic())):
            raise FetchFailed("timed out waiting for a connection to the host")
        try:
            return self.client.request("GET", url, headers=headers, deadline=stop_at,
                                       max_bytes=self.max_bytes, truncate=True)
        finally:
            slot.release()
