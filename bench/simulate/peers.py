"""The peers, in process: feeds, a Telegram and a Slack API, webhook receivers.

Every outbound HTTP request Sluice makes goes through ``httpx.HTTPTransport``; the
simulation replaces its ``handle_request`` with ``Network.handle``, so the real
adapters, fetcher and clients run unchanged and no packet leaves the process. A request
to anything but the simulated hosts (all on 127.0.0.1) is refused without dialling.

Each peer follows a behaviour that changes over time (``Peer.windows``):

- ``up``: answers at once;
- ``down``: the connection is refused (nothing arrived);
- ``late``: accepts and records the message, then answers after the client's read
  timeout: the caller sees a timeout, the message was delivered, and the wait costs
  simulated time;
- ``ratelimit``: 429 with ``Retry-After`` saying when to come back, as Telegram's
  ``retry_after`` and Slack's header do: the time left in the window, at most an hour;
- ``refuse``: refuses permanently (chat not found, 410 Gone): Sluice disables the
  destination, and the simulated operator enables it once it answers again;
- ``paused`` (``--limits`` only): the peer is up, and the simulated operator pauses the
  destination in Sluice for the window: nothing may reach it meanwhile (``pause_kept``);
- ``error`` (destinations, ``--limits`` only: an answered outage): answers 500 to every
  request, so several entries fail at one receiver before any success;
- ``hang`` (destinations, ``--limits`` only): accepts the connection and the request, then
  never answers: the caller sees a timeout, as after ``late``, but the message was *not*
  taken (a gateway that stalls before its application): an unknown outcome that did not
  arrive, which only the documented resends can still deliver;
- for feeds also ``malformed`` (a body that is not a feed), ``vanished`` (404) and
  ``slow`` (times out, nothing read); Polar also ``error`` (500 for the whole window).

What the receivers got is the evidence the invariants judge (``Receipt``).
"""

from __future__ import annotations

import base64
import bisect
import hashlib
import hmac
import json
import math
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from email.utils import format_datetime
from typing import Any, NamedTuple, Self
from xml.sax.saxutils import escape

import httpx

from bench.simulate.hosts import hook_host, is_hook_host
from bench.simulate.pacing import Request

FEEDS = "127.0.0.1:7001"
TELEGRAM = "127.0.0.1:7002"
SLACK = "127.0.0.1:7003"
POLAR = "127.0.0.1:7005"
STORY = re.compile(r"story-(\d+)")
PART = re.compile(r"\[part (\d+) of \d+\]")  # a paragraph of a message sent in chunks
RETRY_AFTER_MAX_S = 3600
FEED_ITEMS = 12  # a feed shows its newest stories, like real ones do


class Window(NamedTuple):
    start: datetime
    end: datetime
    kind: str


@dataclass
class Peer:
    name: str
    windows: list[Window] = field(default_factory=list)

    def behaviour(self, now: datetime) -> str:
        window = self.window(now)
        return window.kind if window else "up"

    def window(self, now: datetime) -> Window | None:
        for window in self.windows:
            if window.start <= now < window.end:
                return window
        return None


class FeedStory(NamedTuple):
    number: int
    published: datetime
    words: tuple[str, ...]


@dataclass
class Feed(Peer):
    stories: list[FeedStory] = field(default_factory=list)
    _times: list[datetime] = field(default_factory=list, repr=False, compare=False)
    _changes: list[datetime] = field(default_factory=list, repr=False, compare=False)

    def visible(self, now: datetime) -> list[FeedStory]:
        """The newest ``FEED_ITEMS`` stories published by ``now`` (stories are in order)."""
        if len(self._times) != len(self.stories):
            self._times = [s.published for s in self.stories]
        shown = bisect.bisect_right(self._times, now)
        return self.stories[max(0, shown - FEED_ITEMS):shown]

    def next_change(self, after: datetime) -> datetime | None:
        """The first moment after ``after`` at which this feed answers differently: a story
        published, a fault window beginning or ending."""
        if len(self._changes) != len(self.stories) + 2 * len(self.windows):
            self._changes = sorted([s.published for s in self.stories]
                                   + [w.start for w in self.windows]
                                   + [w.end for w in self.windows])
        found = bisect.bisect_right(self._changes, after)
        return self._changes[found] if found < len(self._changes) else None

    def etag(self, now: datetime) -> str:
        shown = self.visible(now)
        return f'"{shown[-1].number if shown else 0}-{len(shown)}"'

    def body(self, now: datetime) -> bytes:
        items = "".join(
            f"<item><title>{escape(title_of(s))}</title>"
            f"<link>http://{FEEDS}/{self.name}/story-{s.number}</link>"
            f"<guid>story-{s.number}</guid><pubDate>{format_datetime(s.published)}</pubDate>"
            f"<description>{escape(' '.join(s.words))}</description></item>"
            for s in reversed(self.visible(now)))
        return (f'<?xml version="1.0"?><rss version="2.0"><channel><title>{self.name}</title>'
                f"<link>http://{FEEDS}/</link><description>sim</description>{items}"
                "</channel></rss>").encode()


