"""The write-ahead delivery queue: an outbound message is stored before it is sent.

``enqueue`` writes the entry (``pending``, or ``in_flight`` under a lease for the
inline path that sends it at once); ``claim`` takes due ``pending`` entries that wait on
nothing ``in_flight`` under a lease and counts the attempt, and one probe entry for each
failing destination whose probe is due; ``request_left`` (``requests_left`` for a batch,
one statement) marks the moment the request leaves. ``enqueue_many`` stores a batch in one
transaction. The sender then settles the entry with ``apply`` (a batch with ``settle``, one
commit) and the policy's ``DeliveryDecision``
(``sluice.delivery.policy``: this module decides nothing itself); ``ack``, ``nack``,
``fail`` and ``release`` ask the policy for the usual rows. Each settle is one UPDATE
guarded by ``in_flight`` and the attempt it claimed, so it is whole or nothing, and a
sender whose lease lapsed cannot overwrite the next one's work. ``recover`` settles
lapsed leases (an unknown outcome when the request had left, else the attempt given
back); ``expire`` fails pending entries past the expiry (reason ``expired``, counted per
destination that held them); ``prune`` deletes old settled entries. Operators redrive,
send again and replay a destination's window (one ``restart`` statement; the replay is
``sluice.delivery.replay``), mark delivered and purge.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sluice.core import trace
from sluice.core.errors import Conflict, NotFound, RequestError, TransientStoreError
from sluice.core.times import iso_z_or_none
from sluice.core.trace import SYSTEM_SLUICE
from sluice.delivery.keys import keys_for
from sluice.delivery.policy import (
    DEFAULT_SCHEDULE,
    OPERATOR_FROM,
    Attempt,
    DeliveryDecision,
    DeliveryOutcome,
    DeliveryStatus,
    Due,
    FailureReason,
    Policy,
    RetrySchedule,
)
from sluice.store.db import Database, Query, Row, Tx, load_queries, utcnow

Q = load_queries("delivery")

MAX_LIST = 500
MAX_KEY_LENGTH = 256
KEYS_PER_READ = 500  # keys per statement of a set lookup (bounded statements, any sweep size)


_TIMES = ("next_attempt_at", "lease_until", "enqueued_at", "updated_at", "acked_at", "failed_at",
          "request_left_at", "started_at", "restarted_at")
UNCONFIGURED = "unconfigured:"  # held_by of an entry whose channel has no adapter
# A receiver that found no rate slot (or was asked to wait) within this is served one entry
# a turn: a paced backlog is claimed as its slots come, not a batch at a time.
PACED_WINDOW = timedelta(seconds=60)


def _typed(row: Row) -> Row:
    """A ``RETURNING *`` row as a ``SELECT`` gives it: an SQLite built without the declared
    types of RETURNING columns hands back their stored text."""
    if isinstance(row["payload"], str):
        row = {**row, "payload": json.loads(row["payload"])}
    for key in _TIMES:
        if isinstance(row.get(key), str):
            row = {**row, key: datetime.fromisoformat(row[key]).astimezone(UTC)}
    return row


iso = iso_z_or_none


def queue_turn(tx: Tx) -> None:
    """This transaction's turn at the queue: first in every transaction that changes many
    queued entries at once (``queue_turn`` in delivery.sql says why), so concurrent drains
    never deadlock on the entries they reach for."""
    tx.write(Q.queue_turn)


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
    request_left_at: datetime | None = None
    started_at: datetime | None = None
    unsent_lapses: int = 0
    destination: str | None = None  # <channel>:<recipient>, decided at its enqueue (keys_for)
    receiver: str | None = None  # where its rates and outages live, decided with it
    restarted_at: datetime | None = None  # an operator's last redrive, send again or replay
    trace_context: str | None = None  # the enqueue span's (sluice.core.trace.stored)

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
            "heldBy": self.held_by, "requestLeftAt": iso(self.request_left_at),
            "startedAt": iso(self.started_at), "destination": self.destination,
            "receiver": self.receiver, "restartedAt": iso(self.restarted_at),
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


class NewEntry(NamedTuple):
    """One delivery a producer stores (``DeliveryStore.enqueue_many``)."""

    channel: str
    recipient: str
    payload: dict[str, Any]
    idempotency_key: str | None = None
    subject_user_id: str | None = None


class Settle(NamedTuple):
    """What one claimed entry comes to, as the policy decided (``DeliveryStore.settle``)."""

    entry: DeliveryEntry
    decision: DeliveryDecision
    error: str | None = None
    duration_ms: int | None = None
    message_id: str | None = None
    held_by: str | None = None
    now: datetime | None = None


def _check_new(item: NewEntry) -> None:
    if not item.channel or not item.recipient:
        raise RequestError("a delivery needs a channel and a recipient")
    if not isinstance(item.payload, dict):
        raise RequestError("a delivery payload must be a JSON object")
    key = item.idempotency_key
    if key is not None and not 0 < len(key) <= MAX_KEY_LENGTH:
        raise RequestError(f"idempotency key must be 1 to {MAX_KEY_LENGTH} characters")


def _new_entry(item: NewEntry, now: datetime, lease: timedelta | None,
               trace_context: str | None) -> DeliveryEntry:
    """The entry as stored: ``in_flight`` under ``lease`` (attempt 1), else ``pending``
    and due at ``now``; its destination and receiver decided here, once; ``trace_context``
    the enqueue span's."""
    keys = keys_for(item.channel, item.recipient)
    lease_until = now + lease if lease is not None else None
    status = DeliveryStatus.IN_FLIGHT if lease else DeliveryStatus.PENDING
    return DeliveryEntry(
        str(uuid.uuid4()), item.channel, item.recipient, item.subject_user_id,
        dict(item.payload), item.idempotency_key, status, 1 if lease else 0,
        lease_until or now, lease_until, None, None, None, now, now, None, None,
        destination=keys.destination, receiver=keys.receiver, trace_context=trace_context)


