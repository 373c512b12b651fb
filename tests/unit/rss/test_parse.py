"""Feed documents to stories: RSS 2.0 and Atom 1.0 through feedparser, stable ids,
canonical links, summaries sanitised by nh3."""

from __future__ import annotations

from datetime import UTC, datetime
from html.parser import HTMLParser

import pytest

from sluice.rss.parse import FeedParseError, canonical_link, parse_feed, story_id
from tests.providers.feeds import atom_document, rss_document


def test_rss_items_become_normalised_stories() -> None:
    stories = parse_feed(rss_document("daily", 3), "src-1")
    assert [s.title for s in stories] == ["daily story 0", "daily story 1", "daily story 2"]
    first = stories[0]
    assert first.link == "https://news.example/daily/0"  # tracking parameter dropped
    assert first.published_at == datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
    assert first.source_id == "src-1"
    assert first.summary.startswith("<p>word") and "<script" not in first.summary
    assert "alert" not in first.summary


def test_atom_entries_are_read_and_their_html_sanitised() -> None:
    stories = parse_feed(atom_document("wire", 2), "src-2")
    assert [s.link for s in stories] == ["https://atom.example/wire/0",
                                         "https://atom.example/wire/1"]  # fragment dropped
    assert stories[1].summary.startswith("<b>bold 1</b>")
    assert "onerror" not in stories[1].summary and "<img" in stories[1].summary
    assert stories[0].published_at == datetime(2025, 3, 1, 12, 0, tzinfo=UTC)


TITLES = [  # (the title as the document has it, the title stored)
    ("&lt;img src=x onerror=alert(3)&gt; Breaking", "Breaking"),
    ("Breaking &lt;b&gt;news&lt;/b&gt;&lt;script&gt;alert(1)&lt;/script&gt;", "Breaking news"),
    ("Tom &amp; Jerry &amp;amp; friends", "Tom & Jerry & friends"),
    ("a &lt; b &amp;amp;amp; c", "a < b &amp; c"),  # entities decoded once
    ("decoded &amp;lt;img src=x onerror=alert(3)&amp;gt;markup goes", "decoded markup goes"),
    ("&amp;lt;&lt;b&gt;&lt;/b&gt;img src=x onerror=alert(3)&amp;gt;nested", "nested"),
    ("  two\n   lines  ", "two lines"),
]


@pytest.mark.parametrize(("raw", "stored"), TITLES)
def test_titles_are_plain_text_on_both_readers(raw: str, stored: str) -> None:
    """The plain RSS 2.0 reader, feedparser (this item's ``dc:creator`` sends it there) and
    feedparser's Atom ``type="html"`` give the same text, markup removed."""
    plain = (f'<rss version="2.0"><channel><title>f</title><item><title>{raw}</title>'
             "<link>https://n.example/1</link></item></channel></rss>").encode()
    loose = plain.replace(b'<rss version="2.0">',
                          b'<rss version="2.0" xmlns:dc="http://purl.org/dc/elements/1.1/">'
                          ).replace(b"</item>", b"<dc:creator>x</dc:creator></item>")
    atom = ('<feed xmlns="http://www.w3.org/2005/Atom"><title>f</title><entry>'
            f'<title type="html">{raw}</title><link href="https://n.example/1"/></entry>'
            "</feed>").encode()
    titles = [[s.title for s in parse_feed(body, "src")] for body in (plain, loose, atom)]
    assert titles == [[stored]] * 3
    assert markup_in(stored) == [], "no HTML parser finds a tag in what is stored"


def markup_in(text: str) -> list[str]:
    """The tags, comments and declarations the standard library's HTML parser finds."""
    found: list[str] = []

    class Finder(HTMLParser):
        def handle_starttag(self, tag: str, attrs: object) -> None:
            found.append(f"<{tag}>")

        def handle_endtag(self, tag: str) -> None:
            found.append(f"</{tag}>")

        def handle_comment(self, data: str) -> None:
            found.append("<!--")

        def handle_decl(self, decl: str) -> None:
            found.append("<!")

    finder = Finder(convert_charrefs=True)
    finder.feed(text)
    finder.close()
    return found


def test_a_title_of_markup_alone_falls_back_to_the_link_and_a_huge_link_is_dropped() -> None:
    body = ('<rss version="2.0"><channel><title>f</title><item><title>&lt;img src=x '
            "onerror=alert(3)&gt;</title><link>https://n.example/1</link></item><item>"
            f"<title>long</title><link>https://n.example/{'a' * 3000}</link></item>"
            "</channel></rss>").encode()
    first, second = parse_feed(body, "src")
    assert first.title == "https://n.example/1"
    assert (second.title, second.link) == ("long", None)


def test_ids_are_stable_and_shared_by_the_same_article_from_two_sources() -> None:
    a = parse_feed(rss_document("x", 2), "src-a")
    b = parse_feed(rss_document("x", 2), "src-b")
    again = parse_feed(rss_document("x", 2), "src-a")
    assert [s.id for s in a] == [s.id for s in b] == [s.id for s in again]
    assert len({s.id for s in a}) == 2


def test_the_id_falls_back_from_link_to_guid_to_title() -> None:
    by_link = story_id("https://a.example/1", "g", "t", "s")
    assert by_link == story_id("https://a.example/1", "other", "other", "other")
    assert story_id(None, "g", "t", "s") != story_id(None, "h", "t", "s")
    assert story_id(None, None, "t", "s1") != story_id(None, None, "t", "s2")


@pytest.mark.parametrize(("raw", "canonical"), [
    ("HTTPS://News.Example/a?b=1&utm_medium=x#frag", "https://news.example/a?b=1"),
    ("http://n.example", "http://n.example/"),
    ("https://n.example/p?fbclid=1", "https://n.example/p"),
    ("javascript:alert(1)", None),
    ("/relative/only", None),
])
def test_canonical_links(raw: str, canonical: str | None) -> None:
    assert canonical_link(raw) == canonical


def test_a_document_that_is_not_a_feed_is_an_error_and_an_empty_feed_is_not() -> None:
    with pytest.raises(FeedParseError):
        parse_feed(b"<html><body>oops</body", "s")
    with pytest.raises(FeedParseError):
        parse_feed(b"plain text, not xml", "s")
    assert parse_feed(rss_document("empty", 0), "s") == []


def test_a_string_that_looks_like_a_url_is_parsed_not_fetched() -> None:
    with pytest.raises(FeedParseError):
        parse_feed(b"http://169.254.169.254/latest/meta-data/", "s")