def title_of(story: FeedStory) -> str:
    return f"Report story-{story.number}: {' '.join(story.words)}"


class Receipt(NamedTuple):
    at: datetime
    channel: str
    recipient: str
    story: int
    key: str | None  # the webhook's Idempotency-Key
    late: bool  # the sender saw a timeout for this one
    text: str = ""  # what the receiver got (a webhook: its payloads, as JSON)


class Network:
    """Routes every request to its peer; records what the receivers accepted."""

    def __init__(self, now: Callable[[], datetime], sleep: Callable[[float], None]) -> None:
        self.now = now
        self.sleep = sleep
        self.feeds: dict[str, Feed] = {}
        self.destinations: dict[str, Peer] = {}  # "telegram:<chat>", "slack:<chan>", "webhook:<n>"
        self.receipts: list[Receipt] = []
        self.on_receipt: Callable[[Receipt], None] = lambda receipt: None
        # every request to a destination, whatever its answer (pacing.py judges them)
        self.on_request: Callable[[Request], None] = lambda request: None
        self.requests = 0
        self.refused_hosts: list[str] = []
        self.hook_keys: set[str] = set()
        # what a receiver verifying Standard Webhooks refused (its own check, not Sluice's)
        self.hook_secret = b""
        self.unsigned: list[str] = []
        self.refusals: set[tuple[str, str, int]] = set()  # matches a destination refused
        # matches a receiver answers 500 to (that entry only: a poison entry)
        self.poison: set[tuple[str, str, int]] = set()
        self.rejected: set[tuple[str, str, int]] = set()  # refused for good (422), alone
        self.oom: set[tuple[str, str, int]] = set()  # the sender runs out of memory, once
        self.receipts_of: dict[tuple[str, str, int], list[Receipt]] = {}
        # a chunked message's parts each receiver has (``[part k of m]`` paragraphs)
        self.parts: dict[tuple[str, str, int], set[int]] = {}
        self.polar = Peer("polar")
        self.polar_ids: Counter[str] = Counter()  # external_id -> times Polar accepted it
        self.on_polar: Callable[[dict[str, Any]], None] = lambda event: None
        # every request to Polar, with how it was answered (billing.py's metering_paced)
        self.on_polar_request: Callable[[str], None] = lambda answer: None
        # the events Polar's validation refuses for good (their external ids), and each
        # request that carried one (billing.py's refused_for_good)
        self.polar_refuses: set[str] = set()
        self.on_polar_refused: Callable[[str], None] = lambda external_id: None

    # --- the transport seam -------------------------------------------------------

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        host = f"{request.url.host}:{request.url.port}"
        if host == FEEDS:
            return self._feed(request)
        if host == TELEGRAM:
            body = json.loads(request.content)
            return self._chat(request, "telegram", str(body["chat_id"]), body["text"], None)
        if host == SLACK:
            body = json.loads(request.content)
            return self._chat(request, "slack", str(body["channel"]), body["text"], None)
        if host == POLAR:
            return self._polar(request)
        if is_hook_host(host):
            hook = request.url.path.strip("/")
            if not re.fullmatch(r"hook-\d+-\d+", hook) or hook_host(hook) != host:
                return httpx.Response(404, text="no such hook here", request=request)
            if not self._signed(request):
                self.unsigned.append(f"{request.url.path} ({request.headers.get('webhook-id')})")
                return httpx.Response(401, text="bad signature", request=request)
            body = json.loads(request.content)
            text = json.dumps(body.get("payloads"))
            return self._chat(request, "webhook", hook, text,
                              request.headers.get("idempotency-key"))
        # Never dialled: the simulation has no network.
        self.refused_hosts.append(host)
        raise httpx.ConnectError(f"simulated network: no route to {host}", request=request)

    def _signed(self, request: httpx.Request) -> bool:
        """The Standard Webhooks check a receiver makes (standardwebhooks.com): a ``v1``
        base64 HMAC-SHA256 of ``<id>.<timestamp>.<body>`` under the shared secret, the
        timestamp within five minutes of now, and the id the idempotency key sent."""
        msg_id = request.headers.get("webhook-id", "")
        stamp = request.headers.get("webhook-timestamp", "")
        if not msg_id or not stamp.isdigit() or msg_id != request.headers.get("idempotency-key"):
            return False
        if abs(self.now().timestamp() - int(stamp)) > 300:
            return False
        mac = hmac.new(self.hook_secret, f"{msg_id}.{stamp}.".encode() + request.content,
                       hashlib.sha256)
        expected = "v1," + base64.b64encode(mac.digest()).decode()
        return any(hmac.compare_digest(expected, offered)
                   for offered in request.headers.get("webhook-signature", "").split())

    # --- feeds --------------------------------------------------------------------

    def _feed(self, request: httpx.Request) -> httpx.Response:
        feed = self.feeds.get(request.url.path.strip("/").removesuffix(".xml"))
        now = self.now()
        kind = feed.behaviour(now) if feed else "vanished"
        if feed is None or kind == "vanished":
            return httpx.Response(404, text="gone", request=request)
        if kind == "down":
            raise httpx.ConnectError("simulated: connection refused", request=request)
        if kind == "slow":  # a fetch runs in a worker thread: no clock move (determinism)
            raise httpx.ReadTimeout("simulated: feed too slow", request=request)
        if kind == "ratelimit":
            return httpx.Response(429, headers={"retry-after": "600"}, request=request)
        if kind == "malformed":
            return httpx.Response(200, content=b"<html><body>not a feed</body>",
                                  headers={"content-type": "text/html"}, request=request)
        etag = feed.etag(now)
        if request.headers.get("if-none-match") == etag:  # as real feeds do: 304, no body
            return httpx.Response(304, headers={"etag": etag}, request=request)
        return httpx.Response(200, content=feed.body(now), request=request,
                              headers={"content-type": "application/rss+xml", "etag": etag})

    # --- Polar's event ingestion -------------------------------------------------

    def _polar(self, request: httpx.Request) -> httpx.Response:
        """``POST /v1/events/ingest``: events deduplicated on ``external_id``, as Polar does;
        ``error`` answers 500 for the whole window, ``late`` ingests and answers after the
        client's timeout. A request holding an event Polar refuses for good is refused
        whole (422, its validation's ``detail`` naming each such event, as FastAPI does):
        nothing of it is ingested."""
        kind = self.polar.behaviour(self.now())
        events = json.loads(request.content)["events"] if kind in ("up", "late") else []
        refused = [i for i, event in enumerate(events)
                   if str(event.get("external_id")) in self.polar_refuses]
        self.on_polar_request("refused" if refused else kind)
        if refused:
            for i in refused:
                self.on_polar_refused(str(events[i]["external_id"]))
            return httpx.Response(422, json={"detail": [
                {"loc": ["body", "events", i, "metadata", "total_tokens"],
                 "msg": "the meter refuses this value", "type": "value_error"}
                for i in refused]}, request=request)
        if kind == "down":
            raise httpx.ConnectError("simulated: connection refused", request=request)
        if kind == "ratelimit":
            return httpx.Response(429, headers={"retry-after": "60"}, json={"detail": "slow"},
                                  request=request)
        if kind == "error":
            return httpx.Response(500, text="internal error", request=request)
        inserted = 0
        for event in events:
            external_id = str(event["external_id"])
            inserted += external_id not in self.polar_ids
            self.polar_ids[external_id] += 1
            self.on_polar(event)
        if kind == "late":
            timeout = (request.extensions.get("timeout") or {}).get("read") or 10.0
            self.sleep(float(timeout))
            raise httpx.ReadTimeout("simulated: answered after the timeout", request=request)
        return httpx.Response(200, json={"inserted": inserted,
                                         "duplicates": len(events) - inserted},
                              request=request)

    # --- destinations -------------------------------------------------------------

    def _chat(self, request: httpx.Request, channel: str, recipient: str, text: str,
              key: str | None) -> httpx.Response:
        peer = self.destinations.get(f"{channel}:{recipient}")
        window = peer.window(self.now()) if peer else Window(self.now(), self.now(), "refuse")
        kind = window.kind if window else "up"
        if kind == "paused":  # held by Sluice, not by the peer: the peer answers as up
            kind = "up"
        match = STORY.search(text)
        story = int(match.group(1)) if match else -1
        found = (channel, recipient, story)
        if kind == "up" and found in self.oom:
            self.oom.discard(found)
            kind = "oom"
        elif kind == "up" and found in self.poison:
            kind = "error"
        elif kind == "up" and found in self.rejected:
            kind = "rejected"
        wait_s = None
        if kind in ("ratelimit", "ratelimit_long") and window is not None:
            left = (window.end - self.now()).total_seconds()
            cap = RETRY_AFTER_MAX_S if kind == "ratelimit" else 24 * 3600  # past the cap
            wait_s = max(1, min(cap, math.ceil(left)))
        # how long the client waits for the answer (the egress layer's timeout, cut to
        # the run's deadline when less is left)
        timeout = float((request.extensions.get("timeout") or {}).get("read") or 10.0)
        self.on_request(Request(self.now(), channel, recipient, story, kind, wait_s, timeout))
        if kind == "down":
            raise httpx.ConnectError("simulated: connection refused", request=request)
        if wait_s is not None:
            return _rate_limited(channel, request, wait_s)
        if kind == "refuse":
            self.refusals.add((channel, recipient, story))
            return _refused(channel, request)
        if kind == "oom":
            raise MemoryError("simulated: out of memory while sending")
        if kind == "error":
            return httpx.Response(500, text="internal error", request=request)
        if kind == "rejected":
            self.refusals.add(found)
            return httpx.Response(422, text="unprocessable: the receiver refuses this one",
                                  request=request)
        if kind == "hang":
            self.sleep(timeout)
            raise httpx.ReadTimeout("simulated: no answer (the message was not taken)",
                                    request=request)
        receipt = Receipt(self.now(), channel, recipient, story, key, kind == "late", text)
        parts = {int(p) for p in PART.findall(text)}
        if parts:
            self.parts.setdefault((channel, recipient, story), set()).update(parts)
        if parts and 1 not in parts:  # a further chunk of a message already received
            return _accepted(channel, recipient, len(self.receipts), request)
        if channel != "webhook" or key not in self.hook_keys:  # a receiver dedupes by key
            if key is not None:
                self.hook_keys.add(key)
            self.receipts.append(receipt)
            self.receipts_of.setdefault((channel, recipient, story), []).append(receipt)
            self.on_receipt(receipt)
        if kind == "late":
            self.sleep(timeout)
            raise httpx.ReadTimeout("simulated: answered after the timeout", request=request)
        return _accepted(channel, recipient, len(self.receipts), request)


