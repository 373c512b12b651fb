"""The SSRF guard, proved without sending traffic anywhere: the address check itself, a
stub resolver that maps test names to private, link-local and metadata addresses, and a
fetch through the guarded transport that is refused before any connection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from sluice.egress import AddressGuard, DestinationRefused, refusal
from sluice.rss.fetch import Backoff, Fetcher, feed_client, retry_after
from sluice.rss.store import Source

NOW = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)
NAMES = {"metadata.test": ["169.254.169.254"], "intranet.test": ["10.1.2.3"],
         "router.test": ["192.168.0.1"], "mixed.test": ["93.184.216.34", "172.16.4.4"],
         "group.test": ["239.1.1.1"], "v6-local.test": ["fe80::1"],
         "public.test": ["93.184.216.34"], "loop.test": ["127.0.0.1"]}


def stub_resolver(host: str, port: int) -> list[str]:
    if host not in NAMES:
        raise OSError(f"unknown test name {host}")
    return NAMES[host]


@pytest.mark.parametrize(("address", "why"), [
    ("127.0.0.1", "loopback"), ("127.0.0.2", "loopback"), ("::1", "loopback"),
    ("10.0.0.1", "private"), ("172.16.0.1", "private"), ("192.168.1.1", "private"),
    ("169.254.169.254", "link-local"), ("fe80::1", "link-local"),
    ("224.0.0.1", "multicast"), ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"),
    ("240.0.0.1", "reserved"), ("::ffff:10.0.0.1", "private"),
    ("::ffff:169.254.169.254", "link-local"), ("100.64.0.1", "not-global"),
    ("fd00::1", "private"),
])
def test_non_public_addresses_are_refused(address: str, why: str) -> None:
    assert refusal(address) == why


@pytest.mark.parametrize("address", ["93.184.216.34", "1.1.1.1", "2606:4700:4700::1111"])
def test_public_addresses_pass(address: str) -> None:
    assert refusal(address) is None


@pytest.mark.parametrize("host", ["metadata.test", "intranet.test", "router.test",
                                  "mixed.test", "group.test", "v6-local.test", "loop.test"])
def test_a_name_resolving_to_any_refused_address_is_refused(host: str) -> None:
    guard = AddressGuard(resolver=stub_resolver)
    with pytest.raises(DestinationRefused, match="not a public address") as caught:
        guard.addresses(host, 80)
    assert caught.value.status == 400 and caught.value.context["field"] == "url"
    assert not any(a in caught.value.message for a in NAMES[host]), "names no address"
    assert guard.addresses("public.test", 443) == ["93.184.216.34"]


@pytest.mark.parametrize("url", ["ftp://public.test/feed", "file:///etc/passwd",
                                 "gopher://public.test/", "http://", "http://localhost/feed",
                                 "http://169.254.169.254/latest/meta-data/",
                                 "http://[::1]:8080/feed", "https://10.0.0.8/rss",
                                 "http://public.test:99999/"])
def test_check_url_refuses_bad_schemes_and_addresses(url: str) -> None:
    with pytest.raises(DestinationRefused):
        AddressGuard(resolver=stub_resolver).check_url(url)


def test_check_url_resolves_names_only_when_asked() -> None:
    guard = AddressGuard(resolver=stub_resolver)
    guard.check_url("https://metadata.test/feed")  # the connection checks it
    with pytest.raises(DestinationRefused):
        guard.check_url("https://metadata.test/feed", resolve=True)
    guard.check_url("https://public.test/feed", resolve=True)


def test_allowed_hosts_skip_the_check_by_name_or_name_and_port() -> None:
    guard = AddressGuard(["127.0.0.1", "loop.test:8080"], resolver=stub_resolver)
    guard.check_url("http://127.0.0.1:1234/feed")
    assert guard.addresses("loop.test", 8080) == ["127.0.0.1"]
    with pytest.raises(DestinationRefused):
        guard.addresses("loop.test", 8081)
    with pytest.raises(DestinationRefused):
        guard.check_url("http://127.0.0.2:1234/feed")


def _source(url: str) -> Source:
    return Source(id="s", url=url, title=None, is_global=False, etag=None, last_modified=None,
                  last_fetched_at=None, last_success_at=None, last_status=None, last_error=None,
                  consecutive_failures=2, next_attempt_at=None, created_at=NOW)


@pytest.mark.parametrize("host", ["metadata.test", "intranet.test", "169.254.169.254",
                                  "10.9.9.9"])
def test_a_fetch_is_refused_before_connecting_and_recorded_with_backoff(host: str) -> None:
    guard = AddressGuard(resolver=stub_resolver)
    with feed_client(guard, timeout_s=1, max_connections=2) as client:
        fetched = Fetcher(client, timeout_s=1, max_bytes=1000, max_redirects=2).fetch(
            _source(f"http://{host}/latest/meta-data/"), NOW, deadline_at=float("inf"))
    assert not fetched.state.ok and fetched.stories is None
    assert fetched.state.error is not None and fetched.state.error.startswith("refused:")
    assert fetched.state.next_attempt_at == NOW + timedelta(minutes=20)  # third failure


def test_backoff_doubles_to_a_cap_and_never_gives_up() -> None:
    backoff = Backoff()
    schedule = [backoff.delay(n) for n in range(12)]
    assert schedule[:5] == [timedelta(0), timedelta(minutes=5), timedelta(minutes=10),
                            timedelta(minutes=20), timedelta(minutes=40)]
    assert schedule[-1] == timedelta(days=1) and backoff.delay(10_000) == timedelta(days=1)
    assert backoff.next_attempt(1, NOW, timedelta(hours=2)) == NOW + timedelta(hours=2)
    assert backoff.next_attempt(1, NOW, timedelta(days=9)) == NOW + timedelta(days=1)


def test_retry_after_as_seconds_or_a_date() -> None:
    assert retry_after("120", NOW) == timedelta(seconds=120)
    assert retry_after("Mon, 05 Jan 2026 10:00:00 GMT", NOW) == timedelta(hours=1)
    assert retry_after("soon", NOW) is None and retry_after(None, NOW) is None


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5000, "99999999999999", "nan", "-5", "1e12"])
def test_a_hostile_retry_after_is_no_answer_never_an_error(value: str) -> None:
    assert retry_after(value, NOW) is None


def test_a_retry_after_past_the_backoffs_cap_is_held_to_it() -> None:
    assert retry_after("999999999", NOW) == timedelta(days=1)
