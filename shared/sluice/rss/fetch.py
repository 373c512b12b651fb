"""Fetching feeds over HTTP: conditional GET, a total deadline, a size cap on decoded bytes,
redirects checked hop by hop, exponential backoff with Retry-After.

Every request goes through ``sluice.egress`` with the feeds' ``AddressGuard`` (feed URLs
come from tenants: only public addresses, unless the host is in
``SLUICE_FEED_ALLOW_HOSTS``), and ends by the earlier of the fetch timeout and the build's
deadline, headers included: a fetch cut off is that source's failure, with backoff.
"""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import NamedTuple
from urllib.parse import urljoin, urlsplit

from sluice.core.errors import SluiceError
from sluice.egress import AddressGuard, Answer, DestinationRefused, Egress, EgressError
from sluice.rss.parse import parse_feed
from sluice.rss.store import FetchState, Source, Story

USER_AGENT = "Sluice/0.1 feed fetcher (RSS 2.0, Atom 1.0; conditional GET)"
ACCEPT = "application/rss+xml, application/atom+xml, application/xml;q=0.9, text/xml;q=0.9, */*;q=0.1"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
RETRY_AFTER_STATUSES = frozenset({429, 503})


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
    """``Retry-After`` as seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return timedelta(seconds=int(value))
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(timedelta(0), when - now) if when.tzinfo else None


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
                 max_redirects: int, per_host: int = 2, backoff: Backoff = DEFAULT_BACKOFF,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
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

    def fetch(self, source: Source, now: datetime, deadline_at: float) -> Fetched:
        """Fetch and parse one source; every failure is a result, never an exception."""
        if self.monotonic() >= deadline_at:
            return SKIPPED
        try:
            return self._fetch(source, now, deadline_at)
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

    def _fetch(self, source: Source, now: datetime, deadline_at: float) -> Fetched:
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
            stories = parse_feed(answer.body, source.id, base_url=answer.url)
            return Fetched(FetchState(ok=True, status=answer.status,
                                      etag=answer.headers.get("etag"),
                                      last_modified=answer.headers.get("last-modified")),
                           stories, len(answer.body))
        raise FetchFailed(f"more than {self.max_redirects} redirects")

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
