"""The write-ahead delivery queue: an outbound message is stored before it is sent.

``enqueue`` writes the entry (``pending``, or ``in_flight`` under a lease for the
inline path that sends it at once); ``claim`` takes due ``pending`` entries
``in_flight`` under a lease and counts the attempt; the sender then settles the
entry with exactly one of ``ack`` (platform message id, duration), ``nack``
(transient: back to ``pending`` at the next time of ``RetrySchedule``, or
``failed`` on the last attempt), ``fail`` (permanent) or ``release`` (nothing judged
the entry: back to ``pending`` with the attempt given back). Each settle is one
UPDATE guarded by ``in_flight`` and the attempt it claimed, so it is whole or
nothing, and a sender whose lease lapsed cannot overwrite the next one's work.
``recover`` returns lapsed leases to ``pending``; ``expire`` fails pending entries
past the expiry (reason ``expired``); ``prune`` deletes old settled entries. Admins
list, show, redrive and purge failed entries.

A send whose outcome is unknown (the request left, no answer came) is never resent
blindly: a channel that deduplicates (webhooks, by ``Idempotency-Key``) retries it
within the attempt limit; any other channel gets at most ``unknown_resends`` more
sends, then the entry rests in ``unknown`` until an operator marks it delivered,
sends it again or purges it. A lapsed lease is an unknown outcome too.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, NamedTuple

from sluice.core.errors import Conflict, NotFound, RequestError, TransientStoreError
from sluice.core.times import iso_z_or_none
from sluice.store.db import Database, Query, Row, load_queries, utcnow

Q = load_queries("delivery")

MAX_LIST = 500
MAX_KEY_LENGTH = 256
KEYS_PER_READ = 500  # keys per statement of a set lookup (bounded statements, any sweep size)


class DeliveryStatus(StrEnum):
    PENDING = "pending"
    IN_FLIGHT = "in_flight"
    ACKED = "acked"
    FAILED = "failed"
    UNKNOWN = "unknown"  # sent, no answer, and not to be sent again without an operator


class FailureReason(StrEnum):
    PERMANENT = "permanent"
    MAX_ATTEMPTS = "max_attempts"
    LEASE_LOST = "lease_lost"
    EXPIRED = "expired"


class RetryDecision(NamedTuple):
    retry: bool
    delay: timedelta  # zero when not retrying


class RetrySchedule(NamedTuple):
    """Delays between attempts, as data: attempt 1 failed -> wait ``delays_s[0]``, and so on,
    the last delay repeating (the cap); after ``max_attempts`` attempts the entry fails."""

    delays_s: tuple[float, ...] = (5.0, 25.0, 120.0, 600.0)
    max_attempts: int = 5

    def decide(self, attempts: int, retry_after_s: float | None = None) -> RetryDecision:
        """What to do after ``attempts`` failed attempts (a provider's ``retry_after`` can
        only lengthen the wait, never shorten it). The limit holds for every outcome."""
        if attempts >= self.max_attempts:
            return RetryDecision(False, timedelta(0))
        delay = self.delays_s[min(max(attempts, 1), len(self.delays_s)) - 1]
        if retry_after_s is not None:
            delay = max(delay, min(retry_after_s, self.delays_s[-1]))
        return RetryDecision(True, timedelta(seconds=delay))

    def table(self) -> list[tuple[int, float | None]]:
        """(failed attempt, seconds until the next one; None = failed for good)."""
        return [(n, d.delay.total_seconds() if d.retry else None)
                for n in range(1, self.max_attempts + 1) for d in (self.decide(n),)]


DEFAULT_SCHEDULE = RetrySchedule()

_TIMES = ("next_attempt_at", "lease_until", "enqueued_at", "updated_at", "acked_at", "failed_at")


def _typed(row: Row) -> Row:
    """A ``RETURNING *`` row as a ``SELECT`` gives it: an SQLite built without the declared
    types of RETURNING columns hands back their stored text."""
    if isinstance(row["payload"], str):
        row = {**row, "payload": json.loads(row["payload"])}
    for key in _TIMES:
        if isinstance(row[key], str):
            row = {**row, key: datetime.fromisoformat(row[key]).astimezone(UTC)}
    return row


iso = iso_z_or_none


class DeliveryEntry(NamedTuple):
    id: str
    channel: str
    recipient: str
    subject_user_id: str | None
    payload: dict[str, Any]
    idempotency_key: str | None
    status: DeliveryStatus
    attempts: int
    next_attempt_at: datetime
    lease_until: datetime | None
    last_error: str | None
    platform_message_id: str | None
    duration_ms: int | None
    enqueued_at: datetime
    updated_at: datetime
    acked_at: datetime | None
    failed_at: datetime | None
    failure_reason: str | None = None
    unknown_sends: int = 0
    held_by: str | None = None

    @classmethod
    def from_row(cls, row: Row) -> DeliveryEntry:
        return cls(**{**row, "status": DeliveryStatus(row["status"])})

    @property
    def dedupe_key(self) -> str:
        """What a receiver deduplicates on: the caller's key, else the entry id."""
        return self.idempotency_key or self.id

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id, "channel": self.channel, "recipient": self.recipient,
            "subjectUserId": self.subject_user_id, "payload": self.payload,
            "idempotencyKey": self.idempotency_key, "status": self.status.value,
            "attempts": self.attempts, "nextAttemptAt": iso(self.next_attempt_at),
            "leaseUntil": iso(self.lease_until), "lastError": self.last_error,
            "platformMessageId": self.platform_message_id, "durationMs": self.duration_ms,
            "enqueuedAt": iso(self.enqueued_at), "updatedAt": iso(self.updated_at),
            "ackedAt": iso(self.acked_at), "failedAt": iso(self.failed_at),
            "failureReason": self.failure_reason, "unknownSends": self.unknown_sends,
            "heldBy": self.held_by,
        }


