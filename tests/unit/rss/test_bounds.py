"""Documents cut before the readers see them: the entries kept read exactly as in the whole
document (both readers), the cut document stays well-formed, and a document with no more
than the limits is given whole."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from sluice.rss.bounds import ELEMENTS_PER_ENTRY, EntryBudget, Unbounded, cut_document
from sluice.rss.parse import parse_feed
from tests.providers.feeds import atom_document, rss_document


@pytest.mark.parametrize("make", [rss_document, atom_document])
def test_the_entries_kept_read_as_in_the_whole_document(make: object) -> None:
    whole = make("feed", 40)  # type: ignore[operator]
    cut = cut_document(whole, max_entries=12)
    assert cut.entries == 12
    assert cut.reason == "cut: read the first 12 entries (SLUICE_RSS_MAX_FEED_ENTRIES is 12)"
    ET.fromstring(cut.body)  # still well-formed: the open elements were closed
    base = "https://feeds.example/feed.xml"
    assert parse_feed(cut.body, "src", base_url=base) == parse_feed(
        whole, "src", base_url=base)[:12]


@pytest.mark.parametrize("make", [rss_document, atom_document])
def test_a_document_within_the_limits_is_given_whole(make: object) -> None:
    whole = make("feed", 12)  # type: ignore[operator]
    assert cut_document(whole, max_entries=12) == (whole, 12, "")


def test_the_element_cap_cuts_before_the_entry_that_passes_it_never_inside() -> None:
    children = "".join(f"<category>c{n}</category>" for n in range(ELEMENTS_PER_ENTRY))
    items = "".join(f"<item><title>story {i}</title>{children}</item>" for i in range(30))
    whole = f'<rss version="2.0"><channel><title>t</title>{items}</channel></rss>'.encode()
    cut = cut_document(whole, max_entries=20)
    # rss, channel and title, then each item and its title and children
    kept = (20 * ELEMENTS_PER_ENTRY - 3) // (ELEMENTS_PER_ENTRY + 2)
    assert cut.entries == kept and f"stopped at {20 * ELEMENTS_PER_ENTRY} elements" in cut.reason
    assert [s.title for s in parse_feed(cut.body, "src")] == [f"story {i}" for i in range(kept)]


def test_prefixed_and_nested_entries_are_closed_in_their_own_names() -> None:
    whole = (b'<?xml version="1.0"?><a:feed xmlns:a="http://www.w3.org/2005/Atom"><a:title>x'
             b"</a:title>" + b"".join(b"<a:entry><a:title>e%d</a:title><a:entry/></a:entry>" % i
                                      for i in range(5)) + b"</a:feed>")
    cut = cut_document(whole, max_entries=2)
    assert cut.body.endswith(b"</a:entry></a:feed>") and cut.entries == 2
    assert [s.title for s in parse_feed(cut.body, "src")] == ["e0", "e1"]


def test_a_document_that_is_not_xml_is_cut_by_its_tags() -> None:
    # an undefined entity: expat refuses the document, feedparser reads it loosely
    items = b"".join(b"<item><title>story&nbsp;%d</title><link>https://n.example/%d</link></item>"
                     % (i, i) for i in range(50))
    whole = b'<rss version="2.0"><channel><title>t</title>' + items + b"</channel></rss>"
    cut = cut_document(whole, max_entries=7)
    assert cut.entries == 7 and cut.reason.startswith("cut: read the first 7 entries")
    assert len(parse_feed(cut.body, "src")) == 7
    tags = b"<rss><channel>" + b"<x>1</x>" * 500 + b"&nbsp;</channel></rss>"
    cut = cut_document(tags, max_entries=5)
    assert cut.body.count(b"<x>") == 5 * ELEMENTS_PER_ENTRY - 2
    assert f"stopped at {5 * ELEMENTS_PER_ENTRY} elements" in cut.reason


def test_a_utf16_document_is_closed_in_utf16_and_a_broken_one_refused() -> None:
    whole = rss_document("feed", 10).replace(b'encoding="utf-8"', b'encoding="utf-16"')
    utf16 = whole.decode().encode("utf-16")  # with its byte-order mark
    cut = cut_document(utf16, max_entries=3)
    assert cut.entries == 3 and cut.body.endswith("</channel></rss>".encode("utf-16-le"))
    assert [s.title for s in parse_feed(cut.body, "src")] == [
        f"feed story {i}" for i in range(3)]
    with pytest.raises(Unbounded):
        cut_document("<rss><channel>&nbsp;</channel></rss>".encode("utf-16"), max_entries=3)


def test_the_build_budget_is_shared_and_never_goes_past_its_total() -> None:
    budget = EntryBudget(1000)
    assert [budget.take(500), budget.take(500), budget.take(500)] == [500, 500, 0]
    budget.give_back(480)  # a document held only 20 entries
    assert budget.take(500) == 480 and budget.left == 0
    budget.give_back(5000)
    assert budget.left == 1000
