"""A misbehaving HTTP peer on 127.0.0.1, one behaviour per path.

``/trickle-headers``  the status line and headers, one byte every ``drip_s``, forever
``/trickle-body``     headers at once, then the body one byte every ``drip_s``, forever
``/silent``           reads the request and never answers
``/gzip-gzip``        ``Content-Encoding: gzip, gzip``: a few hundred bytes that decode to
                      ``bomb_mb`` MiB of zeros through two layers
``/gzip-bomb``        one gzip layer of ``bomb_mb`` MiB of zeros
``/huge``             ``huge_bytes`` of feed-like text with ``Content-Length``
``/huge-close``       the same without ``Content-Length`` (ended by closing)
``/redirect?to=URL``  302 to ``URL``
"""

from __future__ import annotations

import gzip
import socket
import socketserver
import threading
import zlib
from functools import cache
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit


@cache
def zeros_gzipped(megabytes: int) -> bytes:
    """``megabytes`` MiB of zeros, gzipped (about 1 KB per MiB), built without holding them."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join([*(packer.compress(zeros) for _ in range(megabytes)), packer.flush()])


class HostilePeer:
    def __init__(self, *, drip_s: float = 0.1, bomb_mb: int = 64,
                 huge_bytes: int = 30_000_000) -> None:
        self.drip_s = drip_s
        self.huge_bytes = huge_bytes
        self.hits: dict[str, int] = {}
        self.stopping = threading.Event()
        self.bomb_mb = bomb_mb
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()

    def _serve(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        target = data.split(b" ", 2)[1].decode()
        parts = urlsplit(target)
        self.hits[parts.path] = self.hits.get(parts.path, 0) + 1
        try:
            self._answer(conn, parts.path, parse_qs(parts.query))
        except OSError:
            pass  # the client gave up: what these peers are for

    def _drip(self, conn: socket.socket, data: bytes, *, forever: bool) -> None:
        while not self.stopping.is_set():
            for byte in data:
                if self.stopping.wait(self.drip_s):
                    return
                conn.sendall(bytes([byte]))
            if not forever:
                return
            data = b"x"

    def _answer(self, conn: socket.socket, path: str, query: dict[str, Any]) -> None:
        if path == "/trickle-headers":
            self._drip(conn, b"HTTP/1.1 200 OK\r\nContent-Type: application/rss+xml\r\nX-Pad: ",
                       forever=True)
        elif path == "/trickle-body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n<rss>")
            self._drip(conn, b"<", forever=True)
        elif path == "/silent":
            self.stopping.wait(60)
        elif path in ("/gzip-bomb", "/gzip-gzip"):
            body = zeros_gzipped(self.bomb_mb)
            if path == "/gzip-gzip":
                body = gzip.compress(body, compresslevel=9)
            encoding = "gzip, gzip" if path == "/gzip-gzip" else "gzip"
            conn.sendall(f"HTTP/1.1 200 OK\r\nContent-Encoding: {encoding}\r\n"
                         f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        elif path in ("/huge", "/huge-close"):
            length = f"Content-Length: {self.huge_bytes}\r\n" if path == "/huge" else ""
            conn.sendall(f"HTTP/1.1 200 OK\r\n{length}Connection: close\r\n\r\n".encode())
            line = b"<item><title>x</title></item>\n" * 2000
            sent = 0
            while sent < self.huge_bytes and not self.stopping.is_set():
                conn.sendall(line)
                sent += len(line)
        elif path == "/redirect":
            to = query["to"][0]
            # one request a connection, and said so: a client never reuses a closing socket
            conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n".encode())
        else:
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
