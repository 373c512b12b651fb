"""Store outages, injected where Sluice meets its stores.

- ``store_down``: every transaction Sluice opens on its SQL store fails with the error an
  unreachable database gives (``TransientStoreError``), as SQLite's "unable to open
  database file" and a Postgres connection refused are translated at the store boundary;
- ``redis_down``: every command on Sluice's Redis client fails the same way (a refused
  connection, as ``sluice.store.redis_clients`` translates it);
- a ``store_down`` window in ``hung`` is a partition instead: the server never answers, so
  each transaction waits for as long as its caller's bound allows (``bounded_by``: a job
  run's time left, an app call's request path), or, unbounded, until the window ends,
  then fails as the abandoned connection does (``TransientStoreError``).

A window may be *armed at a point* (``arm``): it is in the world from the start (every
bound the invariants compute counts it as an outage), but the store only goes away once
the code reaches that named point inside it (``reached``, called from every crash point),
then stays away until the window ends: a fault that coincides with a step on purpose (the
store dropping right after ledger-redrive claimed its entries from Redis).

The simulation's own reads (its scheduler's checks, the invariants' reads, the
operator's view) go through ``harness()``, which sees the stores as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from bench.simulate.peers import Peer, Window


class Outages:
    def __init__(self, windows: Peer, now: Callable[[], datetime],
                 armed: dict[Window, str] | None = None,
                 hung: set[Window] | None = None) -> None:
        self.hung = hung or set()
        self.windows = windows
        self.now = now
        self.bypass = 0
        self.refused = {"store_down": 0, "redis_down": 0}
        self.armed = dict(armed or {})  # window -> the point that begins it
        self.triggered: set[Window] = set()

    def down(self, kind: str) -> bool:
        if self.bypass:
            return False
        window = self.windows.window(self.now())
        if window is None or window.kind != kind:
            return False
        if window in self.armed and window not in self.triggered:
            return False
        self.refused[kind] += 1
        return True

    def wait_if_hung(self) -> None:
        """In a partition, the caller waits for its bound (or the window's end)."""
        import time

        from sluice.store.deadline import time_left

        window = self.windows.window(self.now())
        if window is None or window not in self.hung:
            return
        until_end = (window.end - self.now()).total_seconds()
        left = time_left()
        time.sleep(max(0.0, until_end if left is None else min(left, until_end)))

    def reached(self, point: str) -> None:
        """The code reached ``point``: an outage armed at it, in its window, begins."""
        window = self.windows.window(self.now())
        if window is not None and self.armed.get(window) == point:
            self.triggered.add(window)

    @contextmanager
    def live(self) -> Iterator[None]:
        """The stores as Sluice sees them, inside the harness (an app's call from an
        event step)."""
        saved, self.bypass = self.bypass, 0
        try:
            yield
        finally:
            self.bypass = saved

    @contextmanager
    def harness(self) -> Iterator[None]:
        self.bypass += 1
        try:
            yield
        finally:
            self.bypass -= 1

    @contextmanager
    def installed(self) -> Iterator[None]:
        from sluice.core.errors import TransientStoreError
        from sluice.store import db

        originals = {db._SqliteTransaction: db._SqliteTransaction.__enter__,
                     db._PgTransaction: db._PgTransaction.__enter__}
        outages = self

        def patched(original: Any, message: str) -> Any:
            def enter(transaction: Any) -> Any:
                if outages.down("store_down"):
                    outages.wait_if_hung()
                    raise TransientStoreError(message)
                return original(transaction)
            return enter

        db._SqliteTransaction.__enter__ = patched(  # type: ignore[method-assign]
            originals[db._SqliteTransaction],
            "sqlite: unable to open database file (simulated outage)")
        db._PgTransaction.__enter__ = patched(  # type: ignore[method-assign]
            originals[db._PgTransaction],
            "postgres: connection refused (simulated outage)")
        try:
            yield
        finally:
            for kind, original in originals.items():
                kind.__enter__ = original  # type: ignore[method-assign]


class FlakyRedis:
    """Sluice's Redis client, refusing every command while Redis is down."""

    def __init__(self, client: Any, outages: Outages) -> None:
        self._client = client
        self._outages = outages

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name in ("key", "close"):
            return attr
        outages = self._outages

        def call(*args: Any, **kwargs: Any) -> Any:
            if outages.down("redis_down"):
                from sluice.core.errors import TransientStoreError

                raise TransientStoreError("redis: Error 111 connecting to 127.0.0.1:6379. "
                                          "Connection refused (simulated outage)")
            return attr(*args, **kwargs)

        return call
