"""The plain RSS 2.0 reader gives exactly feedparser's reading, or declines.

Generated documents mix what real feeds carry (entities, CDATA, comments, relative and
absolute links, permalink and plain guids, every order of the fields, channel elements,
mis-decoded UTF-8 and windows-1252 code points, dates in and out of RFC 822) with what
they should not; whatever the fast reader accepts must equal feedparser field by field,
and ``parse_feed`` must give the same stories either way.
"""

from __future__ import annotations

import io
from typing import Any
from xml.sax.saxutils import escape

import feedparser  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.rss import parse as parse_module
from sluice.rss import plainrss
from sluice.rss.parse import parse_feed
from tests.providers.feeds import rss_document

FIELDS = ("title", "link", "id", "summary", "published_parsed")
BASES = ["", "http://127.0.0.1:7001/feed", "https://news.example/a/b?x=1", "ftp://x/y",
         "javascript:alert(1)", "not a url", "file:///tmp/x", "http:///host/path/", "http:x/a/",
         "https://u:p@[::1]:8443/a/./b/../c?q#f"]


def feedparser_entries(body: bytes, base_url: str) -> list[dict[str, Any]]:
    parsed = feedparser.parse(io.BytesIO(body), sanitize_html=False,
                              resolve_relative_uris=False,
                              response_headers={"content-location": base_url,
                                                "content-type": "application/xml"})
    return [{field: entry.get(field) for field in FIELDS} for entry in parsed.entries]


def fast_entries(body: bytes, base_url: str) -> list[dict[str, Any]] | None:
    found = plainrss.entries(body, base_url)
    if found is None:
        return None
    return [{field: entry.get(field) for field in FIELDS} for entry in found]


