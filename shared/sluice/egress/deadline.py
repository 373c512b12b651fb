"""A total deadline for every HTTP request, headers included.

The HTTP library times each socket operation, not the request: a server that sends one
byte a second never trips a read timeout. Here every connect, read, write and TLS
handshake waits at most ``min(its own timeout, time left)`` and raises once the deadline
has passed, so a request ends by its deadline whatever the peer does. The deadline is
the calling thread's (a context variable set around each request by ``Egress``), so one
pool serves threads with different deadlines; pooled connections read it afresh.

Name resolution runs under the deadline too, and the socket connects to an address the
destination's ``AddressGuard`` accepted.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import httpcore

from sluice.core.shutdown import SHUTDOWN
from sluice.egress.guard import AddressGuard

_deadline: ContextVar[float | None] = ContextVar("egress_deadline", default=None)


@contextmanager
def deadline_at(at: float) -> Iterator[None]:
    """Every socket operation in this block ends by ``at`` (``time.monotonic`` seconds);
    nested blocks never extend an outer deadline."""
    outer = _deadline.get()
    token = _deadline.set(at if outer is None else min(at, outer))
    try:
        yield
    finally:
        _deadline.reset(token)


def time_left(timeout: float | None, expired: type[Exception]) -> float | None:
    """``timeout`` cut to the time left before the current deadline; ``expired`` once past."""
    at = _deadline.get()
    if at is None:
        return timeout
    left = at - time.monotonic()
    if left <= 0:
        raise expired("the deadline passed")
    return left if timeout is None else min(timeout, left)


# A read waits in slices this long, so a shutdown (SIGTERM: Lambda stops the environment
# 500 ms later) ends a request in flight at once instead of when its answer comes.
SHUTDOWN_SLICE_S = 0.2


class DeadlineStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self.inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            left = time_left(None if end is None else max(0.0, end - time.monotonic()),
                             httpcore.ReadTimeout)
            if left is not None and left <= 0:
                raise httpcore.ReadTimeout("timed out")
            try:
                return self.inner.read(max_bytes, SHUTDOWN_SLICE_S if left is None
                                       else min(left, SHUTDOWN_SLICE_S))
            except httpcore.ReadTimeout:
                if SHUTDOWN.is_set():
                    raise httpcore.ReadTimeout("shutting down: the answer was not awaited")
                if left is not None and left <= SHUTDOWN_SLICE_S:
                    raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.inner.write(buffer, time_left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self.inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        # the handshake as a whole is bounded by the timeout it is given (CPython's ssl
        # keeps one deadline across the handshake's reads)
        return DeadlineStream(self.inner.start_tls(
            ssl_context, server_hostname, time_left(timeout, httpcore.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self.inner.get_extra_info(info)


class DeadlineBackend(httpcore.SyncBackend):
    """Resolves under the deadline, connects only to addresses ``guard`` accepted (to the
    very address it checked), and hands out streams that keep to the deadline."""

    def __init__(self, guard: AddressGuard) -> None:
        self.guard = guard

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None,
                    socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        addresses = self.guard.addresses(host, port,
                                         time_left(timeout, httpcore.ConnectTimeout))
        last: Exception | None = None
        for address in addresses:
            try:
                stream = super().connect_tcp(
                    address, port, timeout=time_left(timeout, httpcore.ConnectTimeout),
                    local_address=local_address, socket_options=socket_options)
            except httpcore.ConnectError as exc:  # this address refused: try the next one
                last = exc
                continue
            return DeadlineStream(stream)
        assert last is not None
        raise last

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None
                            ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not a destination")
