"""Feed documents to normalised stories: feedparser reads RSS and Atom, nh3 sanitises.

A story's title is plain text: whatever markup either reader hands over is removed by
nh3 with no tag allowed (the text kept, scripts and styles dropped) and its entities
decoded once. The summary is the one HTML field, cleaned to a small allow-list.

Plain RSS 2.0 is read by ``sluice.rss.plainrss`` instead, with exactly feedparser's
result in a tenth of its time; anything else goes to feedparser.

A story's id is stable across fetches and publishers: the hash of its canonical
link (scheme and host lower-cased, fragment and tracking parameters dropped),
else of its GUID, else of its title within its source.
"""

from __future__ import annotations

import calendar
import hashlib
import html
import io
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import feedparser  # type: ignore[import-untyped]
import nh3

from sluice.core.errors import SluiceError
from sluice.rss import plainrss
from sluice.rss.store import Story

SUMMARY_MAX_CHARS = 2000
TITLE_MAX_CHARS = 500
LINK_MAX_CHARS = 2048  # as a source's URL: a longer link is dropped, not stored
ALLOWED_TAGS = {"a", "p", "br", "b", "strong", "i", "em", "u", "ul", "ol", "li", "blockquote",
                "code", "pre", "h1", "h2", "h3", "h4", "span", "img", "figure", "figcaption"}
ALLOWED_ATTRIBUTES = {"a": {"href", "title"}, "img": {"src", "alt", "title"}}
URL_SCHEMES = {"http", "https", "mailto"}
_TRACKING = ("utm_", "fbclid", "gclid", "mc_cid", "mc_eid")


class FeedParseError(SluiceError):
    """The document is not a feed."""

    code = "feed_unparseable"


def canonical_link(link: str) -> str | None:
    """The link with scheme and host lower-cased, no fragment, no tracking parameters, and
    the ASCII characters a URL may not hold raw (``<``, ``>``, ``"``, a space, controls, …)
    percent-encoded in its path and query, so the stored link is plain text that no HTML
    parser reads a tag or an attribute's end in. A host holding one is no link (None)."""
    parts = urlsplit(link.strip())
    if (parts.scheme.lower() not in ("http", "https") or not parts.netloc
            or any(char in _NOT_IN_URL for char in parts.netloc)):
        return None
    query = urlencode([(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True)
                       if not k.lower().startswith(_TRACKING)])
    path = parts.path.translate(_ENCODED) or "/"
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, query, ""))


# RFC 3986's excluded ASCII: controls, space, and the delimiters no URL carries raw; other
# characters (non-ASCII ones included) are kept as the feed wrote them.
_NOT_IN_URL = frozenset(map(chr, range(0x21))) | set('"<>\\^`{|}\x7f')
_ENCODED = {ord(char): f"%{ord(char):02X}" for char in _NOT_IN_URL}


def story_id(link: str | None, guid: str | None, title: str, source_id: str) -> str:
    basis = (f"link:{link}" if link else f"guid:{guid}" if guid
             else f"title:{source_id}:{title}")
    return hashlib.sha256(basis.encode()).hexdigest()[:32]


def sanitise(html: str) -> str:
    return nh3.clean(html[:SUMMARY_MAX_CHARS * 2], tags=ALLOWED_TAGS,
                     attributes=ALLOWED_ATTRIBUTES, url_schemes=URL_SCHEMES,
                     link_rel="noopener noreferrer nofollow")[:SUMMARY_MAX_CHARS]


def plain_text(value: str, max_chars: int) -> str:
    """``value`` read as HTML and given back as text on one line: tags removed (the text of
    elements kept, that of scripts and styles dropped) and entities decoded once. Markup
    the decoding reveals (``&amp;lt;b&amp;gt;``) is removed too, its entities left as
    they are, so no HTML parser finds a tag in what is stored."""
    text = _untagged(value[:max_chars * 4])
    for _ in range(_PASSES):
        again = _untagged(text.replace("&", "&amp;"))
        if again == text:
            break
        text = again
    else:  # markup nested to hide from each pass: what is left of it goes
        text = text.replace("<", "")
    return " ".join(text.split())[:max_chars]


_PASSES = 4


def _untagged(markup: str) -> str:
    # nh3 escapes the text it gives back; undoing that is not a second decoding
    return html.unescape(nh3.clean(markup, tags=set(), attributes={}))


def _published(entry: Any) -> datetime | None:
    parsed = entry.get("published_parsed")
    if not parsed and "updated_parsed" in entry:  # ``in``: no deprecated published fallback
        parsed = entry["updated_parsed"]
    if not parsed:
        return None
    return datetime.fromtimestamp(calendar.timegm(parsed), UTC)


def parse_feed(body: bytes, source_id: str, *, base_url: str = "") -> list[Story]:
    """Stories of one feed document, in document order. Raises ``FeedParseError`` when the
    document yields no feed at all (a well-formed feed with no items is an empty list)."""
    entries: list[Any] | None = plainrss.entries(body, base_url)  # plain RSS 2.0, fast
    if entries is None:
        # A stream, never a string: feedparser would fetch a string that looks like a URL.
        parsed = feedparser.parse(io.BytesIO(body), sanitize_html=False,
                                  resolve_relative_uris=False,
                                  response_headers={"content-location": base_url,
                                                    "content-type": "application/xml"})
        if not parsed.get("version") and not parsed.entries:
            raise FeedParseError(
                f"not an RSS or Atom document: {parsed.get('bozo_exception')}")
        entries = parsed.entries
    stories = []
    for entry in entries:
        title = plain_text(str(entry.get("title") or ""), TITLE_MAX_CHARS)
        raw_link = entry.get("link") or ""
        link = canonical_link(raw_link) if 0 < len(raw_link) <= LINK_MAX_CHARS else None
        guid = entry.get("id") or None
        if not (title or link):
            continue
        summary = entry.get("summary") or ""
        if not summary and entry.get("content"):
            summary = entry["content"][0].get("value", "")
        stories.append(Story(id=story_id(link, guid, title, source_id), title=title or link or "",
                             link=link, published_at=_published(entry),
                             summary=sanitise(summary), source_id=source_id))
    return stories