def slow_parse(body: bytes, source_id: str, base_url: str,
               monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as patched:
        patched.setattr(parse_module.plainrss, "entries", lambda *_a, **_k: None)
        try:
            return parse_feed(body, source_id, base_url=base_url)
        except parse_module.FeedParseError as exc:
            return type(exc)


# characters XML allows (the C0 controls are not well-formed: feedparser's loose parser
# reads those, and the fast reader declines them, which the refusal cases cover)
XML_CHARS = st.characters(blacklist_categories=("Cs",), blacklist_characters="".join(
    chr(c) for c in range(32) if chr(c) not in "\t\n\r") + "\ufffe\uffff")
RAW = [
        "", " ", "  padded  ", "A &amp; B", "&lt;b&gt;bold&lt;/b&gt; text", "&#x85;x&#133;",
        "caf\u00c3\u00a9", "caf\u00e9", "\u0080\u0093\u009f", "<![CDATA[<p>x & y</p>]]>",
        "a<!-- c -->b", "line\r\nbreak", "\u2028sep\u2028", "&#65;&#x42;", "tab\tx",
        "emoji \U0001f600", "&amp;amp;", "a&amp;b=c&amp;d=e", "?x=1&amp;y=2"]
TEXTS = st.one_of(st.text(XML_CHARS, max_size=30), st.sampled_from(RAW))
LINKS = st.sampled_from([
    "", "https://news.example/a?b=1&amp;utm_source=x", "/relative/path", "relative",
    "//host.example/p", "http:///triple", "javascript:alert(1)", "  https://x.example/  ",
    "story-1", "https://x.example/a&amp;b;c", "https://x.example/&amp;lt;", "mailto:a@b",
    "https://[::1]/x", "http://ex ample/"])
DATES = st.sampled_from([
    "", "Mon, 03 Mar 2025 10:00:00 +0100", "Mon, 03 Mar 2025 10:00:00 GMT",
    "3 Mar 2025 10:00 EST", "2025-03-03T10:00:00Z", "garbage", "Tue, 31 Feb 2025 10:00:00 GMT",
    "Mon, 03 Mar 25 10:00:00 PST", "Sun, 06 Nov 1994 08:49:37 +0000", " 2025-03-03 "])


def _text(value: str) -> str:
    """Text as a publisher writes it: the samples are XML already, generated text is
    escaped."""
    return value if value in RAW else escape(value)


@st.composite
def items(draw: st.DrawFn) -> str:
    parts = []
    for tag in draw(st.permutations(["title", "link", "guid", "pubDate", "description",
                                     "category", "author", "comments", "enclosure"])):
        if not draw(st.booleans()):
            continue
        if tag == "link":
            parts.append(f"<link>{draw(LINKS)}</link>")
        elif tag == "guid":
            attribute = draw(st.sampled_from(["", ' isPermaLink="true"',
                                              ' isPermaLink="false"', ' isPermaLink="TRUE"']))
            value = draw(st.one_of(LINKS, TEXTS.map(_text)))
            parts.append(f"<guid{attribute}>{value}</guid>")
        elif tag == "pubDate":
            parts.append(f"<pubDate>{draw(DATES)}</pubDate>")
        elif tag == "enclosure":
            parts.append('<enclosure url="https://x.example/a.mp3" length="1" type="audio/mpeg"/>')
        else:
            parts.append(f"<{tag}>{_text(draw(TEXTS))}</{tag}>")
    if draw(st.integers(0, 24)) == 0:  # now and then, what the fast reader must refuse
        parts.insert(draw(st.integers(0, len(parts))), draw(st.sampled_from([
            "<title>second</title>", "<dc:creator>x</dc:creator>", "<source url='x'>s</source>",
            "<content:encoded><![CDATA[<p>c</p>]]></content:encoded>", "<title><b>x</b></title>",
            '<description type="html">d</description>', "<entry>e</entry>"])))
    return f"<item>{''.join(parts)}</item>"


@st.composite
def documents(draw: st.DrawFn) -> bytes:
    channel = [f"<title>{_text(draw(TEXTS))}</title>"]
    if draw(st.booleans()):
        channel.append("<link>https://news.example/</link><description>d</description>")
    if draw(st.booleans()):
        channel.append('<atom:link href="https://news.example/feed" rel="self" '
                       'type="application/rss+xml"/>')
    if draw(st.booleans()):
        channel.append("<image><url>https://x.example/i.png</url><title>img</title>"
                       "<link>https://x.example/</link></image>")
    channel.extend(draw(st.lists(items(), max_size=6)))
    if draw(st.booleans()):
        channel.append("<lastBuildDate>Mon, 03 Mar 2025 10:00:00 GMT</lastBuildDate>")
    declaration = draw(st.sampled_from([
        "", '<?xml version="1.0"?>', '<?xml version="1.0" encoding="utf-8"?>',
        "<?xml version='1.0' encoding='UTF-8'?>"]))
    version = draw(st.sampled_from(["2.0"] * 9 + ["0.91"]))
    return (f'{declaration}<rss version="{version}" '
            'xmlns:atom="http://www.w3.org/2005/Atom" '
            'xmlns:dc="http://purl.org/dc/elements/1.1/" '
            'xmlns:content="http://purl.org/rss/1.0/modules/content/">'
            f"<channel>{''.join(channel)}</channel></rss>").encode()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=documents(), base_url=st.sampled_from(BASES))
def test_what_the_fast_reader_accepts_it_reads_exactly_like_feedparser(
        body: bytes, base_url: str) -> None:
    fast = fast_entries(body, base_url)
    if fast is not None:
        assert fast == feedparser_entries(body, base_url)