def _accepted(channel: str, recipient: str, number: int, request: httpx.Request) -> httpx.Response:
    if channel == "telegram":
        return httpx.Response(200, json={"ok": True, "result": {"message_id": number}},
                              request=request)
    if channel == "slack":
        return httpx.Response(200, json={"ok": True, "channel": recipient, "ts": f"{number}.0"},
                              request=request)
    return httpx.Response(200, json={"id": f"hook-{number}"}, request=request)


def _rate_limited(channel: str, request: httpx.Request, wait_s: int) -> httpx.Response:
    if channel == "telegram":
        return httpx.Response(429, json={"ok": False, "error_code": 429,
                                         "description": f"Too Many Requests: retry after {wait_s}",
                                         "parameters": {"retry_after": wait_s}}, request=request)
    return httpx.Response(429, headers={"retry-after": str(wait_s)}, json={"ok": False},
                          request=request)


def _refused(channel: str, request: httpx.Request) -> httpx.Response:
    if channel == "telegram":
        return httpx.Response(400, json={"ok": False, "error_code": 400,
                                         "description": "Bad Request: chat not found"},
                              request=request)
    if channel == "slack":
        return httpx.Response(200, json={"ok": False, "error": "channel_not_found"},
                              request=request)
    return httpx.Response(410, text="gone", request=request)


