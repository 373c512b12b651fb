"""What a feed reader is given: at most a set number of entries and of elements of one
document, cut before either reader sees it.

feedparser keeps every entry of a document as dictionaries and reads a few thousand
entries a second, so a 4.9 MB document of 150,000 tiny entries cost 214 MB and half a
minute, and eight of them took a tick past 1.4 GB. Here a document is cut after its
``max_entries``-th entry, or at its ``max_elements``-th element (at the last point outside
an entry, so no entry is read in part), and the elements still open at the cut are
closed: a well-formed document stays well-formed, its first entries exactly as they were,
so both readers read them as they read the whole document.

The scan is expat without namespace processing, called back on element starts and ends
only and stopped at the cut, so it costs what the part kept costs. A document expat
cannot read (feedparser reads those loosely) is cut by counting tags in its bytes.
"""

from __future__ import annotations

import pyexpat
import re
import threading
from typing import NamedTuple

from sluice.core.errors import SluiceError

# Elements a document may hold per entry it may hold (a plain RSS item has 5 or 6).
ELEMENTS_PER_ENTRY = 20
ENTRY_NAMES = frozenset({"item", "entry"})
_ENTRY_START = re.compile(rb"<(?:[^\s<>:/!?]+:)?(?:item|entry)[\s/>]", re.IGNORECASE)
_TAG = re.compile(rb"<[^!?/]")


class Unbounded(SluiceError):
    """The document cannot be cut to the limits (a UTF-16 or UTF-32 document that is not
    well-formed XML)."""

    code = "feed_unparseable"


class Cut(NamedTuple):
    """The document as the readers get it, the entries it holds (outermost ``item`` and
    ``entry`` elements), and why it was cut ("" when whole)."""

    body: bytes
    entries: int
    reason: str = ""


class EntryBudget:
    """The entries one build may still read, shared by its fetches: each takes what it
    may read before parsing and gives back what its document did not hold."""

    def __init__(self, total: int) -> None:
        self.total = self.left = total
        self._lock = threading.Lock()

    def take(self, most: int) -> int:
        with self._lock:
            taken = min(most, self.left)
            self.left -= taken
            return taken

    def give_back(self, count: int) -> None:
        with self._lock:
            self.left = min(self.total, self.left + max(0, count))


class _Stop(Exception):
    def __init__(self, offset: int, open_names: tuple[str, ...]) -> None:
        self.offset = offset
        self.open_names = open_names


def cut_document(body: bytes, *, max_entries: int, why: str = "") -> Cut:
    """``body`` with at most ``max_entries`` entries and ``ELEMENTS_PER_ENTRY`` times as
    many elements. ``why`` names the limit in the reason (the feed's cap by default)."""
    max_elements = max(1, max_entries) * ELEMENTS_PER_ENTRY
    why = why or f"SLUICE_RSS_MAX_FEED_ENTRIES is {max_entries}"
    codec = _codec(body)
    scan = _Scan(max_entries, max_elements)
    try:
        scan.parser.Parse(body, True)
    except _Stop as stop:
        closing = "".join(f"</{name}>" for name in reversed(stop.open_names))
        reason = _reason(scan.entries, scan.elements > max_elements, max_elements, why)
        return Cut(body[:stop.offset] + closing.encode(codec), scan.entries, reason)
    except pyexpat.ExpatError:
        return _cut_loosely(body, codec, max_entries, max_elements, why)
    return Cut(body, scan.entries)


class _Scan:
    """Counts elements and outermost entries; raises ``_Stop`` where the cut goes: before
    the first entry past the limit, or before the first element past it (at the last tag
    outside an entry, so the entry being read goes too)."""

    def __init__(self, max_entries: int, max_elements: int) -> None:
        self.max_entries = max_entries
        self.max_elements = max_elements
        self.entries = self.elements = 0
        self.open: list[str] = []
        self.entry_depth = 0  # depth of the entry being read, 0 outside entries
        self.safe: tuple[int, tuple[str, ...]] = (0, ())
        self.parser = pyexpat.ParserCreate()
        self.parser.StartElementHandler = self.start
        self.parser.EndElementHandler = self.end

    def start(self, name: str, attributes: object) -> None:
        entry = False
        if not self.entry_depth:
            self.safe = (self.parser.CurrentByteIndex, tuple(self.open))
            entry = name.rpartition(":")[2].lower() in ENTRY_NAMES
            if entry and self.entries >= self.max_entries:
                raise _Stop(*self.safe)
        self.elements += 1
        if self.elements > self.max_elements:
            raise _Stop(*self.safe)
        self.open.append(name)
        if entry:
            self.entry_depth = len(self.open)

    def end(self, name: str) -> None:
        if len(self.open) == self.entry_depth:
            self.entry_depth = 0
            self.entries += 1
        self.open.pop()


def _codec(body: bytes) -> str:
    """The encoding the closing tags are written in: the document's when it is UTF-16,
    else UTF-8 (the same bytes as ASCII in every encoding expat reads but those)."""
    if body.startswith(b"\xff\xfe") or body[:2] == b"<\x00":
        return "utf-16-le"
    if body.startswith(b"\xfe\xff") or body[:2] == b"\x00<":
        return "utf-16-be"
    return "utf-8"


def _reason(entries: int, at_elements: bool, max_elements: int, why: str) -> str:
    if at_elements:
        return f"cut: read {entries} entries, stopped at {max_elements} elements ({why})"
    return f"cut: read the first {entries} entries ({why})"


def _cut_loosely(body: bytes, codec: str, max_entries: int, max_elements: int,
                 why: str) -> Cut:
    """A document that is not well-formed XML, cut by its bytes: before its
    ``max_entries + 1``-th entry start tag, or before its ``max_elements + 1``-th tag."""
    if codec != "utf-8" or b"\x00" in body[:4]:
        raise Unbounded("a UTF-16 or UTF-32 feed that is not well-formed XML is not read")
    end = len(body)
    for count, found in enumerate(_ENTRY_START.finditer(body)):
        if count == max_entries:
            end = found.start()
            break
    at_elements = False
    for count, found in enumerate(_TAG.finditer(body, 0, end)):
        if count == max_elements:
            end, at_elements = found.start(), True
            break
    entries = len(_ENTRY_START.findall(body, 0, end))
    if end >= len(body):
        return Cut(body, entries)
    return Cut(body[:end], entries, _reason(entries, at_elements, max_elements, why))


__all__ = ["ELEMENTS_PER_ENTRY", "Cut", "EntryBudget", "Unbounded", "cut_document"]