@settings(max_examples=150, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(body=documents(), base_url=st.sampled_from(BASES))
def test_parse_feed_gives_the_same_stories_either_way(
        body: bytes, base_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    try:
        fast: Any = parse_feed(body, "src", base_url=base_url)
    except parse_module.FeedParseError as exc:
        fast = type(exc)
    assert fast == slow_parse(body, "src", base_url, monkeypatch)


def test_plain_feeds_take_the_fast_reader() -> None:
    """The generated corpus is not all refusals: the feeds Sluice's tests and the
    simulation publish are read by the fast reader."""
    body = rss_document("daily", 5)
    found = plainrss.entries(body, "https://news.example/feed")
    assert found is not None and len(found) == 5
    assert [e["title"] for e in found] == [f"daily story {i}" for i in range(5)]
    simulated = (b'<?xml version="1.0"?><rss version="2.0"><channel><title>f</title>'
                 b"<link>http://127.0.0.1:7001/</link><description>sim</description>"
                 b"<item><title>Report story-1: a b</title>"
                 b"<link>http://127.0.0.1:7001/f/story-1</link><guid>story-1</guid>"
                 b"<pubDate>Mon, 03 Mar 2025 10:00:00 -0000</pubDate>"
                 b"<description>a b</description></item></channel></rss>")
    assert fast_entries(simulated, "http://127.0.0.1:7001/f") == feedparser_entries(
        simulated, "http://127.0.0.1:7001/f")
    assert plainrss.entries(simulated)[0]["id"] == "story-1"  # type: ignore[index]


BILLION_LAUGHS = (b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
                  b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>'
                  b'<rss version="2.0"><channel><item><title>&lol2;</title></item>'
                  b"</channel></rss>")


@pytest.mark.parametrize("body", [
    BILLION_LAUGHS,
    (b'<?xml version="1.0"?><!DOCTYPE rss SYSTEM "http://169.254.169.254/x"><rss version="2.0">'
    b"<channel></channel></rss>"),
    (b'<rss version="2.0"><channel xml:base="http://evil.example/"><item><link>/a</link>'
    b"</item></channel></rss>"),
    (b'<?xml version="1.0" encoding="iso-8859-1"?><rss version="2.0"><channel><item>'
    b"<title>caf\xe9</title></item></channel></rss>"),
    b'\xef\xbb\xbf<rss version="2.0"><channel><item><title>bom</title></item></channel></rss>',
    b'<rss version="2.0"><channel><item><title>\xff</title></item></channel></rss>',
    b'<rss version="2.0"><channel><foo><item><title>hidden</title></item></foo></channel></rss>',
    b'<rss version="2.0"><channel><item><title>a</title></item></channel><channel/></rss>',
    b'<rss version="2.0"><channel><item><title>&nbsp;</title></item></channel></rss>',
    b'<rss version="2.0"><channel><item><title>truncated',
    b'<feed xmlns="http://www.w3.org/2005/Atom"><entry><title>a</title></entry></feed>',
    (b'<rss version="2.0" xmlns="http://example.com/ns"><channel><item><title>a</title>'
    b"</item></channel></rss>"),
    b"<html><body>not a feed</body></html>",
    b"http://169.254.169.254/latest/meta-data/",
    # found by an adversarial review: feedparser takes a base from a plain or re-cased
    # attribute, an encoding from anything on line 1, rewrites a head with comments,
    # ENTITY lines or instructions, and cuts a declaration at its first ">"
    (b'<rss version="2.0" base="http://evil.example/"><channel><item><link>/a</link></item>'
    b"</channel></rss>"),
    (b'<rss version="2.0" xml:BASE="http://evil.example/"><channel><item><link>/a</link>'
    b"</item></channel></rss>"),
    (b'<rss version="2.0" xmlns:x="HTTP://WWW.W3.ORG/XML/1998/NAMESPACE" x:base="http://e/">'
    b"<channel><item><link>/a</link></item></channel></rss>"),
    (b'<rss version="2.0"><channel><title base="http://evil.example/">t</title><item>'
    b"<link>/a</link></item></channel></rss>"),
    (b'<rss version="2.0"><channel><item><category base="http://evil.example/">c</category>'
    b"<link>/a</link></item></channel></rss>"),
    (b'<?xml version="1.0"?><rss version="2.0"><channel><item><title>\xc3\x83\xc2\xa9 '
    b'encoding="iso-8859-1"?></title></item></channel></rss>'),
    (b'<?pi encoding="iso-8859-1"?><rss version="2.0"><channel><item><title>\xc3\x83\xc2\xa9'
    b"</title></item></channel></rss>"),
    (b'<!--\n<!ENTITY -->\n<rss version="2.0"><channel><item><title>A</title></item><item>'
    b"<title>B --></title></item><item><title>C</title></item></channel></rss>"),
    (b'<?xml-stylesheet href="a>b"?><rss version="2.0"><channel><item>'
    b"<guid>http://x/?a=1&amp;b=2</guid></item></channel></rss>"),
    b'<?xml version="1.0"' + b" " * 200 + b'encoding="shift_jis"?><rss version="2.0"><channel>'
    b"<item><title>x</title></item></channel></rss>",
    b'<?xml version="1.0"' + b" " * 200 + b'encoding="idna"?><rss version="2.0"><channel>'
    b"<item><title>x</title></item></channel></rss>",
    (b'<?xml version="1.0" encoding = "iso-8859-1"?><rss version="2.0"><channel><item>'
    b"<title>x</title></item></channel></rss>"),
    # a second review: a namespace name with a space sends feedparser to its loose parser
    (b'<rss version="2.0"><channel><item xmlns:x="a b"><guid>A &amp; B</guid></item>'
    b"</channel></rss>"),
    (b'<rss version="2.0" xmlns:x="a b"><channel><item><title>line\r\nbreak</title></item>'
    b"</channel></rss>"),
    (b'<rss version="2.0" xmlns:x="a\tb"><channel><item><guid>A &amp; B</guid></item>'
    b"</channel></rss>"),
    (b'<rss version="2.0" xmlns:x="a&#32;b"><channel><item><guid>A &amp; B</guid></item>'
    b"</channel></rss>"),
    (b"<rss version=\"2.0\" xmlns:x=' '><channel><item><guid>A &amp; B</guid></item>"
    b"</channel></rss>"),
])
def test_what_it_cannot_read_exactly_goes_to_feedparser(
        body: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plainrss.entries(body, "https://news.example/feed") is None
    try:
        fast: Any = parse_feed(body, "src", base_url="https://news.example/feed")
    except parse_module.FeedParseError as exc:
        fast = type(exc)
    assert fast == slow_parse(body, "src", "https://news.example/feed", monkeypatch)


@pytest.mark.parametrize("attribute", ["", ' isPermaLink="true"', ' isPermaLink="false"'])
@pytest.mark.parametrize("order", ["link-first", "guid-first", "no-link"])
def test_guid_and_link_in_every_order(attribute: str, order: str) -> None:
    guid = f"<guid{attribute}>rel/guid</guid>"
    link = "<link>/a/link</link>"
    fields = {"link-first": link + guid, "guid-first": guid + link, "no-link": guid}[order]
    body = (f'<rss version="2.0"><channel><item><title>t</title>{fields}</item>'
            "</channel></rss>").encode()
    base = "https://news.example/feed/"
    fast = fast_entries(body, base)
    assert fast is not None
    assert fast == feedparser_entries(body, base)


@pytest.mark.parametrize("base_url", ["file:///tmp/x", "http:///host/path/", "http:x/a/"])
def test_a_base_url_that_feedparser_rewrites_at_each_element_goes_to_feedparser(
        base_url: str) -> None:
    body = b'<rss version="2.0"><channel><item><link>z</link></item></channel></rss>'
    assert plainrss.entries(body, base_url) is None
    assert fast_entries(body, "https://news.example/feed/") == feedparser_entries(
        body, "https://news.example/feed/")


def test_deep_nesting_is_declined_without_harm() -> None:
    """200,000 nested elements inside a field or the channel: parsed by the C parser,
    declined, no recursion (feedparser then reads it as before)."""
    deep = b"<a>" * 200_000 + b"</a>" * 200_000
    assert plainrss.entries(b'<rss version="2.0"><channel><item><description>' + deep
                            + b"</description></item></channel></rss>") is None
    assert plainrss.entries(b'<rss version="2.0"><channel>' + deep + b"</channel></rss>") is None
