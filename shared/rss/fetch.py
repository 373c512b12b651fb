"""Fetching feeds over HTTP: conditional GET, timeouts, a size cap, redirects checked hop by
hop, exponential backoff with Retry-After, and SSRF refusal at connect time.

Feed URLs come from tenants, so every connection goes through ``AddressGuard``: the
host is resolved, every address must be public (not loopback, private, link-local —
the instance metadata address included —, multicast, reserved or unspecified), and
the socket connects to the address that was checked, so a DNS answer cannot change
between the check and the connection. Hosts in ``SLUICE_FEED_ALLOW_HOSTS`` skip the
check (local development and tests serve feeds on loopback).
"""

from __future__ import annotations

import email.utils
import ipaddress
import socket
import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple
from urllib.parse import urljoin, urlsplit

import httpcore
import httpx

from shared.core.errors import RequestError, SluiceError
from shared.core.tls import tls_context
from shared.rss.parse import parse_feed
from shared.rss.store import FetchState, Source, Story

USER_AGENT = "Sluice/0.1 feed fetcher (RSS 2.0, Atom 1.0; conditional GET)"
ACCEPT = "application/rss+xml, application/atom+xml, application/xml;q=0.9, text/xml;q=0.9, */*;q=0.1"
REDIRECTS = frozenset({301, 302, 303, 307, 308})
RETRY_AFTER_STATUSES = frozenset({429, 503})

Resolver = Callable[[str, int], list[str]]


class RefusedAddress(RequestError):
    """The feed URL is not allowed."""

    code = "address_refused"


class FetchFailed(SluiceError):
    """The feed could not be fetched."""

    code = "fetch_failed"

    def __init__(self, message: str, status: int | None = None,
                 retry_after: timedelta | None = None) -> None:
        super().__init__(message)
        self.http_status = status
        self.retry_after = retry_after


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def refusal(address: str) -> str | None:
    """Why ``address`` may not be fetched from, or None when it is a public address."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for kind in ("loopback", "unspecified", "link_local", "multicast", "reserved", "private"):
        if getattr(ip, f"is_{kind}"):
            return kind.replace("_", "-")
    if not ip.is_global:
        return "not-global"
    return None


class AddressGuard:
    """Which URLs and addresses a fetch may reach."""

    def __init__(self, allow_hosts: Iterable[str] = (),
                 resolver: Resolver = system_resolver) -> None:
        self.allow_hosts = frozenset(h.strip().lower() for h in allow_hosts if h.strip())
        self.resolver = resolver

    def allowed_host(self, host: str, port: int | None = None) -> bool:
        host = host.lower().strip("[]")
        return host in self.allow_hosts or (port is not None
                                            and f"{host}:{port}" in self.allow_hosts)

    def check_url(self, url: str, *, resolve: bool = False) -> None:
        """Refuse a URL that is not http(s), has no host, or names a refused address.

        Host names are resolved (and their addresses checked) only with ``resolve``;
        every connection checks them anyway.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise RefusedAddress(f"only http and https feed URLs are allowed: {url!r}",
                                 field="url")
        if not parts.hostname:
            raise RefusedAddress(f"the feed URL has no host: {url!r}", field="url")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise RefusedAddress(f"the feed URL has a bad port: {url!r}", field="url") from None
        if self.allowed_host(parts.hostname, port):
            return
        try:
            ipaddress.ip_address(parts.hostname)
        except ValueError:
            if parts.hostname.rstrip(".").endswith("localhost") or parts.hostname == "localhost":
                raise RefusedAddress(f"{parts.hostname} is loopback", field="url") from None
            if resolve:
                self.addresses(parts.hostname, port)
            return
        self.addresses(parts.hostname, port)

    def addresses(self, host: str, port: int) -> list[str]:
        """The addresses to connect to for ``host``; refused if any of them is not public."""
        try:
            found = [host.strip("[]")] if _is_ip(host) else self.resolver(host, port)
        except OSError as exc:
            raise FetchFailed(f"cannot resolve {host}: {exc}") from exc
        if not found:
            raise FetchFailed(f"{host} has no address")
        if self.allowed_host(host, port):
            return found
        for address in found:
            why = refusal(address)
            if why is not None:
                named = host if address == host else f"{host} resolves to {address}, which"
                raise RefusedAddress(f"{named} is a {why} address; refused "
                                     "(SLUICE_FEED_ALLOW_HOSTS lists exceptions)", field="url")
        return found


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


