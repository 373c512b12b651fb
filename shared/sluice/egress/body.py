"""Reading an answer's body with a cap on DECODED bytes, whatever the peer sends.

The HTTP library decodes each chunk in full before anyone counts it, so a few hundred
bytes of ``Content-Encoding: gzip, gzip`` grow into hundreds of megabytes. Here the raw
stream is decoded incrementally with ``zlib``'s ``max_length``: no call produces more
than the room left under the cap plus one byte, so memory stays within the cap plus one
raw chunk whatever the compression ratio.

A gzip body may be several members one after another (RFC 1952): each is decoded in
turn under the same cap. A body that ends inside a member, or goes on after a deflate
stream, is refused as ``UnsupportedEncoding``: never read as if it were whole.

One encoding is decoded (``gzip``, ``deflate``, or none); stacked encodings
(``gzip, gzip``) and unknown ones (``br``, ``zstd``, which Sluice never asks for) are
refused as ``UnsupportedEncoding``: no legitimate feed or API stacks them, and refusing
keeps the decoder one small loop.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator

from sluice.egress.errors import TooLarge, UnsupportedEncoding

IDENTITY = frozenset({"", "identity"})
GZIP = frozenset({"gzip", "x-gzip"})


class Decoder:
    """Decodes one content encoding, never more than it is allowed to produce."""

    def __init__(self, encodings: Iterable[str]) -> None:
        names = [e.strip().lower() for value in encodings for e in value.split(",")]
        names = [e for e in names if e not in IDENTITY]
        if len(names) > 1:
            raise UnsupportedEncoding(f"stacked content encodings ({', '.join(names)}) "
                                      "are not decoded")
        self.encoding = names[0] if names else ""
        if self.encoding and self.encoding not in GZIP and self.encoding != "deflate":
            raise UnsupportedEncoding(f"content encoding {self.encoding[:40]!r} is not decoded")
        self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS) if self.encoding in GZIP else None
        self._fed = False  # an empty body (a HEAD, a 204) has no member to end

    def decode(self, data: bytes, room: int) -> bytes:
        """At most ``room + 1`` decoded bytes of ``data`` (one more than the room: the
        caller knows the cap was passed without decoding the rest)."""
        if not self.encoding:
            return data[:room + 1]
        self._fed = self._fed or bool(data)
        if self._zlib is None:  # deflate: zlib-wrapped as the RFC says, or raw as some send
            wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
        pieces, produced = [], 0
        try:
            while produced <= room:
                if self._zlib.eof:  # a member ended: what follows starts the next one
                    data = self._zlib.unused_data + data
                    if not data:
                        break
                    if self.encoding not in GZIP:
                        raise UnsupportedEncoding("the deflate body goes on after its end")
                    self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
                piece = self._zlib.decompress(data, room + 1 - produced)
                pieces.append(piece)
                produced += len(piece)
                data = self._zlib.unconsumed_tail
                if not data and not self._zlib.eof:
                    break  # the rest of this member is in the next chunk
        except zlib.error as exc:
            raise UnsupportedEncoding(f"the {self.encoding} body does not decode: {exc}"
                                      ) from None
        return b"".join(pieces)

    def finish(self) -> None:
        """The body ended: refused unless its last member ended too."""
        if self._zlib is not None and self._fed and not self._zlib.eof:
            raise UnsupportedEncoding(f"the {self.encoding} body ends inside a member")


def read_capped(raw: Iterable[bytes], decoder: Decoder, max_bytes: int, *,
                truncate: bool) -> tuple[bytes, bool]:
    """The decoded body, and whether it is whole. Past ``max_bytes``: ``TooLarge``, or with
    ``truncate`` the first ``max_bytes`` and False."""
    chunks: list[bytes] = []
    size = 0
    for data in _nonempty(raw):
        out = decoder.decode(data, max_bytes - size)
        size += len(out)
        if size > max_bytes:
            if truncate:
                chunks.append(out[:len(out) - (size - max_bytes)])
                return b"".join(chunks), False
            raise TooLarge(f"the answer is over the {max_bytes} byte limit")
        chunks.append(out)
    decoder.finish()
    return b"".join(chunks), True


def _nonempty(raw: Iterable[bytes]) -> Iterator[bytes]:
    return (data for data in raw if data)
