"""A local feed publisher on 127.0.0.1: RSS 2.0 and Atom 1.0 feeds with ETag and
Last-Modified (answering 304 to a matching conditional request), gzip when asked, and
the misbehaving ones a fetcher must survive:

  /malformed        not XML at all
  /slow             answers after ``slow_s`` seconds (past a short fetch timeout)
  /huge             a valid feed larger than a small size cap
  /loop             redirects to itself, forever
  /to-private       redirects to 127.0.0.2, a loopback address that is not allowed
  /limited          429 with Retry-After: 3600

``on_request[path]`` is called before a feed at ``path`` is answered (a fault to cause at
that moment). ``hits`` counts requests per path; ``conditional`` counts the ones that carried
If-None-Match or If-Modified-Since. A feed's ``gzip_members`` above 1 sends its gzip body
as that many members one after another (RFC 1952 allows it; ``gzip a b > c`` makes one).
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Self
from xml.sax.saxutils import escape

from tests.providers.http import ProviderServer

EPOCH = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


def rss_document(name: str, items: int, *, start: int = 0, summary_words: int = 40,
                 link_host: str = "news.example") -> bytes:
    entries = []
    for i in range(start, start + items):
        when = format_datetime(EPOCH + timedelta(minutes=i))
        words = " ".join(f"word{(i * 7 + w) % 97}" for w in range(summary_words))
        entries.append(
            f"<item><title>{escape(name)} story {i}</title>"
            f"<link>https://{link_host}/{name}/{i}?utm_source=rss</link>"
            f"<guid isPermaLink=\"false\">{name}-{i}</guid><pubDate>{when}</pubDate>"
            f"<description>{escape(f'<p>{words}</p><script>alert({i})</script>')}</description>"
            "</item>")
    return (f"<?xml version=\"1.0\" encoding=\"utf-8\"?><rss version=\"2.0\"><channel>"
            f"<title>{escape(name)}</title><link>https://{link_host}/{name}</link>"
            f"<description>feed {escape(name)}</description>{''.join(entries)}"
            "</channel></rss>").encode()


def atom_document(name: str, items: int, *, start: int = 0) -> bytes:
    entries = []
    for i in range(start, start + items):
        when = (EPOCH + timedelta(minutes=i)).isoformat().replace("+00:00", "Z")
        entries.append(
            f"<entry><title>{escape(name)} entry {i}</title>"
            f"<link rel=\"alternate\" href=\"https://atom.example/{name}/{i}#top\"/>"
            f"<id>urn:{name}:{i}</id><updated>{when}</updated>"
            f"<summary type=\"html\">{escape(f'<b>bold {i}</b><img src=x onerror=alert(1)>')}"
            "</summary></entry>")
    return (f"<?xml version=\"1.0\" encoding=\"utf-8\"?>"
            f"<feed xmlns=\"http://www.w3.org/2005/Atom\"><title>{escape(name)}</title>"
            f"<id>urn:{name}</id><updated>{EPOCH.isoformat().replace('+00:00', 'Z')}</updated>"
            f"{''.join(entries)}</feed>").encode()


class Feed:
    def __init__(self, body: bytes, content_type: str = "application/rss+xml") -> None:
        self.set(body)
        self.content_type = content_type
        self.gzip_members = 1

    def set(self, body: bytes) -> None:
        self.body = body
        self.version = getattr(self, "version", 0) + 1
        self.etag = f'"v{self.version}-{len(body)}"'
        self.last_modified = format_datetime(EPOCH + timedelta(hours=self.version), usegmt=True)


class FeedServer:
    def __init__(self, *, slow_s: float = 3.0, huge_bytes: int = 300_000) -> None:
        self.feeds: dict[str, Feed] = {}
        self.hits: Counter[str] = Counter()
        self.conditional: Counter[str] = Counter()
        self.on_request: dict[str, Callable[[], None]] = {}
        self.bytes_served = 0
        self.slow_s = slow_s
        self._lock = threading.Lock()
        self.http = ProviderServer(self._handle)
        # Headers and body go out as two writes; without TCP_NODELAY a kept-alive
        # connection waits for a delayed ACK between them (~40 ms), which no real server does.
        self.http.server.RequestHandlerClass.disable_nagle_algorithm = True  # type: ignore[attr-defined]
        self.huge = rss_document("huge", max(1, huge_bytes // 400))

    @property
    def url(self) -> str:
        return self.http.url

    @property
    def port(self) -> int:
        return int(self.http.server.server_address[1])

    def add_rss(self, path: str, items: int = 5, **kwargs: object) -> str:
        self.feeds[path] = Feed(rss_document(path.strip("/").replace("/", "-"), items,
                                             **kwargs))  # type: ignore[arg-type]
        return self.url + path

    def add_atom(self, path: str, items: int = 5) -> str:
        self.feeds[path] = Feed(atom_document(path.strip("/"), items), "application/atom+xml")
        return self.url + path

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        with self._lock:
            self.hits[path] += 1
            if "if-none-match" in headers or "if-modified-since" in headers:
                self.conditional[path] += 1
        if path == "/malformed":
            return 200, {"content-type": "application/rss+xml"}, b"<html><body>oops</body"
        if path == "/slow":
            time.sleep(self.slow_s)
            return 200, {"content-type": "application/rss+xml"}, rss_document("slow", 1)
        if path == "/huge":
            return 200, {"content-type": "application/rss+xml"}, self.huge
        if path == "/loop":
            return 302, {"location": "/loop"}, b""
        if path == "/to-private":
            return 302, {"location": f"http://127.0.0.2:{self.port}/rss"}, b""
        if path == "/limited":
            return 429, {"retry-after": "3600"}, b"slow down"
        if path in self.on_request:
            self.on_request[path]()
        feed = self.feeds.get(path)
        if feed is None:
            return 404, {}, b"not found"
        if headers.get("if-none-match") == feed.etag or (
                "if-none-match" not in headers
                and headers.get("if-modified-since") == feed.last_modified):
            return 304, {"etag": feed.etag, "last-modified": feed.last_modified}, b""
        out = feed.body
        extra = {}
        if "gzip" in headers.get("accept-encoding", ""):
            step = -(-len(out) // feed.gzip_members)
            out = b"".join(gzip.compress(out[i:i + step], compresslevel=1)
                           for i in range(0, len(out), step))
            extra["content-encoding"] = "gzip"
        with self._lock:
            self.bytes_served += len(out)
        return 200, {"content-type": feed.content_type, "etag": feed.etag,
                     "last-modified": feed.last_modified, **extra}, out

    def __enter__(self) -> Self:
        self.http.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.__exit__(*exc)