def _json_values(entry: DeliveryEntry) -> dict[str, Any]:
    """``insert_entries``'s values of one entry: ``_insert_params`` as JSON, its times in
    UTC at a fixed width (microseconds always written)."""
    def at(moment: datetime | None) -> str | None:
        return None if moment is None else moment.astimezone(UTC).isoformat(
            timespec="microseconds")

    return {"id": entry.id, "channel": entry.channel, "recipient": entry.recipient,
            "subject_user_id": entry.subject_user_id, "payload": entry.payload,
            "idempotency_key": entry.idempotency_key, "status": entry.status.value,
            "attempts": entry.attempts, "next_attempt_at": at(entry.next_attempt_at),
            "lease_until": at(entry.lease_until), "now": at(entry.enqueued_at),
            "destination": entry.destination, "receiver": entry.receiver,
            "trace_context": entry.trace_context}


def _insert_params(tx: Tx, entry: DeliveryEntry) -> dict[str, Any]:
    return {"id": entry.id, "channel": entry.channel, "recipient": entry.recipient,
            "subject_user_id": entry.subject_user_id, "payload": tx.json(entry.payload),
            "idempotency_key": entry.idempotency_key, "status": entry.status.value,
            "attempts": entry.attempts, "next_attempt_at": entry.next_attempt_at,
            "lease_until": entry.lease_until, "now": entry.enqueued_at,
            "destination": entry.destination, "receiver": entry.receiver,
            "trace_context": entry.trace_context}


