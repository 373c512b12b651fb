"""Plain RSS 2.0 read without feedparser, giving exactly what feedparser gives.

feedparser reads any feed, however broken, and costs about 7 ms for a 3 KB document of
twelve items: most of an rss tick's CPU. Most feeds are plain, well-formed RSS 2.0, and
for those this module reads the same five fields (title, link, guid, description,
pubDate) with the C XML parser and feedparser's own finishing steps (its URI joining,
whitespace stripping, its UTF-8 re-decoding and windows-1252 mapping, its date parsers),
in a tenth of the time.

It reads a document only when it is sure feedparser would read it the same way, and
answers None otherwise; the caller then hands the document to feedparser:

- UTF-8 without a byte-order mark, declared UTF-8 or not declared, with nothing before
  the root element but that declaration (no DOCTYPE, so no entity but XML's five and
  character references; no comment or instruction feedparser would rewrite), and no
  other ``encoding`` on the first line (feedparser's encoding sniff reads the whole line);
- no ``base`` or ``xml:base`` attribute anywhere, and a base URL that feedparser's
  repeated joining leaves as it is; no namespace name with whitespace or a reference in
  it (feedparser's SAX reader refuses those and falls back to its loose parser);
- ``<rss version="2.0">`` holding one ``<channel>`` whose children are RSS 2.0's channel
  elements (and ``atom:link``), with no element feedparser would read as an entry
  anywhere but the channel's own ``<item>`` children;
- items whose children are the five fields (each at most once, text only, no
  attributes but ``isPermaLink="true|false"`` on ``guid``) and the elements whose
  values Sluice does not read (``category``, ``author``, ``comments``, ``enclosure``,
  with text only).

``tests/unit/rss/test_plainrss.py`` holds the two readers equal on generated documents
and on hostile ones.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

from feedparser.datetimes import _parse_date  # type: ignore[import-untyped]
from feedparser.html import _cp1252  # type: ignore[import-untyped]
from feedparser.urls import _urljoin, make_safe_absolute_uri  # type: ignore[import-untyped]

ATOM_LINK = "{http://www.w3.org/2005/Atom}link"
CHANNEL_LEAVES = frozenset({
    "title", "link", "description", "language", "copyright", "managingEditor", "webMaster",
    "pubDate", "lastBuildDate", "category", "generator", "docs", "cloud", "ttl", "rating",
    ATOM_LINK})
CHANNEL_GROUPS = {"image": frozenset({"url", "title", "link", "width", "height", "description"}),
                  "skipHours": frozenset({"hour"}), "skipDays": frozenset({"day"})}
FIELDS = frozenset({"title", "link", "guid", "pubDate", "description"})
IGNORED = frozenset({"category", "author", "comments", "enclosure"})
_ROOT = re.compile(rb"<\w")  # where feedparser's document head ends: the first element
_ENCODING = re.compile(rb"encoding\s*=\s*[\"']([^\"']*)[\"']")
# a namespace declaration's value. expat, as feedparser's SAX reader runs it, splits names
# on a space and refuses a namespace name holding one (feedparser then reads the document
# with its loose parser, which keeps entities in links); ElementTree accepts it. Any
# whitespace (normalised to a space) or reference in the value: feedparser reads it
_NAMESPACE = re.compile(rb"xmlns(?::[^\s=>]+)?\s*=\s*(?:\"([^\"]*)\"|'([^']*)')")
_ENTITY_REF = re.compile("&([A-Za-z0-9_]+);")


class _NotPlain(Exception):
    """The document is not one this module reads exactly like feedparser."""


def entries(body: bytes, base_url: str = "") -> list[dict[str, Any]] | None:
    """The entries of a plain RSS 2.0 document as feedparser would give the five fields
    (``title``, ``link``, ``id``, ``summary``, ``published_parsed``, each only when
    feedparser would set it), in document order; None: let feedparser read it. Never
    raises: whatever the C parser refuses goes to feedparser too."""
    if not _plain_bytes(body):
        return None
    try:
        base = _base(base_url)
        root = ET.fromstring(body)
        return _read(root, base)
    except (ET.ParseError, LookupError, ValueError, _NotPlain):
        return None


def _plain_bytes(body: bytes) -> bool:
    """The document as bytes is one feedparser hands to its XML parser unchanged: UTF-8
    without a byte-order mark, and a prolog of at most a plain XML declaration (feedparser
    rewrites a head with comments, DOCTYPE, ENTITY lines or other instructions, cuts a
    declaration at its first ``>``, and takes an encoding from anything on the first line
    that looks like one)."""
    if body.startswith((b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")):
        return False
    root = _ROOT.search(body)
    if root is None:
        return False
    prolog, declaration = body[:root.start()], b""
    if prolog.startswith(b"<?xml"):
        end = prolog.find(b"?>")
        if end < 0:
            return False
        declaration, prolog = prolog[:end + 2], prolog[end + 2:]
        if b">" in declaration[:-1]:
            return False
    if prolog.strip():
        return False
    declared = _ENCODING.search(declaration)
    if declared is not None and declared.group(1).lower() != b"utf-8":
        return False
    if body.split(b"\n", 1)[0].count(b"encoding") > (declared is not None):
        return False
    if b"xmlns" in body and any(
            any(c in b"".join(value) for c in (b" ", b"\t", b"\r", b"\n", b"&"))
            for value in _NAMESPACE.findall(body)):
        return False  # a namespace name with a space: feedparser's SAX parser refuses it
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _base(base_url: str) -> str:
    """The base URI as feedparser's parse() makes it from a stream's Content-Location.
    feedparser joins it with itself again at every element: a base that this join changes
    (``file:///x``, ``http:x``) would differ at each depth, and is left to feedparser."""
    base = str(make_safe_absolute_uri("", base_url) or make_safe_absolute_uri(base_url) or "")
    rejoined = (make_safe_absolute_uri(base, base) or base) if base else _urljoin(base, base)
    if rejoined != base:
        raise _NotPlain
    return base


def _read(root: ET.Element, base: str) -> list[dict[str, Any]]:
    if root.tag != "rss" or root.get("version") != "2.0" or len(root) != 1:
        raise _NotPlain
    _no_base(root)
    channel = root[0]
    if channel.tag != "channel" or channel.attrib:
        raise _NotPlain
    found = []
    for child in channel:
        _no_base(child)
        if child.tag == "item":
            found.append(_item(child, base))
        elif child.tag in CHANNEL_LEAVES:
            _leaf(child)
        elif child.tag in CHANNEL_GROUPS:
            allowed = CHANNEL_GROUPS[child.tag]
            for part in child:
                if part.tag not in allowed:
                    raise _NotPlain
                _no_base(part)
                _leaf(part)
        else:
            raise _NotPlain
    return found


def _no_base(element: ET.Element) -> None:
    """feedparser takes a base URI from ``xml:base`` and from a plain ``base`` attribute,
    in any case and through any prefix it lower-cases to the XML namespace."""
    for name in element.attrib:
        if name.rpartition("}")[2].lower() == "base":
            raise _NotPlain


def _leaf(element: ET.Element) -> None:
    if len(element):
        raise _NotPlain


def _item(item: ET.Element, base: str) -> dict[str, Any]:
    if item.attrib:
        raise _NotPlain
    entry: dict[str, Any] = {}
    seen: set[str] = set()
    guid_is_link = False
    for child in item:
        tag = child.tag
        if not isinstance(tag, str) or tag in seen or len(child):
            raise _NotPlain
        _no_base(child)
        if tag in IGNORED:
            continue
        if tag not in FIELDS:
            raise _NotPlain
        seen.add(tag)
        attributes = child.attrib
        if tag == "guid":
            permalink = attributes.get("isPermaLink", "true")
            if set(attributes) - {"isPermaLink"} or permalink not in ("true", "false"):
                raise _NotPlain
            guid_is_link = permalink == "true"
        elif attributes:
            raise _NotPlain
        text = (child.text or "").strip()
        if tag == "title":
            entry["title"] = _finish(text)
        elif tag == "description":
            entry["summary"] = _finish(text)
        elif tag == "pubDate":
            entry["published_parsed"] = _parse_date(_finish(text))
        elif tag == "link":
            value = _finish(_urljoin(base, text) if text else text)
            value = _ENTITY_REF.sub(r"&\g<1>", value.replace("&amp;", "&"))
            entry["link"] = value
        else:  # guid: feedparser's id, and its link when it is a permalink and no link came
            value = _finish(_urljoin(base, text) if text and guid_is_link else text)
            entry["id"] = value
    if guid_is_link and "link" not in entry:
        entry["link"] = entry["id"]
    return entry


def _finish(text: str) -> str:
    """feedparser's last steps on a stripped value: text that reads as UTF-8 mis-decoded
    as Latin-1 is decoded again, then windows-1252's C1 code points are mapped."""
    try:
        text = text.encode("iso-8859-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        pass
    return text.translate(_cp1252)


__all__ = ["entries"]
