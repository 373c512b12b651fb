"""Many settled entries at once, through the queue's own insert statement (keys decided as
an enqueue decides them), for tests whose subject is what thousands of entries cost."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta

from sluice.delivery.keys import keys_for
from sluice.store.db import Database, load_queries, utcnow

Q = load_queries("delivery")


def insert_failed(db: Database, recipients: Iterable[tuple[str, str]], *,
                  now: datetime | None = None) -> list[str]:
    """One entry failed for good (a permanent refusal, one attempt) per ``(channel,
    recipient)``, each enqueued a microsecond before the last, in one transaction; their ids."""
    now = now or utcnow()
    rows = []
    for i, (channel, recipient) in enumerate(recipients):
        keys = keys_for(channel, recipient)
        at = now - timedelta(microseconds=i)
        rows.append({"id": str(uuid.uuid4()), "channel": channel, "recipient": recipient,
                     "subject_user_id": None, "payload": {"text": f"bulk {i}"},
                     "idempotency_key": None, "status": "failed", "attempts": 1,
                     "next_attempt_at": at, "lease_until": None, "now": at,
                     "destination": keys.destination, "receiver": keys.receiver,
                     "trace_context": None})
    with db.transaction() as tx:
        tx.executemany(Q.insert_entry, [{**row, "payload": tx.json(row["payload"])}
                                        for row in rows])
        tx.execute("UPDATE delivery_queue SET failure_reason = 'permanent', failed_at = :now, "
                   "last_error = 'refused' WHERE status = 'failed' AND failure_reason IS NULL",
                   {"now": now})
    return [row["id"] for row in rows]