def check_status(value: str | None) -> DeliveryStatus | None:
    if not value:
        return None
    try:
        return DeliveryStatus(value)
    except ValueError:
        raise RequestError(f"status must be one of {', '.join(s.value for s in DeliveryStatus)}, "
                           f"got {value!r}") from None


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIST:
        raise RequestError(f"limit must be between 1 and {MAX_LIST}, got {limit}")
    return limit


class Effect(NamedTuple):
    """The record that a producer's delivery happened (or was settled for good): written with
    the entry, kept after it is pruned, so the producer never enqueues that key again."""

    producer: str
    scope_id: str | None = None
    subject: str | None = None


class DeliveryStore:
    def __init__(self, db: Database, schedule: RetrySchedule = DEFAULT_SCHEDULE, *,
                 unknown_resends: int = 1) -> None:
        self.db = db
        self.schedule = schedule
        # More sends allowed after an unknown outcome, for channels that cannot deduplicate.
        self.unknown_resends = unknown_resends

    # --- the write-ahead path ------------------------------------------------------

    def enqueue(self, channel: str, recipient: str, payload: dict[str, Any], *,
                idempotency_key: str | None = None, subject_user_id: str | None = None,
                lease: timedelta | None = None, now: datetime | None = None,
                effect: Effect | None = None) -> tuple[DeliveryEntry, bool]:
        """Store an entry before its send; ``(entry, created)``.

        With ``lease`` the entry starts ``in_flight`` (attempt 1 claimed by the caller,
        who sends it now); without, ``pending`` and due at once. An ``idempotency_key``
        already stored returns that entry with ``created`` False, whatever its state.
        With ``effect`` (and a key) the effect record is written in the same transaction.
        """
        if not channel or not recipient:
            raise RequestError("a delivery needs a channel and a recipient")
        if not isinstance(payload, dict):
            raise RequestError("a delivery payload must be a JSON object")
        if idempotency_key is not None and not 0 < len(idempotency_key) <= MAX_KEY_LENGTH:
            raise RequestError(f"idempotency key must be 1 to {MAX_KEY_LENGTH} characters")
        now = now or utcnow()
        lease_until = now + lease if lease is not None else None
        status = DeliveryStatus.IN_FLIGHT if lease else DeliveryStatus.PENDING
        attempts = 1 if lease else 0
        for _ in range(3):
            entry_id = str(uuid.uuid4())
            with self.db.transaction() as tx:
                created = tx.execute(Q.insert_entry, {
                    "id": entry_id, "channel": channel, "recipient": recipient,
                    "subject_user_id": subject_user_id, "payload": tx.json(payload),
                    "idempotency_key": idempotency_key, "status": status.value,
                    "attempts": attempts, "next_attempt_at": lease_until or now,
                    "lease_until": lease_until, "now": now,
                }, final=effect is None) == 1
                if effect is not None and idempotency_key is not None:
                    tx.execute(Q.record_effect, {
                        "key": idempotency_key, "producer": effect.producer,
                        "scope_id": effect.scope_id, "subject": effect.subject,
                        "entry_id": entry_id if created else None, "now": now}, final=True)
            if created:  # the stored row is exactly these values: nothing to read back
                return DeliveryEntry(
                    entry_id, channel, recipient, subject_user_id, dict(payload),
                    idempotency_key, status, attempts, lease_until or now, lease_until,
                    None, None, None, now, now, None, None), True
            # Only the key conflicts (see insert_entry): that entry is the answer.
            with self.db.transaction() as tx:
                row = tx.fetchone(Q.get_by_key, {"key": idempotency_key}, final=True)
            if row is not None:
                return DeliveryEntry.from_row(row), False
            # Purged between the two statements: store this one after all.
        raise TransientStoreError(f"delivery key {idempotency_key!r} conflicts with an entry "
                                  "that is never there when read")

    def known_keys(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` are already stored (one read transaction): lets a caller that
        re-offers the same matches skip the write. ``enqueue`` stays the guard."""
        return {row["idempotency_key"] for row in self._among(Q.entry_keys_among, keys)}

    def known_effects(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have an effect record: enqueued once, never to be enqueued again
        (whether or not their entry still exists)."""
        return set(self.effects_seen(keys))

    def effects_seen(self, keys: list[str]) -> dict[str, datetime]:
        """The effect records among ``keys``: when each was last seen (``updated_at``)."""
        return {row["idempotency_key"]: row["updated_at"]
                for row in self._among(Q.effect_keys_among, keys)}

    def _among(self, query: Query, keys: list[str]) -> list[Row]:
        """The rows ``query`` finds for ``keys``: one statement per ``KEYS_PER_READ``."""
        found: list[Row] = []
        if not keys:
            return found
        with self.db.transaction() as tx:
            for start in range(0, len(keys), KEYS_PER_READ):
                chunk = keys[start:start + KEYS_PER_READ]
                found.extend(tx.fetchall(query, {"keys": tx.json(chunk)}))
        return found

    def claim(self, lease: timedelta, *, limit: int = 1,
              now: datetime | None = None) -> list[DeliveryEntry]:
        """Due ``pending`` entries, oldest first, taken ``in_flight`` until ``now + lease``."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            claimed = tx.fetchall(Q.claim_due, {"now": now, "lease_until": now + lease,
                                                "limit": limit}, final=True)
        entries = [DeliveryEntry.from_row(_typed(row)) for row in claimed]
        return sorted(entries, key=lambda e: (e.enqueued_at, e.id))

    def ack(self, entry: DeliveryEntry, platform_message_id: str | None, duration_ms: int,
            *, now: datetime | None = None) -> bool:
        """``acked``; False when the entry is no longer this attempt's (its lease lapsed)."""
        return self._settle(Q.ack, entry, now, platform_message_id=platform_message_id,
                            duration_ms=duration_ms)

    def nack(self, entry: DeliveryEntry, error: str, *, duration_ms: int | None = None,
             retry_after_s: float | None = None, unknown: bool = False,
             deduplicates: bool = False, now: datetime | None = None) -> DeliveryStatus | None:
        """A transient failure: ``pending`` at the schedule's next time, or ``failed`` when
        that was the last attempt. An ``unknown`` outcome may have been delivered: it is never
        failed; it is retried (same key) while the attempt limit allows and, unless the channel
        ``deduplicates``, only ``unknown_resends`` more times; otherwise it rests ``unknown``.
        The new status, or None if the entry was not ours."""
        now = now or utcnow()
        decision = self.schedule.decide(entry.attempts, retry_after_s)
        if unknown:
            resend = decision.retry and (
                deduplicates or entry.unknown_sends + 1 <= self.unknown_resends)
            status = DeliveryStatus.PENDING if resend else DeliveryStatus.UNKNOWN
            settled = self._settle(Q.nack_unknown, entry, now, error=error,
                                   duration_ms=duration_ms, status=status.value,
                                   next_attempt_at=now + decision.delay)
            return status if settled else None
        if not decision.retry:
            reason = f"gave up after {entry.attempts} attempts; last error: {error}"
            return DeliveryStatus.FAILED if self.fail(
                entry, reason, duration_ms=duration_ms, now=now,
                reason=FailureReason.MAX_ATTEMPTS) else None
        settled = self._settle(Q.nack, entry, now, error=error, duration_ms=duration_ms,
                               next_attempt_at=now + decision.delay)
        return DeliveryStatus.PENDING if settled else None

    def fail(self, entry: DeliveryEntry, error: str, *, duration_ms: int | None = None,
             now: datetime | None = None,
             reason: FailureReason = FailureReason.PERMANENT) -> bool:
        """A permanent failure (or the last attempt): ``failed``, never retried."""
        return self._settle(Q.fail, entry, now, error=error, duration_ms=duration_ms,
                            reason=reason.value)

    def release(self, entry: DeliveryEntry, why: str, *, delay: timedelta = timedelta(0),
                now: datetime | None = None, held_by: str | None = None) -> bool:
        """Back to ``pending`` after ``delay``, the claimed attempt given back: for what was
        not the entry's fault (no adapter, its destination down, the process out of memory).
        ``held_by`` names the destination it waits on."""
        now = now or utcnow()
        return self._settle(Q.release, entry, now, error=why, next_attempt_at=now + delay,
                            held_by=held_by)

    def _settle(self, query: Any, entry: DeliveryEntry, now: datetime | None,
                **params: Any) -> bool:
        with self.db.transaction() as tx:
            changed = tx.execute(query, {"id": entry.id, "attempts": entry.attempts,
                                         "now": now or utcnow(), **params}, final=True)
        return changed == 1

    # --- housekeeping --------------------------------------------------------------

    def recover(self, *, now: datetime | None = None, limit: int = 500,
                deduplicating: frozenset[str] = frozenset()) -> tuple[int, int]:
        """Lapsed leases: a send that never reported back may have happened, so each is an
        unknown outcome (see ``nack``): back to ``pending`` when it may be sent again, else
        ``unknown``. ``(returned to pending, set unknown)``."""
        now = now or utcnow()
        pending = unknown = 0
        with self.db.transaction() as tx:
            for row in tx.fetchall(Q.expired_leases, {"now": now, "limit": limit}):
                error = (f"lease expired during attempt {row['attempts']}: the sender died or "
                         "timed out before settling (the send may have happened)")
                resend = row["attempts"] < self.schedule.max_attempts and (
                    row["channel"] in deduplicating
                    or row["unknown_sends"] + 1 <= self.unknown_resends)
                status = DeliveryStatus.PENDING if resend else DeliveryStatus.UNKNOWN
                result = tx.fetchone(Q.recover_lease, {
                    "id": row["id"], "now": now, "error": error, "status": status.value})
                if result is not None:
                    if status is DeliveryStatus.UNKNOWN:
                        unknown += 1
                    else:
                        pending += 1
        return pending, unknown

    def prune(self, before: datetime, *, limit: int = 5000) -> int:
        """Delete ``acked`` and ``failed`` entries last touched before ``before``; their effect
        records stay, with the entry's final state."""
        with self.db.transaction() as tx:
            tx.execute(Q.effects_before_prune, {"before": before, "limit": limit})
            return tx.execute(Q.prune, {"before": before, "limit": limit})

    def expire(self, older_than: timedelta, *, now: datetime | None = None) -> int:
        """Pending entries enqueued more than ``older_than`` ago: ``failed``, reason
        ``expired`` (they stay visible to the DLQ tooling until pruned)."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            return tx.execute(Q.expire, {"now": now, "before": now - older_than,
                                         "expire_s": str(int(older_than.total_seconds()))})

    def count_backoff(self, *, since: datetime, now: datetime | None = None) -> int:
        """Pending entries still in their backoff, untouched since ``since``."""
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.count_deferred, {"now": now or utcnow(), "since": since})
        return int(row["n"]) if row else 0

    def count_due(self, *, now: datetime | None = None) -> int:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.count_due, {"now": now or utcnow()})
        return int(row["n"]) if row else 0

    def queue_status(self, *, now: datetime | None = None) -> dict[str, Any]:
        """Depth per status, pending entries in backoff, the oldest pending entry's age."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            counts = {row["status"]: int(row["n"]) for row in tx.fetchall(Q.status_counts)}
            row = tx.fetchone(Q.queue_status, {"now": now})
        oldest = row["oldest_pending"] if row else None
        if isinstance(oldest, str):  # SQLite does not type aggregates
            oldest = datetime.fromisoformat(oldest)
        return {
            "depth": {status.value: counts.get(status.value, 0) for status in DeliveryStatus},
            "inBackoff": int(row["in_backoff"] or 0) if row else 0,
            "oldestPendingAgeS": (round((now - oldest).total_seconds(), 3)
                                  if oldest is not None else None),
        }

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per status: count and the oldest ``enqueued_at`` (for the operations page)."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.status_counts)
        found = {row["status"]: row for row in rows}
        out = {}
        for status in DeliveryStatus:
            row = found.get(status.value)
            oldest = row["oldest"] if row else None
            if isinstance(oldest, str):  # SQLite does not type aggregates
                oldest = datetime.fromisoformat(oldest)
            out[status.value] = {"count": int(row["n"]) if row else 0, "oldest": iso(oldest)}
        return out

    # --- admin ---------------------------------------------------------------------

    def get(self, entry_id: str) -> DeliveryEntry:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.get_entry, {"id": entry_id})
        if row is None:
            raise NotFound(f"no delivery entry {entry_id!r}", id=entry_id)
        return DeliveryEntry.from_row(row)

    def list(self, *, status: DeliveryStatus | None = None, channel: str | None = None,
             limit: int = 100) -> list[DeliveryEntry]:
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.list_entries, {
                "status": status.value if status else None, "channel": channel,
                "limit": check_limit(limit)})
        return [DeliveryEntry.from_row(row) for row in rows]

    def redrive(self, entry_id: str, *, now: datetime | None = None) -> DeliveryEntry:
        """A ``failed`` entry back to ``pending``, due now, attempts reset."""
        with self.db.transaction() as tx:
            changed = tx.execute(Q.redrive, {"id": entry_id, "now": now or utcnow()})
        entry = self.get(entry_id)
        if not changed:
            raise Conflict(f"delivery entry {entry_id} is {entry.status.value}; only a failed "
                           "entry can be redriven", id=entry_id, status=entry.status.value)
        return entry

    def redrive_all(self, *, channel: str | None = None, now: datetime | None = None) -> int:
        with self.db.transaction() as tx:
            return tx.execute(Q.redrive_all, {"channel": channel, "now": now or utcnow()})

    def purge(self, entry_id: str) -> None:
        """Delete one ``failed`` or ``unknown`` entry: never send it (its effect record, if
        any, says ``purged`` and stays)."""
        with self.db.transaction() as tx:
            tx.execute(Q.effect_purged, {"id": entry_id, "now": utcnow()})
            changed = tx.execute(Q.purge, {"id": entry_id})
        if not changed:
            entry = self.get(entry_id)  # NotFound if it is not there at all
            raise Conflict(f"delivery entry {entry_id} is {entry.status.value}; only a failed "
                           "or unknown entry can be purged", id=entry_id,
                           status=entry.status.value)

    def count_failed(self, *, channel: str | None = None) -> int:
        """How many entries ``redrive_all`` / ``purge_all`` would change now."""
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.count_failed, {"channel": channel})
        return int(row["n"]) if row else 0

    def purge_all(self, *, channel: str | None = None) -> int:
        with self.db.transaction() as tx:
            tx.execute(Q.effects_purged_all, {"channel": channel, "now": utcnow()})
            return tx.execute(Q.purge_all, {"channel": channel})

    def mark_delivered(self, entry_id: str, *, now: datetime | None = None) -> DeliveryEntry:
        """An ``unknown`` entry the operator confirmed with the receiver: ``acked``."""
        return self._operator(Q.mark_delivered, entry_id, now, "marked delivered")

    def send_again(self, entry_id: str, *, now: datetime | None = None) -> DeliveryEntry:
        """An ``unknown`` entry the operator wants sent again: ``pending``, due now, attempts
        and unknown sends reset (it starts over under the same policy)."""
        return self._operator(Q.send_again, entry_id, now, "sent again")

    def _operator(self, query: Any, entry_id: str, now: datetime | None,
                  what: str) -> DeliveryEntry:
        with self.db.transaction() as tx:
            changed = tx.execute(query, {"id": entry_id, "now": now or utcnow()})
        entry = self.get(entry_id)
        if not changed:
            raise Conflict(f"delivery entry {entry_id} is {entry.status.value}; only an "
                           f"unknown entry can be {what}", id=entry_id,
                           status=entry.status.value)
        return entry
