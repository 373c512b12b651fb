"""A loopback TCP proxy that can pass traffic on, reset connections, or hang them.

``pass``: bytes go both ways to the upstream stand-in. ``reset``: the request is read
and the connection closed with an RST (SO_LINGER 0). ``hang``: the request is read and
never answered until the mode changes or the proxy closes.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
from typing import Literal, Self

Mode = Literal["pass", "reset", "hang"]


class FaultProxy:
    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.mode: Mode = "pass"
        self.connections = 0
        self._changed = threading.Event()
        self._closed = threading.Event()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def set(self, mode: Mode) -> None:
        self.mode = mode
        self._changed.set()
        self._changed = threading.Event()

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        self._changed.set()
        self._thread.join(timeout=5)
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn, self.mode, self._changed),
                             daemon=True).start()

    def _serve(self, conn: socket.socket, mode: Mode, changed: threading.Event) -> None:
        with conn:
            if mode == "reset":
                conn.settimeout(2)
                try:
                    conn.recv(65536)
                except OSError:
                    pass
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            if mode == "hang":
                changed.wait()
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                return
            with upstream:
                self._pump(conn, upstream)

    def _pump(self, a: socket.socket, b: socket.socket) -> None:
        peers = {a: b, b: a}
        while not self._closed.is_set():
            ready, _, _ = select.select(list(peers), [], [], 0.2)
            for sock in ready:
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                peers[sock].sendall(data)
