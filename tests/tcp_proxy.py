"""A loopback TCP proxy that can stop forwarding: the network between Sluice and its store
partitioned, while both ends' sockets stay open (as behind a middlebox that still answers
keepalives); or cut: every connection made so far closed at both ends, as a restarted
server or a dropped NAT entry does, new ones forwarded as before."""

from __future__ import annotations

import select
import socket
import threading
from types import TracebackType
from typing import Self


class StallingProxy:
    """Forwards ``127.0.0.1:<port>`` to ``upstream`` until ``stall()``; from then on it
    accepts and holds connections, old and new, but passes no byte either way."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        self._forwarded: list[socket.socket] = []  # the connections a cut closes
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def stall(self) -> None:
        self._stalled.set()

    def cut(self) -> None:
        """End every connection forwarded so far, both ways; the next ones go through."""
        with self._lock:
            cut, self._forwarded = self._forwarded, []
        for sock in cut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # the peer went first

    def _accept(self) -> None:
        while not self._closed.is_set():
            ready, _, _ = select.select([self._listener], [], [], 0.05)
            if not ready:
                continue
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self._stalled.is_set():
                continue  # held open, never forwarded
            server = socket.create_connection(self.upstream, timeout=5)
            self._sockets.append(server)
            with self._lock:
                self._forwarded += [client, server]
            for source, sink in ((client, server), (server, client)):
                thread = threading.Thread(target=self._pump, args=(source, sink), daemon=True)
                self._threads.append(thread)
                thread.start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self._closed.is_set():
            if self._stalled.is_set():
                self._closed.wait(0.05)
                continue
            ready, _, _ = select.select([source], [], [], 0.05)
            if not ready or self._stalled.is_set():
                continue
            try:
                data = source.recv(65536)
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._closed.set()
        for thread in self._threads:
            thread.join(timeout=5)
        for sock in self._sockets:
            sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
