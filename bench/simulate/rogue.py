"""Injected defects, to prove the invariants catch what they are for whatever Sluice's
own code does (``--inject NAME``; tests switch them on).

A rogue producer enqueues copies of a match through the delivery store, as a producer
that re-reads its data without an effect record would, each with a fresh idempotency key:

- ``resend-after-retention``: 8 days after a match was received (past the default
  7-day delivery retention), it is enqueued again;
- ``undo-purge``: right after the operator purges a match, it is enqueued again;
- ``repeat-late``: when a receiver got a message whose sender saw a timeout, two more
  copies are enqueued (a retrier that re-posts unknown outcomes).

And a rogue biller: ``meter-twice`` writes a second metering outbox row for every tenth
accepted AI call, under an id of its own (a producer that meters a call again without
deriving the event's ``external_id`` from the ledger id): Polar counts it twice.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

INJECTIONS = ("resend-after-retention", "undo-purge", "repeat-late", "meter-twice")
RETENTION_LIKE = timedelta(days=8)


class Rogue:
    def __init__(self, name: str | None) -> None:
        if name is not None and name not in INJECTIONS:
            raise SystemExit(f"--inject: unknown {name!r}; known: {', '.join(INJECTIONS)}")
        self.name = name
        self.sequence = 0

    def enqueue_copy(self, services: Any, entry_like: dict[str, Any]) -> None:
        from sluice.delivery.store import DeliveryStore

        self.sequence += 1
        DeliveryStore(services.db).enqueue(
            entry_like["channel"], entry_like["recipient"], entry_like["payload"],
            idempotency_key=f"rogue-{self.sequence}")

    def meter_again(self, services: Any, entry_id: str) -> bool:
        """``meter-twice``: a second outbox row for every tenth call (True when written)."""
        from sluice.billing.usage import Q, UsageEntry, metering_row
        from sluice.store.db import utcnow

        if self.name != "meter-twice":
            return False
        self.sequence += 1
        if self.sequence % 10:
            return False
        with services.db.transaction() as tx:
            row = tx.fetchone("SELECT * FROM ai_usage_ledger WHERE id = :id", {"id": entry_id})
            if row is None:
                return False
            entry = UsageEntry(id=row["id"], model=row["model"],
                               occurred_at=row["occurred_at"], tenant_id=row["tenant_id"],
                               user_id=row["user_id"], input_tokens=row["input_tokens"],
                               output_tokens=row["output_tokens"])
            outbox = metering_row(entry)
            if outbox is None:
                return False
            outbox["id"] = f"rogue-{self.sequence}:metering"
            tx.execute(Q.insert_outbox_rows, {"rows": tx.json([outbox]), "now": utcnow()})
        return True
