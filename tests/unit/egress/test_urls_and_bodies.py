"""URLs as the egress layer reads them, and bodies decoded under a cap."""

from __future__ import annotations

import gzip
import zlib

import pytest

from sluice.egress import DestinationRefused, TooLarge, UnsupportedEncoding
from sluice.egress.body import Decoder, read_capped
from sluice.egress.urls import parse_url


@pytest.mark.parametrize("url", [
    "http://0177.0.0.2/", "http://[::1/x", "http://1.2.3.04/", "http://\u2460\u2461\u2466.0.0.1/",
    "http://a..b/", "http://xn--/", "http://2130706433/", "http://0x7f.1/", "http://127.1/",
    "http://exa mple.com/", "http://example.com/\r\nX: y", "http://example.com:0/",
    "http://example.com:99999/", "ftp://example.com/", "http:///path", "javascript:alert(1)",
    ""])
def test_what_the_http_layer_cannot_read_plainly_is_refused(url: str) -> None:
    with pytest.raises(DestinationRefused) as caught:
        parse_url(url, field="recipient")
    assert caught.value.status == 400 and caught.value.context["field"] == "recipient"


@pytest.mark.parametrize(("url", "host", "port"), [
    ("https://Example.COM/feed", "example.com", 443), ("http://93.184.216.34:8080/", "93.184.216.34", 8080),
    ("http://[2606:4700::1111]/x", "2606:4700::1111", 80), ("https://b\u00fccher.example/", "xn--bcher-kva.example", 443)])
def test_canonical_urls_parse_to_the_host_and_port_that_are_dialled(url: str, host: str,
                                                                     port: int) -> None:
    assert parse_url(url) == (host, port)


def test_stacked_and_unknown_encodings_are_refused_before_decoding() -> None:
    with pytest.raises(UnsupportedEncoding):
        Decoder(["gzip, gzip"])
    with pytest.raises(UnsupportedEncoding):
        Decoder(["gzip", "deflate"])
    with pytest.raises(UnsupportedEncoding):
        Decoder(["br"])
    assert Decoder(["identity"]).encoding == "" and Decoder([]).encoding == ""


@pytest.mark.parametrize("wbits", [zlib.MAX_WBITS, -zlib.MAX_WBITS])
def test_deflate_wrapped_or_raw_decodes(wbits: int) -> None:
    packer = zlib.compressobj(6, zlib.DEFLATED, wbits)
    body = b"<rss>" + b"x" * 10_000 + b"</rss>"
    raw = packer.compress(body) + packer.flush()
    chunks = [raw[i:i + 100] for i in range(0, len(raw), 100)]
    assert read_capped(chunks, Decoder(["deflate"]), 20_000, truncate=False) == (body, True)


def test_a_bomb_is_stopped_at_the_cap_plus_one_byte_per_step() -> None:
    bomb = gzip.compress(bytes(20_000_000))
    decoder = Decoder(["gzip"])
    assert len(decoder.decode(bomb, 1000)) == 1001, "never more than room + 1 at a time"
    with pytest.raises(TooLarge):
        read_capped([gzip.compress(bytes(20_000_000))], Decoder(["gzip"]), 1 << 20,
                    truncate=False)
    body, whole = read_capped([bomb], Decoder(["gzip"]), 5000, truncate=True)
    assert (len(body), whole) == (5000, False)


def test_a_body_that_does_not_decode_is_a_typed_refusal() -> None:
    with pytest.raises(UnsupportedEncoding):
        read_capped([b"not gzip at all"], Decoder(["gzip"]), 1000, truncate=False)


@pytest.mark.parametrize("chunk", [1, 7, 100, 1 << 20])
def test_every_gzip_member_is_read_whatever_the_chunks(chunk: int) -> None:
    parts = [b"<rss>" + b"a" * 3000, b"b" * 5000, b"c" * 10 + b"</rss>"]
    raw = b"".join(gzip.compress(part) for part in parts)
    chunks = [raw[i:i + chunk] for i in range(0, len(raw), chunk)]
    assert read_capped(chunks, Decoder(["gzip"]), 20_000, truncate=False) == (
        b"".join(parts), True)
    # the cap holds across members: the second member's bytes count against it
    with pytest.raises(TooLarge):
        read_capped(chunks, Decoder(["gzip"]), 8000, truncate=False)
    assert read_capped(chunks, Decoder(["gzip"]), 8000, truncate=True) == (
        b"".join(parts)[:8000], False)


def test_a_body_cut_inside_a_member_or_trailing_garbage_is_refused_never_cut_short() -> None:
    raw = gzip.compress(b"<rss>" + b"x" * 5000 + b"</rss>")
    with pytest.raises(UnsupportedEncoding, match="ends inside a member"):
        read_capped([raw[:len(raw) // 2]], Decoder(["gzip"]), 20_000, truncate=False)
    with pytest.raises(UnsupportedEncoding, match="does not decode"):
        read_capped([raw + b"trailing junk"], Decoder(["gzip"]), 20_000, truncate=False)
    packer = zlib.compressobj(6, zlib.DEFLATED, zlib.MAX_WBITS)
    deflated = packer.compress(b"x" * 100) + packer.flush()
    with pytest.raises(UnsupportedEncoding, match="after its end"):
        read_capped([deflated + deflated], Decoder(["deflate"]), 20_000, truncate=False)
    assert read_capped([], Decoder(["gzip"]), 100, truncate=False) == (b"", True)
