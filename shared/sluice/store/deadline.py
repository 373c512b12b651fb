"""The run's deadline, as the store sees it: no statement starts past it, and no wait on a
connection outlives it.

Server-side timeouts (``statement_timeout``, Redis's own) do not help when the network
between client and server stops forwarding: the server never sees the statement, the
client waits for an answer that never comes, and TCP keepalives may still be answered by
a middlebox in between. So the bound is on the client: while a store call waits on a
connection inside ``bounded_by``, a watchdog thread holds a callback that shuts that
connection's socket down at the deadline. ``shutdown`` (unlike ``close``) is safe from
another thread: the blocked ``recv`` returns end-of-file, the driver raises its
connection error, and the store boundary turns it into ``TransientStoreError``.
"""

from __future__ import annotations

import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from sluice.core.errors import TransientStoreError

# Seconds a store call may still take, set by whoever owns a deadline (a job run).
_TIME_LEFT: ContextVar[Callable[[], float] | None] = ContextVar("sluice_time_left", default=None)


@contextmanager
def bounded_by(time_left: Callable[[], float]) -> Iterator[None]:
    """Bound every store call made inside by ``time_left()`` seconds: Postgres statements
    and lock waits get it as their timeouts, and a connection still waited on when it runs
    out is abandoned (its socket shut down)."""
    token = _TIME_LEFT.set(time_left)
    try:
        yield
    finally:
        _TIME_LEFT.reset(token)


@contextmanager
def reserving(share: float) -> Iterator[None]:
    """Inside the current bound (if any), keep ``share`` of the time left now for what
    comes after the block: the block's store calls are bounded by the rest."""
    bound = _TIME_LEFT.get()
    if bound is None:
        yield
        return
    kept = max(0.0, bound()) * share
    with bounded_by(lambda: bound() - kept):
        yield


def time_left() -> float | None:
    """Seconds left to the current bound, or None outside any."""
    bound = _TIME_LEFT.get()
    return None if bound is None else bound()


def statement_budget_ms(default_s: float) -> int:
    """Milliseconds the next transaction's statements may take (at least 1: 0 means none)."""
    bound = _TIME_LEFT.get()
    seconds = default_s if bound is None else min(default_s, bound())
    if seconds <= 0:
        raise TransientStoreError("the run's time is up: no statement is started past it")
    return max(1, int(seconds * 1000))


def shutdown_fd(fd: int) -> None:
    """Shut down the socket behind ``fd`` (both ways) without closing ``fd``, whose owner
    still uses it: the shutdown acts on the socket, so doing it through a duplicate
    wakes a ``recv`` blocked on the original."""
    dup = socket.socket(fileno=os.dup(fd))
    try:
        dup.shutdown(socket.SHUT_RDWR)
    finally:
        dup.close()


class Watch:
    """One store call being waited on: ``cancel`` runs at ``at`` unless the call ended
    first. ``fired`` tells the caller afterwards that its connection was cut and must not
    be reused."""

    __slots__ = ("_cancel", "_lock", "_on_end", "at", "done", "fired")

    def __init__(self, at: float, cancel: Callable[[], None],
                 on_end: Callable[[], None] | None = None) -> None:
        self.at = at
        self._cancel = cancel
        self._on_end = on_end
        self._lock = threading.Lock()
        self.done = False
        self.fired = False

    def fire(self) -> None:
        with self._lock:  # end() waits for a shutdown under way, so `fired` is final then
            if self.done:
                return
            self.fired = True
            self._on_end = None  # out of the watchdog's heap already: nothing to drop
            try:
                self._cancel()
            except OSError:
                pass  # already closed: nothing is waiting on it any more

    def end(self) -> None:
        with self._lock:
            if self.done:
                return
            self.done = True
            on_end = self._on_end
        if on_end is not None:
            on_end()


class _Watchdog:
    """One daemon thread per process firing the due watches.

    The watches wait in a heap by time. A store call's watch ends long before it is due
    (every call of a run is due at the run's deadline), so ended watches are dropped as
    they pile up: whenever they outnumber the live ones the heap is rebuilt from the live
    ones alone. The heap so never holds more than twice the calls in flight (plus a few),
    however many calls a run makes."""

    COMPACT_AT = 16  # below this many ended watches a rebuild is not worth its cost

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._ended = 0  # ended watches still in the heap
        self._seq = itertools.count()
        self._pid = -1

    def watch(self, at: float, cancel: Callable[[], None]) -> Watch:
        """A watch firing ``cancel`` at ``at`` (``time.monotonic`` seconds) unless ended."""
        watch = Watch(at, cancel, self._end)
        self.add(watch)
        return watch

    def add(self, watch: Watch) -> None:
        with self._cond:
            if self._pid != os.getpid():  # first use, or forked: threads do not survive fork
                self._pid = os.getpid()
                self._heap = []
                self._ended = 0
                threading.Thread(target=self._run, name="sluice-store-watchdog",
                                 daemon=True).start()
            heapq.heappush(self._heap, (watch.at, next(self._seq), watch))
            if self._heap[0][2] is watch:
                self._cond.notify()

    def _end(self) -> None:
        with self._cond:
            self._ended += 1
            if self._ended >= self.COMPACT_AT and self._ended * 2 > len(self._heap):
                self._heap = [item for item in self._heap if not item[2].done]
                heapq.heapify(self._heap)
                self._ended = 0

    def held(self) -> int:
        """Watches in the heap, ended ones not yet dropped included (what it costs)."""
        with self._cond:
            return len(self._heap)

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                    self._ended = max(0, self._ended - 1)
                if not self._heap:
                    self._cond.wait()
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                watch = heapq.heappop(self._heap)[2]
            watch.fire()


_WATCHDOG = _Watchdog()

# The cut comes this long after the bound: a server that still answers ends its statement
# by the bound itself (its statement and lock timeouts come from the same time left), and
# its answer, a clean error on a connection still usable, should win the race.
CUT_GRACE_S = 0.25
_UNWATCHED = Watch(float("inf"), lambda: None)


class abandon_at_deadline:  # lower case: read as a context manager, like contextlib's
    """``with abandon_at_deadline(cancel) as watch:`` around a wait on one connection:
    ``cancel`` (a socket shutdown) runs if the current bound runs out first. Outside any
    bound nothing is watched; with no time left the call is refused before it starts."""

    __slots__ = ("_cancel", "_watch")

    def __init__(self, cancel: Callable[[], None]) -> None:
        self._cancel = cancel

    def __enter__(self) -> Watch:
        left = time_left()
        if left is None:
            self._watch = _UNWATCHED
            return _UNWATCHED
        if left <= 0:
            raise TransientStoreError("the run's time is up: no store call is started past it")
        self._watch = watch = _WATCHDOG.watch(time.monotonic() + left + CUT_GRACE_S,
                                              self._cancel)
        return watch

    def __exit__(self, *exc: object) -> None:
        self._watch.end()
