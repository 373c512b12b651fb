"""The door's checks, one per kind of value: a corpus of hostile values, each refused with a
``RequestError`` naming the field, and the canonical form of what is accepted."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import pytest

from sluice.core.errors import RequestError
from sluice.core.validate import (
    MAX_DEPTH,
    RECIPIENTS,
    check_depth,
    check_identifier,
    check_instant,
    check_locale,
    check_recipient,
    check_scope_id,
    check_text,
    check_url,
    load_json,
)
from sluice.delivery.channels import channels

HOSTILE_URLS = [
    # non-canonical IPv4: octal, a leading zero, short forms, hex, too many parts
    "http://0177.0.0.2/feed", "http://1.2.3.04/", "http://127.1/", "http://0x7f.0.0.1/",
    "http://2130706433/", "http://1.2.3.4.5/", "http://256.0.0.1/",
    # digits that only a Unicode mapping turns into an address
    "http://①②⑦.0.0.1/", "http://１２７.0.0.1/", "http://ｅｘａｍｐｌｅ.com/",
    # empty, bad or over-long labels; broken IDNA
    "http://a..b/", "http://.a/", "http://a./", "http://xn--/", "http://xn--zz-/",
    "http://-a.com/", "http://a-.com/", "http://%41.com/", f"http://{'a' * 64}.com/",
    "http://a" + ".b" * 130 + "/",
    # IPv6 brackets
    "http://[::1/x", "http://[::1", "http://::1/", "http://[::1]x/", "http://[fe80::1%25eth0]/",
    "http://[zz::1]/", "http://[127.0.0.1]/",
    # user info, schemes, separators
    "http://user:pass@example.com/", "http://example.com@127.0.0.1/", "ftp://example.com/",
    "javascript:alert(1)", "http:/example.com/", "//example.com/", "http://",
    "http://example.com\\@evil/",
    # ports
    "http://example.com:0/", "http://example.com:65536/", "http://example.com:080/",
    "http://example.com:x/", "http://example.com:/",
    # whitespace and control characters anywhere
    "http://example.com/a b", " http://example.com/", "http://example.com/\r\nX: y",
    "http://exa\tmple.com/", "http://example.com/\x00", "http://example.com/\u202e",
    "http://example.com/\u2028",
    # broken escapes, over-long
    "http://example.com/%zz", "http://example.com/%4", "http://example.com/" + "a" * 3000,
]


@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_a_hostile_url_is_refused_naming_the_field(url: str) -> None:
    with pytest.raises(RequestError) as info:
        check_url(url, field="url")
    assert info.value.status == 400 and info.value.context == {"field": "url"}
    assert info.value.message.startswith("url ")


@pytest.mark.parametrize("value", [None, 1, [], {}, ""])
def test_a_url_must_be_a_string(value: object) -> None:
    with pytest.raises(RequestError, match="url must be a non-empty string"):
        check_url(value, field="url")


@pytest.mark.parametrize(("given", "canonical"), [
    ("http://Example.COM/Feed?x=1#f", "http://example.com/Feed?x=1#f"),
    ("HTTPS://example.com", "https://example.com"),
    ("https://bücher.de/ä?q=ü", "https://xn--bcher-kva.de/%C3%A4?q=%C3%BC"),
    ("https://xn--bcher-kva.de/", "https://xn--bcher-kva.de/"),
    ("http://127.0.0.1:8080/a%20b", "http://127.0.0.1:8080/a%20b"),
    ("http://[::1]:80/x", "http://[::1]:80/x"),
    ("http://[0:0:0:0:0:0:0:1]/", "http://[::1]/"),
    ("http://feeds.example.com/a/b.xml?c=d&e=f", "http://feeds.example.com/a/b.xml?c=d&e=f"),
    ("http://example.com/<x>", "http://example.com/%3Cx%3E"),
])
def test_an_accepted_url_is_stored_in_its_canonical_form(given: str, canonical: str) -> None:
    assert check_url(given, field="url") == canonical
    assert check_url(canonical, field="url") == canonical  # canonical is a fixed point


def test_every_channel_has_a_recipient_check() -> None:
    assert set(RECIPIENTS) == set(channels())


@pytest.mark.parametrize(("channel", "recipient"), [
    ("webhook", "http://[::1/x"), ("webhook", "http://0177.0.0.2/hook"),
    ("webhook", "not a url"), ("webhook", "http://user@example.com/"),
    ("email", "ops@example.com\r\nBcc: all@example.com"), ("email", "ops@example.com\n"),
    ("email", "no-at-sign"), ("email", "a b@example.com"), ("email", "ops@127.0.0.1"),
    ("email", "ops@[::1]"), ("email", "ops@localhost"), ("email", "ops@a..b"),
    ("email", "ops@example.com\x00"), ("email", '"quoted"@example.com'),
    ("email", "a" * 65 + "@example.com"),
    ("telegram", "abc"), ("telegram", "12 34"), ("telegram", "1001\n"), ("telegram", "@ab"),
    ("telegram", "0123"), ("telegram", True), ("telegram", "9" * 30),
    ("slack", "a b"), ("slack", "#gen\neral"), ("slack", "C0123\r\n"), ("slack", "x" * 100),
    ("slack", "<!channel>"),
])
def test_a_recipient_is_checked_for_its_channel(channel: str, recipient: object) -> None:
    with pytest.raises(RequestError) as info:
        check_recipient(channel, recipient, field="rules[0].destination.recipient")
    assert info.value.context == {"field": "rules[0].destination.recipient"}


@pytest.mark.parametrize(("channel", "recipient", "stored"), [
    ("webhook", "https://Hooks.Example.com/x", "https://hooks.example.com/x"),
    ("email", "Ops.Team+alerts@Example.COM", "Ops.Team+alerts@example.com"),
    ("telegram", "-1001234567890", "-1001234567890"), ("telegram", 1001, "1001"),
    ("telegram", "@news_channel", "@news_channel"),
    ("slack", "C0123ABC", "C0123ABC"), ("slack", "#alerts", "#alerts"),
    ("slack", "ops-alerts", "ops-alerts"),
])
def test_a_good_recipient_is_accepted(channel: str, recipient: object, stored: str) -> None:
    assert check_recipient(channel, recipient, field="recipient") == stored


def test_a_channel_without_a_check_is_refused() -> None:
    with pytest.raises(RequestError, match="no recipient check"):
        check_recipient("pigeon", "x", field="recipient")


@pytest.mark.parametrize("value", ["en\n", "en ", "e", "english", "en_US", "pt-BR-", "",
                                   "en-" + "a" * 40, "\u0435n", 7])
def test_a_locale_is_a_language_tag_matched_in_full(value: object) -> None:
    with pytest.raises(RequestError) as info:
        check_locale(value)
    assert info.value.context == {"field": "locale"}


@pytest.mark.parametrize("value", ["en", "pt-BR", "zh-Hant-TW", "de-CH-1996"])
def test_a_language_tag_is_accepted(value: str) -> None:
    assert check_locale(value) == value


@pytest.mark.parametrize("value", ["a" * 257, "a b", "a\nb", "a\x00", "a\u200bb", "", None,
                                   "tenant\u2028x"])
def test_an_identifier_is_bounded_and_without_spaces_or_controls(value: object) -> None:
    with pytest.raises(RequestError) as info:
        check_identifier(value, field="subjectUserId")
    assert info.value.context == {"field": "subjectUserId"}


@pytest.mark.parametrize("value", ["t" * 201, "a/b", "a b", "scope\n", "x" * 3000])
def test_a_scope_id_is_one_pattern_everywhere(value: str) -> None:
    with pytest.raises(RequestError) as info:
        check_scope_id(value, field="tenantScopeId")
    assert info.value.context == {"field": "tenantScopeId"}


def test_text_is_bounded_and_newlines_only_where_text_has_them() -> None:
    with pytest.raises(RequestError, match="at most 512"):
        check_text("x" * 900_000, field="title")
    for line in ("a\nb", "a\rb", "a\x1b[31m", "a\u202eb", "   "):
        with pytest.raises(RequestError):
            check_text(line, field="title")
    assert check_text("line one\nline two\ttab", field="text", multiline=True,
                      limit=100) == "line one\nline two\ttab"
    with pytest.raises(RequestError):
        check_text("bell\x07", field="text", multiline=True)


@pytest.mark.parametrize("document", ["[" * 1024, "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1),
                                      '{"a":' * 5000, "[" * 100_000])
def test_deep_nesting_is_refused_before_parsing(document: str) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)  # a recursive parser would fail here; the scan does not recurse
    try:
        with pytest.raises(RequestError, match="nested deeper") as info:
            load_json(document, field="body")
    finally:
        sys.setrecursionlimit(limit)
    assert info.value.context == {"field": "body"}


def test_brackets_inside_strings_do_not_count_and_shallow_json_loads() -> None:
    document = json.dumps({"text": "[" * 5000 + '\\"{' * 100, "list": [[[1]]]})
    check_depth(document)
    assert load_json(document, field="body")["list"] == [[[1]]]
    nested = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert load_json(nested, field="body") is not None
    with pytest.raises(RequestError, match="nested deeper"):  # one more: refused
        check_depth("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    check_depth("[]" * (MAX_DEPTH + 1))  # many openers, none deep: counted, not refused
    with pytest.raises(RequestError, match="body is not JSON"):
        load_json("{nope", field="body")


def test_a_deeply_nested_queue_message_is_malformed_not_a_crash() -> None:
    from sluice.queues.consumer import parse

    reason = parse('{"a":' * 2000 + "1" + "}" * 2000, "rss.ingest")
    assert isinstance(reason, str) and reason.startswith("malformed message: message is nested")


@pytest.mark.parametrize("value", [
    "2026-12-01", "2026-12-01T10:00", "2026-12-01T10:00:00", "2026-12-01 10:00:00Z",
    "20261201T100000Z", "2026-W48-2T10:00Z", "2026-12-01T10:00:00z", "2026-12-01T10:00:00+0200",
    "2026-12-01T10:00:00.1234567Z", "2026-02-30T10:00Z", "2026-12-01T24:00Z",
    "2026-12-01T10:00:00+25:00", "now", "", " 2026-12-01T10:00Z", "2026-12-01T10:00Z\n",
    "٢٠٢٦-12-01T10:00Z", 1796303338, None, ["2026-12-01T10:00Z"]])
def test_an_instant_without_its_offset_or_not_iso_8601_is_refused(value: object) -> None:
    with pytest.raises(RequestError) as info:
        check_instant(value, field="since")
    assert info.value.context == {"field": "since"}


def test_an_instant_with_its_offset_is_read_in_utc() -> None:
    utc = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    assert check_instant("2026-12-01T10:00Z", field="since") == utc
    assert check_instant("2026-12-01T11:00:00+01:00", field="since") == utc
    assert check_instant("2026-12-01T05:30:00.000-04:30", field="since") == utc
    assert check_instant("2026-12-01T10:00:00.5Z", field="since").microsecond == 500_000
