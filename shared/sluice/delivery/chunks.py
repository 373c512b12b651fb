"""Resumable chunks: what a chunked entry already got through, kept in the store.

A long message goes out as several platform messages (``sluice.delivery.chunking``). Each
chunk the platform accepts is recorded with its message id (``delivery_chunks``) as its
answer comes, before the next chunk is sent, so when a later chunk fails (transiently, a
429, an outage) the entry's next send resumes after the recorded ones: an accepted chunk
is never sent again. A chunk whose request left without an answer is not recorded: the
entry's outcome is unknown, and the unknown rule decides whether that chunk goes again
(``DeliveryStore.nack``), never a blind resend. So does a chunk accepted whose record the
store refused (``OutcomeUnknown``).

Each chunk takes its own rate slot: the send's first chunk uses the slot the drain took
before the send, every later one takes another (waiting for it in process up to
``SLUICE_DELIVERY_RATE_WAIT_SECONDS`` beyond the interval of the entry's narrowest rate,
which the chunk before it just used), as an in-process retry does
(``Limiter.further``). No slot in time ends the send with ``NoRateSlot``: the entry is set
aside until the slot, its attempt given back, and resumes there.
"""

from __future__ import annotations

from datetime import datetime

from sluice.core.crash import crash_point
from sluice.core.errors import StoreError
from sluice.delivery.classify import OutcomeUnknown
from sluice.delivery.ratelimit import Limiter
from sluice.delivery.store import DeliveryEntry
from sluice.store.db import Database, load_queries, utcnow

Q = load_queries("chunks")


class ChunkLog:
    """The accepted chunks of every chunked entry (rows go with their entry)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def accepted(self, entry_id: str) -> dict[int, str | None]:
        """Chunk index -> platform message id (None: refused for good and skipped)."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.chunks_of, {"entry_id": entry_id})
        return {int(row["chunk"]): row["message_id"] for row in rows}

    def record(self, entry_id: str, chunk: int, message_id: str | None, *,
               now: datetime | None = None) -> None:
        with self.db.transaction() as tx:
            tx.execute(Q.chunk_accepted, {"entry_id": entry_id, "chunk": chunk,
                                          "message_id": message_id, "now": now or utcnow()},
                       final=True)


class SendProgress:
    """One send of one entry: its recorded chunks, a slot per further chunk (the limiter's,
    within the send's ``Limiter.sending``), each acceptance recorded."""

    def __init__(self, log: ChunkLog, entry: DeliveryEntry, limiter: Limiter | None) -> None:
        self.log = log
        self.entry = entry
        self.limiter = limiter

    def done(self) -> dict[int, str | None]:
        return self.log.accepted(self.entry.id)

    def slot(self) -> None:
        if self.limiter is not None:
            self.limiter.further("next chunk")

    def took(self, chunk: int, message_id: str | None) -> None:
        try:
            self.log.record(self.entry.id, chunk, message_id)
        except StoreError as exc:
            # The platform has this chunk and nothing says so: sending it again is the
            # unknown rule's decision, never a retry's.
            raise OutcomeUnknown(f"{self.entry.channel}: chunk {chunk} was accepted "
                                 f"(message {message_id}) but could not be recorded: "
                                 f"{exc}") from exc
        crash_point("delivery.after_chunk")


__all__ = ["ChunkLog", "SendProgress"]
