"""Injected defects, to prove the invariants catch what they are for whatever Sluice's
own code does (``--inject NAME``; tests switch them on).

A rogue producer enqueues copies of a match through the delivery store, as a producer
that re-reads its data without an effect record would, each with a fresh idempotency key:

- ``resend-after-retention``: 8 days after a match was received (past the default
  7-day delivery retention), it is enqueued again;
- ``undo-purge``: right after the operator purges a match, it is enqueued again;
- ``repeat-late``: when a receiver got a message whose sender saw a timeout, two more
  copies are enqueued (a retrier that re-posts unknown outcomes).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

INJECTIONS = ("resend-after-retention", "undo-purge", "repeat-late")
RETENTION_LIKE = timedelta(days=8)


class Rogue:
    def __init__(self, name: str | None) -> None:
        if name is not None and name not in INJECTIONS:
            raise SystemExit(f"--inject: unknown {name!r}; known: {', '.join(INJECTIONS)}")
        self.name = name
        self.sequence = 0

    def enqueue_copy(self, services: Any, entry_like: dict[str, Any]) -> None:
        from shared.delivery.store import DeliveryStore

        self.sequence += 1
        DeliveryStore(services.db).enqueue(
            entry_like["channel"], entry_like["recipient"], entry_like["payload"],
            idempotency_key=f"rogue-{self.sequence}")