class GuardedBackend(httpcore.SyncBackend):
    """Connects only to addresses the guard accepted, to the very address it checked."""

    def __init__(self, guard: AddressGuard) -> None:
        self.guard = guard

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        address = self.guard.addresses(host, port)[0]
        return super().connect_tcp(address, port, timeout=timeout, local_address=local_address,
                                   socket_options=socket_options)


class GuardedTransport(httpx.HTTPTransport):
    def __init__(self, guard: AddressGuard, limits: httpx.Limits) -> None:
        # never through an env proxy; the process's context, not a CA load per client
        super().__init__(trust_env=False, limits=limits, verify=tls_context(trust_env=False))
        self._pool = httpcore.ConnectionPool(
            ssl_context=tls_context(trust_env=False),
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(guard))


def feed_client(guard: AddressGuard, *, timeout_s: float, max_connections: int) -> httpx.Client:
    limits = httpx.Limits(max_connections=max_connections,
                          max_keepalive_connections=max_connections)
    return httpx.Client(transport=GuardedTransport(guard, limits), timeout=timeout_s,
                        follow_redirects=False, trust_env=False,
                        headers={"user-agent": USER_AGENT, "accept": ACCEPT,
                                 "accept-encoding": "gzip, deflate"})


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


class Fetcher:
    def __init__(self, client: httpx.Client, *, timeout_s: float, max_bytes: int,
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
        host = (urlsplit(url).hostname or "").lower()
        with self._hosts_lock:
            slot = self._hosts.get(host)
            if slot is None:
                slot = self._hosts[host] = threading.BoundedSemaphore(self.per_host)
            return slot

    def fetch(self, source: Source, now: datetime, deadline_at: float) -> Fetched:
        """Fetch and parse one source; every failure is a result, never an exception."""
        try:
            return self._fetch(source, now, deadline_at)
        except FetchFailed as exc:
            return self._failed(source, now, str(exc), exc.http_status, exc.retry_after)
        except RefusedAddress as exc:
            return self._failed(source, now, f"refused: {exc.message}", None, None)
        except httpx.TimeoutException as exc:
            return self._failed(source, now, f"timed out: {type(exc).__name__}", None, None)
        except httpx.HTTPError as exc:
            return self._failed(source, now, f"{type(exc).__name__}: {exc}", None, None)
        except SluiceError as exc:  # FeedParseError
            return self._failed(source, now, exc.message, 200, None)

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
            remaining = stop_at - self.monotonic()
            if remaining <= 0:
                raise FetchFailed("timed out: the build deadline passed")
            with self._host_slot(url), self.client.stream(
                    "GET", url, headers=headers, timeout=remaining) as response:
                if response.status_code in REDIRECTS and response.headers.get("location"):
                    url = urljoin(url, response.headers["location"])
                    if urlsplit(url).scheme not in ("http", "https"):
                        raise RefusedAddress(f"redirect to a non-http(s) URL: {url!r}")
                    continue
                if response.status_code == 304:
                    response.read()  # nothing to read; lets the connection go back to the pool
                    return Fetched(FetchState(ok=True, status=304, etag=source.etag,
                                              last_modified=source.last_modified), None, 0,
                                   not_modified=True)
                if response.status_code >= 400:
                    wait = (retry_after(response.headers.get("retry-after"), now)
                            if response.status_code in RETRY_AFTER_STATUSES else None)
                    raise FetchFailed(f"HTTP {response.status_code}", response.status_code, wait)
                body = self._read(response, stop_at)
                stories = parse_feed(body, source.id, base_url=str(response.url))
                return Fetched(FetchState(ok=True, status=response.status_code,
                                          etag=response.headers.get("etag"),
                                          last_modified=response.headers.get("last-modified")),
                               stories, len(body))
        raise FetchFailed(f"more than {self.max_redirects} redirects")

    def _read(self, response: httpx.Response, stop_at: float) -> bytes:
        declared = response.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            raise FetchFailed(f"the feed is {declared} bytes, over the {self.max_bytes} limit",
                              response.status_code)
        chunks, size = [], 0
        for chunk in response.iter_bytes():  # decoded: the cap also stops a gzip bomb
            size += len(chunk)
            if size > self.max_bytes:
                raise FetchFailed(f"the feed is over the {self.max_bytes} byte limit",
                                  response.status_code)
            if self.monotonic() > stop_at:
                raise FetchFailed("timed out while reading the feed")
            chunks.append(chunk)
        return b"".join(chunks)