class Installed:
    """``httpx.HTTPTransport.handle_request`` routed to ``network`` while installed, and
    botocore's sends refused (an AWS client the simulator did not replace would otherwise
    reach the real AWS, or not, as the machine's credentials and network allow): both are
    recorded in ``network.refused_hosts``, which the ``sealed`` invariant reads."""

    def __init__(self, network: Network) -> None:
        self.network = network
        self.saved: Any = None
        self.saved_send: Any = None

    def __enter__(self) -> Self:
        from botocore.endpoint import Endpoint

        self.saved_send = Endpoint._send
        refused = self.network.refused_hosts

        def send(endpoint: Any, request: Any) -> Any:
            refused.append(f"{endpoint.host} (botocore)")
            raise ConnectionError(f"simulated network: no route to {endpoint.host}")

        Endpoint._send = send
        self.saved = httpx.HTTPTransport.handle_request
        network = self.network

        def handle_request(_self: httpx.HTTPTransport, request: httpx.Request) -> httpx.Response:
            answer = network.handle(request)
            # a transport's answer is a stream (the egress layer reads it raw, decoding and
            # counting as it goes), not a body read already
            return httpx.Response(answer.status_code, headers=answer.headers,
                                  stream=httpx.ByteStream(answer.content), request=request)

        httpx.HTTPTransport.handle_request = handle_request  # type: ignore[method-assign,assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        from botocore.endpoint import Endpoint

        httpx.HTTPTransport.handle_request = self.saved  # type: ignore[method-assign]
        Endpoint._send = self.saved_send


def delay(now: datetime, hours: float) -> datetime:
    return now + timedelta(hours=hours)
