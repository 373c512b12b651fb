"""Misbehaving peers on 127.0.0.1: every request ends by its deadline, headers included, and
memory stays within the cap whatever the encoding chain (peak memory measured in a child
Python). Refused destinations are refused before any socket is opened."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from sluice.egress import (
    AddressGuard,
    Egress,
    NoAnswer,
    NotSent,
    TooLarge,
    UnsupportedEncoding,
)
from sluice.rss.fetch import Fetcher, feed_client
from sluice.rss.store import Source
from tests.providers.hostile import HostilePeer

DEADLINE_S = 1.0
SLACK_S = 3.0  # a busy two-core machine: generous, still far below "forever"
LOOPBACK = AddressGuard(["127.0.0.1"])


@pytest.fixture(scope="module")
def peer() -> Iterator[HostilePeer]:
    with HostilePeer(drip_s=0.05) as server:
        yield server


def timed(call: Any) -> tuple[Any, float]:
    started = time.monotonic()
    try:
        result: Any = call()
    except Exception as exc:  # noqa: BLE001 - returned for the assertion
        result = exc
    return result, time.monotonic() - started


@pytest.mark.parametrize("path", ["/trickle-headers", "/trickle-body", "/silent"])
def test_a_slow_peer_is_cut_off_at_the_clients_deadline(peer: HostilePeer, path: str) -> None:
    with Egress(timeout_s=DEADLINE_S, guard=LOOPBACK) as client:
        result, elapsed = timed(lambda: client.request("GET", peer.url + path, truncate=False))
    assert isinstance(result, NoAnswer), result
    assert result.sent, "the request went out: the outcome is unknown, not 'never sent'"
    assert DEADLINE_S * 0.9 <= elapsed < DEADLINE_S + SLACK_S


@pytest.mark.parametrize("path", ["/trickle-headers", "/silent"])
def test_the_callers_deadline_wins_over_a_longer_timeout(peer: HostilePeer, path: str) -> None:
    with Egress(timeout_s=30, guard=LOOPBACK) as client:
        result, elapsed = timed(lambda: client.request(
            "GET", peer.url + path, deadline=time.monotonic() + DEADLINE_S))
    assert isinstance(result, NoAnswer)
    assert elapsed < DEADLINE_S + SLACK_S


def test_a_body_trickled_after_the_status_is_cut_and_the_status_kept(peer: HostilePeer) -> None:
    with Egress(timeout_s=DEADLINE_S, guard=LOOPBACK) as client:
        answer, elapsed = timed(lambda: client.request("GET", peer.url + "/trickle-body"))
    assert answer.status == 200 and answer.cut == "deadline"
    assert elapsed < DEADLINE_S + SLACK_S


def test_a_deadline_already_gone_sends_nothing(peer: HostilePeer) -> None:
    before = dict(peer.hits)
    with Egress(timeout_s=5, guard=LOOPBACK) as client, pytest.raises(NotSent):
        client.request("GET", peer.url + "/silent", deadline=time.monotonic() - 0.1)
    assert peer.hits == before


def _source(url: str) -> Source:
    now = datetime(2026, 1, 5, tzinfo=UTC)
    return Source(id="s", url=url, title=None, is_global=False, etag=None, last_modified=None,
                  last_fetched_at=None, last_success_at=None, last_status=None, last_error=None,
                  consecutive_failures=0, next_attempt_at=None, created_at=now)


def test_a_feed_trickling_its_headers_fails_by_the_fetch_timeout_with_backoff(
        peer: HostilePeer) -> None:
    now = datetime(2026, 1, 5, tzinfo=UTC)
    with feed_client(LOOPBACK, timeout_s=DEADLINE_S, max_connections=2) as client:
        fetcher = Fetcher(client, timeout_s=DEADLINE_S, max_bytes=100_000, max_redirects=2)
        fetched, elapsed = timed(lambda: fetcher.fetch(
            _source(peer.url + "/trickle-headers"), now, deadline_at=time.monotonic() + 30))
    assert not fetched.state.ok and fetched.state.next_attempt_at > now
    assert elapsed < DEADLINE_S + SLACK_S


@pytest.fixture
def dials(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every socket connection attempted; anything off loopback is refused unsent."""
    seen: list[tuple[str, int]] = []
    real = socket.create_connection

    def recording(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        seen.append((str(address[0]), int(address[1])))
        if not str(address[0]).startswith("127."):
            raise AssertionError(f"a test tried to dial {address[0]}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", recording)
    return seen


@pytest.mark.parametrize("target", ["http://internal.test/latest/meta-data/",
                                    "http://169.254.169.254/latest/meta-data/",
                                    "http://[::ffff:10.0.0.1]/"])
def test_a_redirect_chain_to_an_internal_address_is_refused_without_dialling_it(
        peer: HostilePeer, dials: list[tuple[str, int]], target: str) -> None:
    resolved: list[str] = []

    def resolver(host: str, port: int) -> list[str]:
        resolved.append(host)
        return {"internal.test": ["10.0.0.1"]}[host]

    guard = AddressGuard(["127.0.0.1"], resolver=resolver)
    second = f"{peer.url}/redirect?to={target}"
    first = f"{peer.url}/redirect?to={second}"
    now = datetime(2026, 1, 5, tzinfo=UTC)
    with feed_client(guard, timeout_s=DEADLINE_S, max_connections=2) as client:
        fetched = Fetcher(client, timeout_s=DEADLINE_S, max_bytes=1000, max_redirects=5).fetch(
            _source(first), now, deadline_at=time.monotonic() + 10)
    assert (fetched.state.error or "").startswith("refused: the destination is ")
    assert "10.0.0.1" not in (fetched.state.error or "")
    assert {address for address, _ in dials} == {"127.0.0.1"}, "only the two loopback hops"
    assert len(dials) <= 2


CHILD = """
import json, sys
from sluice.egress import AddressGuard, Egress, EgressError

url, cap = sys.argv[1], int(sys.argv[2])
client = Egress(timeout_s=30, guard=AddressGuard(["127.0.0.1"]))
client.request("GET", url + "/warm-up")

def peak():
    # this process's own high-water mark in KiB: VmHWM belongs to the memory map exec made,
    # where ru_maxrss would start from the forking test worker's size and hide any growth
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

base = peak()
out = {}
for path, truncate in json.loads(sys.argv[3]):
    try:
        answer = client.request("GET", url + path, max_bytes=cap, truncate=truncate)
        outcome = f"{answer.cut or 'whole'} {len(answer.body)}"
    except EgressError as exc:
        outcome = type(exc).__name__
    out[path + (" truncate" if truncate else "")] = [outcome, peak() - base]
print(json.dumps(out))
"""


def test_memory_stays_within_the_cap_whatever_the_encoding_chain(peer: HostilePeer) -> None:
    cap = 1 << 20
    cases = [("/gzip-gzip", False), ("/gzip-bomb", False), ("/gzip-bomb", True),
             ("/huge", False), ("/huge-close", False), ("/huge-close", True)]
    child = subprocess.run([sys.executable, "-c", CHILD, peer.url, str(cap), json.dumps(cases)],
                           capture_output=True, text=True, timeout=90, check=True)
    results = json.loads(child.stdout)
    outcomes = {key: value[0] for key, value in results.items()}
    assert outcomes == {
        "/gzip-gzip": UnsupportedEncoding.__name__, "/gzip-bomb": TooLarge.__name__,
        "/gzip-bomb truncate": f"cap {cap}", "/huge": TooLarge.__name__,
        "/huge-close": TooLarge.__name__, "/huge-close truncate": f"cap {cap}"}
    # 64 MiB of zeros behind each bomb, 30 MB behind each huge body: the peak grows by the
    # cap and a constant (buffers, one raw chunk), never by what the peer had to offer
    limit_kib = cap // 1024 + 16 * 1024
    assert all(grown <= limit_kib for _, grown in results.values()), results
