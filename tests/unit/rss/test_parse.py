"""Feed documents to stories: RSS 2.0 and Atom 1.0 through feedparser, stable ids,
canonical links, summaries sanitised by nh3."""

from __future__ import annotations

from datetime import UTC, datetime

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