class DeliveryStore:
    def __init__(self, db: Database, schedule: RetrySchedule = DEFAULT_SCHEDULE, *,
                 unknown_resends: int = 1, policy: Policy | None = None) -> None:
        self.db = db
        # The channels that deduplicate are the channels' to say (``Deliverer`` tells the
        # policy); a store alone treats every channel as one that cannot.
        self.policy = policy or Policy(schedule, unknown_resends=unknown_resends)
        self.schedule = self.policy.schedule

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
        item = NewEntry(channel, recipient, payload, idempotency_key, subject_user_id)
        _check_new(item)
        keys = keys_for(channel, recipient)
        with trace.span(f"enqueue {keys.destination}", kind="producer", attributes={
                "messaging.system": SYSTEM_SLUICE, "messaging.operation.type": "send",
                "messaging.operation.name": "enqueue",
                "messaging.destination.name": keys.destination,
                "sluice.destination": keys.destination, "sluice.receiver": keys.receiver,
                "sluice.channel": channel, "sluice.idempotency_key": idempotency_key}) as span:
            entry, created = self._enqueue(item, lease, now, effect)
            span.set("messaging.message.id", entry.id)
            span.set("sluice.entry_id", entry.id)
            span.set("sluice.outcome", "enqueued" if created else "duplicate")
            return entry, created

    def _enqueue(self, item: NewEntry, lease: timedelta | None, now: datetime | None,
                 effect: Effect | None) -> tuple[DeliveryEntry, bool]:
        now = now or utcnow()
        trace_context = trace.stored()  # inside the enqueue span: every attempt links to it
        idempotency_key = item.idempotency_key
        for _ in range(3):
            entry = _new_entry(item, now, lease, trace_context)
            with self.db.transaction() as tx:
                created = tx.execute(Q.insert_entry, _insert_params(tx, entry),
                                     final=effect is None) == 1
                if effect is not None and idempotency_key is not None:
                    tx.execute(Q.record_effect, {
                        "key": idempotency_key, "producer": effect.producer,
                        "scope_id": effect.scope_id, "subject": effect.subject,
                        "entry_id": entry.id if created else None, "now": now}, final=True)
            if created:  # the stored row is exactly these values: nothing to read back
                return entry, True
            # Only the key conflicts (see insert_entry): that entry is the answer.
            with self.db.transaction() as tx:
                row = tx.fetchone(Q.get_by_key, {"key": idempotency_key}, final=True)
            if row is not None:
                return DeliveryEntry.from_row(row), False
            # Purged between the two statements: store this one after all.
        raise TransientStoreError(f"delivery key {idempotency_key!r} conflicts with an entry "
                                  "that is never there when read")

    def enqueue_many(self, items: Sequence[NewEntry], *,
                     now: datetime | None = None) -> list[tuple[DeliveryEntry, bool]]:
        """Store ``items`` (``pending``, due at once, in this order) in one transaction:
        each one as ``enqueue`` stores it, ``(entry, created)`` in the items' order. Every
        item is checked before anything is written: one that is not a delivery raises
        ``RequestError`` naming its index (``items[3]``), and nothing is stored. A key already
        stored (or given twice in ``items``) answers that entry with ``created`` False. One
        producer span for the batch: every entry's attempts link to it. The inserts are one
        statement (``insert_entries``)."""
        for n, item in enumerate(items):
            try:
                _check_new(item)
            except RequestError as exc:
                raise RequestError(f"items[{n}]: {exc.message}", field=f"items[{n}]") from exc
        now = now or utcnow()
        found: list[tuple[DeliveryEntry, bool]] = []
        if not items:
            return found
        with trace.span("enqueue batch", kind="producer", attributes={
                "messaging.system": SYSTEM_SLUICE, "messaging.operation.type": "send",
                "messaging.operation.name": "enqueue",
                "messaging.batch.message_count": len(items)}) as span, \
                self.db.transaction() as tx:
            trace_context = trace.stored()
            # one microsecond apart: the claim takes them in the order given
            entries = [_new_entry(item, now + timedelta(microseconds=n), None, trace_context)
                       for n, item in enumerate(items)]
            inserted = {row["id"] for row in tx.fetchall(Q.insert_entries, {
                "entries": tx.json([_json_values(e) for e in entries])})}
            for entry, item in zip(entries, items, strict=True):
                if entry.id in inserted:
                    found.append((entry, True))
                    continue
                row = tx.fetchone(Q.get_by_key, {"key": item.idempotency_key})
                if row is None:
                    raise TransientStoreError(
                        f"delivery key {item.idempotency_key!r} conflicts with an entry that "
                        "is never there when read")
                found.append((DeliveryEntry.from_row(row), False))
            span.set("sluice.outcome", f"{sum(created for _, created in found)} enqueued")
        return found

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

    def acked_effects(self, keys: list[str]) -> set[str]:
        """Which of ``keys`` have an effect record whose entry was last seen ``acked`` (an
        entry under that key was delivered, and pruned since)."""
        return {row["idempotency_key"] for row in self._among(Q.effect_keys_among, keys)
                if row["outcome"] == DeliveryStatus.ACKED}

    def window(self, key: str, since: datetime, until: datetime, *,
               channel: str | None = None, after: tuple[datetime, str] | None = None,
               limit: int = KEYS_PER_READ) -> list[DeliveryEntry]:
        """One page of the settled entries (``acked``, ``failed``, ``unknown``) of ``key``
        (those whose destination or receiver it is) enqueued in ``[since, until)``, oldest
        first, after ``after`` (the last page's enqueue time and id): a window is read a
        bounded page at a time, however large, and reads no other key's entries."""
        at, after_id = after if after is not None and after[0] >= since else (since, "")
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.replay_window, {"key": key, "until": until,
                                                 "channel": channel, "after_at": at,
                                                 "after_id": after_id, "limit": limit})
        return [DeliveryEntry.from_row(row) for row in rows]

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

    def claim(self, lease: timedelta, *, limit: int = 1, per_round: int | None = None,
              after: str = "", now: datetime | None = None,
              channels: Sequence[str] | None = None) -> list[DeliveryEntry]:
        """Up to ``limit`` due entries taken ``in_flight`` until ``now + lease``, served in
        turns across receivers (at most ``per_round`` of one, or ``ceil(limit / receivers
        waiting)`` when that is more; one of a failing receiver, its probe, or of one paced
        in the last minute; ``limit`` when not given), receivers after ``after`` first,
        among ``channels`` (the configured ones) when given. Nothing whose destination or
        receiver is paused, disabled, failing before its probe, or without a rate slot is
        taken: a backlog that cannot go now stays where it is."""
        now = now or utcnow()
        with self.db.transaction() as tx:
            queue_turn(tx)
            claimed = tx.fetchall(Q.claim, {
                "now": now, "lease_until": now + lease, "limit": limit,
                "per_round": per_round or limit, "after": after,
                "paced_since": now - PACED_WINDOW,
                "channels": None if channels is None else tx.json(list(channels))})
            receivers = sorted({row["receiver"] for row in claimed if row["receiver"]})
            if receivers:
                tx.execute(Q.probing, {"now": now, "lease_until": now + lease,
                                       "keys": tx.json(receivers)}, final=True)
        entries = [DeliveryEntry.from_row(_typed(row)) for row in claimed]
        return sorted(entries, key=lambda e: (e.enqueued_at, e.id))

    def request_left(self, entry: DeliveryEntry, *, now: datetime | None = None) -> bool:
        """The claimed attempt's request is leaving (a lapsed lease from here on is an
        unknown outcome); False when the entry is no longer this attempt's, or its
        destination or receiver was paused or disabled since it was claimed: do not send."""
        return entry.id in self.requests_left([entry], now=now)

    def requests_left(self, entries: Sequence[DeliveryEntry], *,
                      now: datetime | None = None) -> set[str]:
        """``request_left`` for a batch, in one statement and one commit: the ids of those
        whose request may leave now (each still this attempt's, its destination and
        receiver neither paused nor disabled, read by the same statement)."""
        if not entries:
            return set()
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.requests_left, {
                "now": now or utcnow(),
                "entries": tx.json([[e.id, e.attempts] for e in entries])}, final=True)
        return {row["id"] for row in rows}

    def hold_unconfigured(self, configured: Sequence[str], *,
                          now: datetime | None = None) -> Counter[str]:
        """Entries of channels without an adapter wait out of the claim (``NO_ADAPTER``);
        those of channels that have one now are due at once. The entries newly set aside,
        per channel."""
        with self.db.transaction() as tx:
            queue_turn(tx)
            params = {"now": now or utcnow(), "channels": tx.json(list(configured))}
            tx.execute(Q.unhold_configured, params)
            rows = tx.fetchall(Q.hold_unconfigured, params, final=True)
        return Counter(row["channel"] for row in rows)

    def apply(self, entry: DeliveryEntry, decision: DeliveryDecision, error: str | None = None, *,
              duration_ms: int | None = None, message_id: str | None = None,
              held_by: str | None = None, now: datetime | None = None) -> bool:
        """Settle a claimed entry as the policy decided; False when it was not ours."""
        [settled] = self.settle([Settle(entry, decision, error, duration_ms=duration_ms,
                                        message_id=message_id, held_by=held_by, now=now)])
        return settled

    def settle(self, settles: Sequence[Settle]) -> list[bool]:
        """Settle claimed entries as the policy decided, in one transaction (one commit):
        for each, whether it was still ours (each write is guarded by ``in_flight`` and the
        attempt it claimed, so a stale one changes nothing and the others still settle).
        The acks of one moment are one statement."""
        if not settles:
            return []
        now = utcnow()
        acks: dict[datetime, list[Settle]] = {}
        others: list[Settle] = []
        for s in settles:
            if s.decision.status == DeliveryStatus.ACKED:
                acks.setdefault(s.now or now, []).append(s)
            else:
                others.append(s)
        ours: set[str] = set()
        with self.db.transaction() as tx:
            writes = len(acks) + len(others)
            for at, acked in acks.items():
                writes -= 1
                rows = tx.fetchall(Q.ack, {"now": at, "entries": tx.json([
                    [s.entry.id, s.entry.attempts, s.message_id, s.duration_ms or 0]
                    for s in acked])}, final=writes == 0)
                ours.update(row["id"] for row in rows)
            for s in others:
                writes -= 1
                if tx.execute(*self._settle_write(s, s.now or now), final=writes == 0) == 1:
                    ours.add(s.entry.id)
        return [s.entry.id in ours for s in settles]

    def _settle_write(self, s: Settle, now: datetime) -> tuple[Query, dict[str, Any]]:
        """The one guarded write that settles ``s.entry`` as its decision says (not an
        ack: ``settle`` acks together)."""
        entry, decision, error = s.entry, s.decision, s.error
        guard = {"id": entry.id, "attempts": entry.attempts, "now": now}
        if decision.status == DeliveryStatus.FAILED:
            reason = decision.reason or FailureReason.PERMANENT
            if reason is FailureReason.MAX_ATTEMPTS:
                error = f"gave up after {entry.attempts} attempts; last error: {error}"
            query = Q.fail_given_back if decision.attempt is Attempt.GIVEN_BACK else Q.fail
            return query, {**guard, "error": error, "duration_ms": s.duration_ms,
                           "reason": reason.value}
        due = now + decision.delay
        if decision.due is Due.SLOT:
            # its receiver is paced until the slot (the claim reads ``ready_at``): the entry
            # keeps its place among the receiver's entries, so they go in enqueue order
            due = min(due, entry.enqueued_at)
        if decision.attempt is Attempt.GIVEN_BACK:
            return Q.release, {**guard, "error": error, "next_attempt_at": due,
                               "held_by": s.held_by}
        if decision.unknown:
            return Q.nack_unknown, {**guard, "error": error, "duration_ms": s.duration_ms,
                                    "status": decision.status, "next_attempt_at": due}
        return Q.nack, {**guard, "error": error, "duration_ms": s.duration_ms,
                        "next_attempt_at": due}

    def ack(self, entry: DeliveryEntry, platform_message_id: str | None, duration_ms: int,
            *, now: datetime | None = None) -> bool:
        """``acked``; False when the entry is no longer this attempt's (its lease lapsed)."""
        return self.apply(entry, self.policy.decide(DeliveryOutcome.ACKED), duration_ms=duration_ms,
                          message_id=platform_message_id, now=now)

    def nack(self, entry: DeliveryEntry, error: str, *, duration_ms: int | None = None,
             unknown: bool = False, now: datetime | None = None) -> DeliveryStatus | None:
        """The entry's own transient failure, or (``unknown``) a send without an answer, as
        the policy decides it: the new status, or None if the entry was not ours."""
        if unknown:
            outcome = (DeliveryOutcome.UNKNOWN if self.policy.may_resend(
                entry.channel, entry.attempts, entry.unknown_sends) else DeliveryOutcome.UNKNOWN_RESTS)
        else:
            outcome = (DeliveryOutcome.TRANSIENT if entry.attempts < self.schedule.max_attempts
                       else DeliveryOutcome.LAST_ATTEMPT)
        decision = self.policy.decide(outcome, attempts=entry.attempts)
        settled = self.apply(entry, decision, error, duration_ms=duration_ms, now=now)
        return DeliveryStatus(decision.status) if settled else None

    def fail(self, entry: DeliveryEntry, error: str, *, duration_ms: int | None = None,
             now: datetime | None = None) -> bool:
        """A permanent failure: ``failed``, never retried."""
        return self.apply(entry, self.policy.decide(DeliveryOutcome.PERMANENT), error,
                          duration_ms=duration_ms, now=now)

    def release(self, entry: DeliveryEntry, why: str, *, delay: timedelta = timedelta(0),
                now: datetime | None = None, held_by: str | None = None,
                outcome: DeliveryOutcome = DeliveryOutcome.NOT_SENT) -> bool:
        """Back to ``pending`` after ``delay``, the claimed attempt given back (an outcome
        of the policy whose attempt is given back). ``held_by`` names what it waits on."""
        decision = self.policy.decide(outcome, wait=delay)
        assert decision.attempt is Attempt.GIVEN_BACK, outcome
        return self.apply(entry, decision._replace(delay=delay), why, held_by=held_by,
                          now=now)

    # --- housekeeping --------------------------------------------------------------

    def recover(self, *, now: datetime | None = None, limit: int = 500) -> tuple[int, int, int]:
        """Lapsed leases, as the policy decides them: a send whose request had left may have
        happened (the unknown rule: ``pending`` when it may be sent again, else ``unknown``);
        one whose request never left gives its attempt back (``failed``, ``lease_lost``, at
        the limit of such lapses in a row at its turn: the first entry its claim still held;
        the sender never reached the others). Each claim is read whole.
        ``(pending, unknown, failed)``."""
        now = now or utcnow()
        pending = unknown = failed = 0
        with self.db.transaction() as tx:
            queue_turn(tx)
            for row in tx.fetchall(Q.expired_leases, {"now": now, "limit": limit}):
                left = row["request_left_at"] is not None
                its_turn = bool(row["its_turn"])
                outcome = self.policy.after_lapse(row["channel"], row["attempts"],
                                                  row["unknown_sends"], request_left=left,
                                                  unsent_lapses=row["unsent_lapses"],
                                                  its_turn=its_turn)
                decision = self.policy.decide(outcome, attempts=row["attempts"])
                given_back = decision.attempt is Attempt.GIVEN_BACK
                error = (f"lease expired during attempt {row['attempts']}: the sender died or "
                         "timed out before settling (the send may have happened)" if left else
                         f"lease expired before attempt {row['attempts']} was sent: not sent "
                         f"({row['unsent_lapses'] + 1} in a row)" if its_turn else
                         f"lease expired before attempt {row['attempts']} was sent: its sender "
                         "stopped before reaching it (another entry of its claim came first)")
                result = tx.fetchone(Q.recover_lease, {
                    "id": row["id"], "now": now, "error": error, "status": decision.status,
                    "unknown": int(decision.unknown),
                    "given_back": int(given_back), "lapse": int(given_back and its_turn),
                    "reason": decision.reason.value if decision.reason else None,
                    "failed_at": now if decision.status == DeliveryStatus.FAILED else None,
                    "next_attempt_at": now + decision.delay})
                if result is not None:
                    if decision.status == DeliveryStatus.UNKNOWN:
                        unknown += 1
                    elif decision.status == DeliveryStatus.PENDING:
                        pending += 1
                    else:
                        failed += 1
        return pending, unknown, failed

    def prune(self, before: datetime, *, limit: int = 5000) -> int:
        """Delete ``acked`` and ``failed`` entries last touched before ``before``; their effect
        records stay, with the entry's final state."""
        with self.db.transaction() as tx:
            tx.execute(Q.effects_before_prune, {"before": before, "limit": limit})
            return tx.execute(Q.prune, {"before": before, "limit": limit})

    def expire(self, older_than: timedelta, *, now: datetime | None = None) -> Counter[str]:
        """Pending entries enqueued (or restarted by an operator) more than ``older_than``
        ago: ``failed``, reason ``expired`` (they stay visible to the DLQ tooling until
        pruned). How many, per receiver."""
        now = now or utcnow()
        assert self.policy.decide(DeliveryOutcome.EXPIRED).reason is FailureReason.EXPIRED
        with self.db.transaction() as tx:
            queue_turn(tx)
            rows = tx.fetchall(Q.expire, {"now": now, "before": now - older_than,
                                          "expire_s": str(int(older_than.total_seconds()))},
                               final=True)
        return Counter(row["receiver"] or "" for row in rows)

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
             destination: str | None = None, limit: int = 100) -> list[DeliveryEntry]:
        """Newest first; ``destination``: the entries of that destination or receiver."""
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.list_entries, {
                "status": status.value if status else None, "channel": channel,
                "destination": destination, "limit": check_limit(limit)})
        return [DeliveryEntry.from_row(row) for row in rows]

    def redrive(self, entry_id: str, *, now: datetime | None = None) -> DeliveryEntry:
        """A ``failed`` entry back to ``pending``, due now, on a new count (``restart``)."""
        return self._operator(DeliveryOutcome.REDRIVE, entry_id, now, "redriven")

    def redrive_all(self, *, channel: str | None = None, destination: str | None = None,
                    now: datetime | None = None) -> int:
        """Every failed entry (of ``channel``, of ``destination``, when given) redriven."""
        return self._restart(DeliveryOutcome.REDRIVE, None, channel, now or utcnow(),
                             destination=destination)

    def restart(self, outcome: DeliveryOutcome, ids: Sequence[str], *,
                now: datetime | None = None,
                then: Callable[[Tx, int], None] | None = None) -> int:
        """The entries ``ids`` restarted as the operator's ``outcome`` (redrive, send again,
        replay acked) in one statement: how many were still in the status it starts from.
        An acked entry replayed is sent whole again (its chunk log is forgotten).
        ``then(tx, restarted)`` runs in the same transaction (what the operator's audit row
        says of it commits with it)."""
        if not ids:
            return 0
        return self._restart(outcome, None, None, now or utcnow(), ids=ids, then=then)

    def _restart(self, outcome: DeliveryOutcome, entry_id: str | None, channel: str | None,
                 now: datetime, *, ids: Sequence[str] | None = None,
                 destination: str | None = None,
                 then: Callable[[Tx, int], None] | None = None) -> int:
        """The one statement every operator restart goes through: due now, attempts and
        unknown sends reset, and the expiry read from now."""
        decision = self.policy.decide(outcome)
        assert decision.attempt is Attempt.RESET and decision.status == DeliveryStatus.PENDING
        [from_status] = OPERATOR_FROM[outcome]
        with self.db.transaction() as tx:
            listed = None if ids is None else tx.json(list(ids))
            if listed is not None and from_status == DeliveryStatus.ACKED:
                tx.execute(Q.forget_chunks, {"ids": listed})
            restarted = tx.execute(Q.restart, {"id": entry_id, "channel": channel,
                                               "now": now, "destination": destination,
                                               "from_status": from_status, "ids": listed},
                                   final=then is None)
            if then is not None:
                then(tx, restarted)
            return restarted

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

    def count_failed(self, *, channel: str | None = None, destination: str | None = None) -> int:
        """How many entries ``redrive_all`` / ``purge_all`` would change now."""
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.count_failed, {"channel": channel, "destination": destination})
        return int(row["n"]) if row else 0

    def purge_all(self, *, channel: str | None = None) -> int:
        with self.db.transaction() as tx:
            tx.execute(Q.effects_purged_all, {"channel": channel, "now": utcnow()})
            return tx.execute(Q.purge_all, {"channel": channel})

    def mark_delivered(self, entry_id: str, *, now: datetime | None = None) -> DeliveryEntry:
        """An ``unknown`` entry the operator confirmed with the receiver: ``acked``."""
        return self._operator(DeliveryOutcome.MARK_DELIVERED, entry_id, now, "marked delivered")

    def send_again(self, entry_id: str, *, now: datetime | None = None) -> DeliveryEntry:
        """An ``unknown`` entry the operator wants sent again: ``pending``, due now, on a new
        count, its expiry read from now (``restart``): sent however long it rested."""
        return self._operator(DeliveryOutcome.SEND_AGAIN, entry_id, now, "sent again")

    def _operator(self, outcome: DeliveryOutcome, entry_id: str, now: datetime | None,
                  what: str) -> DeliveryEntry:
        now = now or utcnow()
        if outcome is DeliveryOutcome.MARK_DELIVERED:
            with self.db.transaction() as tx:
                changed = tx.execute(Q.mark_delivered, {"id": entry_id, "now": now})
        else:
            changed = self._restart(outcome, entry_id, None, now)
        entry = self.get(entry_id)
        if not changed:
            allowed = " or ".join(OPERATOR_FROM[outcome])
            article = "an" if allowed[0] in "aeiou" else "a"
            raise Conflict(f"delivery entry {entry_id} is {entry.status.value}; only "
                           f"{article} {allowed} entry can be {what}", id=entry_id,
                           status=entry.status.value)
        return entry


__all__ = ["DEFAULT_SCHEDULE", "UNCONFIGURED", "DeliveryEntry", "DeliveryStatus", "DeliveryStore",
           "Effect", "FailureReason", "NewEntry", "RetrySchedule", "Settle", "check_limit",
           "check_status"]
