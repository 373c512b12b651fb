"""The delivery queue against a model: enqueue (with its effect record), claim, ack,
nack, unknown outcomes, fail, lease expiry, recovery, redrive, purge and the operator's
unknown-outcome actions in any order, on the real store; after every step each entry's
status, attempts and unknown sends match the model, nothing is lost, a settle by a
holder whose claim was superseded changes nothing, no entry passes the attempt limit, a
channel that cannot deduplicate gets at most one more send after an unknown outcome, and
a key once enqueued is never enqueued again by its producer (its effect record stays
through purges)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.delivery.policy import Policy
from sluice.delivery.store import (
    DeliveryEntry,
    DeliveryStatus,
    DeliveryStore,
    Effect,
)
from sluice.store.db import Database
from tests.model import EPOCH, run_model

LEASE = timedelta(seconds=60)
KEYS = [f"k{i}" for i in range(4)]
SETTLES = ("ack", "nack", "fail", "unknown")
DEDUPLICATING = {"k0", "k1"}  # webhooks; k2 and k3 go to a chat that cannot deduplicate
RESENDS = 1
DELAYS_S, MAX_ATTEMPTS = (5, 25, 120, 600), 5  # the seed's schedule: the model's own oracle


@dataclass
class Expected:
    status: DeliveryStatus
    attempts: int
    next_at: datetime  # due time when pending, lease end when in flight
    unknown: int = 0

    def unknown_outcome(self, key: str, now: datetime) -> DeliveryStatus:
        """What the store must do with a send whose outcome is unknown."""
        self.unknown += 1
        resend = self.attempts < MAX_ATTEMPTS and (key in DEDUPLICATING or self.unknown <= RESENDS)
        self.status = DeliveryStatus.PENDING if resend else DeliveryStatus.UNKNOWN
        self.next_at = now + timedelta(seconds=DELAYS_S[min(self.attempts, 4) - 1])
        return self.status


def machine_for(db: Database) -> type[RuleBasedStateMachine]:
    class DeliveryQueueModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with db.transaction() as tx:
                tx.execute("DELETE FROM delivery_queue")
                tx.execute("DELETE FROM delivery_effects")
            self.store = DeliveryStore(db, policy=Policy(
                unknown_resends=RESENDS, deduplicating=frozenset({"webhook"})))
            self.recorded: set[str] = set()
            self.now = EPOCH
            self.model: dict[str, Expected] = {}
            self.ids: dict[str, str] = {}
            self.held: list[DeliveryEntry] = []

        def _due(self) -> set[str]:
            return {k for k, e in self.model.items()
                    if e.status is DeliveryStatus.PENDING and e.next_at <= self.now}

        @rule(key=st.sampled_from(KEYS))
        def enqueue(self, key: str) -> None:
            # The producer's check first: a key with an effect record is never enqueued again
            if self.store.known_effects([key]):
                assert key in self.recorded
                return
            assert key not in self.recorded
            channel = "webhook" if key in DEDUPLICATING else "telegram"
            entry, created = self.store.enqueue(channel, "http://127.0.0.1:9/h", {"k": key},
                                                idempotency_key=key, now=self.now,
                                                effect=Effect("alert", None, key))
            assert created
            self.recorded.add(key)
            self.model[key] = Expected(DeliveryStatus.PENDING, 0, self.now)
            self.ids[key] = entry.id

        @rule(then=st.sampled_from(("hold", *SETTLES, "hold")))
        def claim(self, then: str) -> None:
            due = self._due()
            claimed = self.store.claim(LEASE, now=self.now)
            assert len(claimed) == (1 if due else 0), (claimed, due)
            if not claimed:
                return
            [entry] = claimed
            key = entry.idempotency_key
            assert key in due
            expected = self.model[key]  # type: ignore[index]
            expected.status, expected.attempts = DeliveryStatus.IN_FLIGHT, expected.attempts + 1
            expected.next_at = self.now + LEASE
            assert entry.attempts == expected.attempts
            if then == "hold":  # the request left; the sender may die holding it
                assert self.store.request_left(entry, now=self.now)
                self.held.append(entry)
            else:
                self._settle(entry, then)

        @rule(index=st.integers(0, 7), how=st.sampled_from(SETTLES))
        def settle_held(self, index: int, how: str) -> None:
            """A holder settles late: after ticks, a recovery, or another holder's claim."""
            if self.held:
                self._settle(self.held.pop(index % len(self.held)), how)

        def _settle(self, entry: DeliveryEntry, how: str) -> None:
            expected = self.model[entry.idempotency_key]  # type: ignore[index]
            ours = (expected.status is DeliveryStatus.IN_FLIGHT
                    and expected.attempts == entry.attempts)
            if how == "ack":
                assert self.store.ack(entry, "msg", 1, now=self.now) == ours
                if ours:
                    expected.status = DeliveryStatus.ACKED
            elif how == "unknown":
                status = self.store.nack(entry, "read timeout (sent; no answer)", unknown=True,
                                         now=self.now)
                if not ours:
                    assert status is None
                    return
                assert status is expected.unknown_outcome(entry.idempotency_key or "", self.now)
            elif how == "fail":
                assert self.store.fail(entry, "chat not found", now=self.now) == ours
                if ours:
                    expected.status = DeliveryStatus.FAILED
            else:
                status = self.store.nack(entry, "503 from the stand-in", now=self.now)
                if not ours:
                    assert status is None
                    return
                if entry.attempts < MAX_ATTEMPTS:
                    assert status is DeliveryStatus.PENDING
                    expected.status = DeliveryStatus.PENDING
                    expected.next_at = self.now + timedelta(
                        seconds=DELAYS_S[min(entry.attempts, 4) - 1])
                else:
                    assert status is DeliveryStatus.FAILED
                    expected.status = DeliveryStatus.FAILED

        @rule(seconds=st.sampled_from([61, 600, 7200, 1]))
        def next_drain(self, seconds: int) -> None:
            """Time passes; the next drain starts by recovering lapsed leases."""
            self.now += timedelta(seconds=seconds)
            lapsed = {k: e for k, e in self.model.items()
                      if e.status is DeliveryStatus.IN_FLIGHT and e.next_at < self.now}
            outcomes = [e.unknown_outcome(k, self.now) for k, e in lapsed.items()]
            for e in lapsed.values():
                e.next_at = self.now
            rested = outcomes.count(DeliveryStatus.UNKNOWN)
            assert self.store.recover(now=self.now) == (
                len(lapsed) - rested, rested, 0)

        @rule()
        def sender_dies(self) -> None:
            """A sender claims and dies; its lease lapses and the next drain recovers it."""
            self.claim("hold")
            self.next_drain(int(LEASE.total_seconds()) + 1)

        @rule(key=st.sampled_from(KEYS))
        def redrive(self, key: str) -> None:
            expected = self.model.get(key)
            if expected is None or expected.status is not DeliveryStatus.FAILED:
                return
            entry = self.store.redrive(self.ids[key], now=self.now)
            assert entry.status is DeliveryStatus.PENDING and entry.attempts == 0
            expected.status, expected.attempts, expected.next_at = (
                DeliveryStatus.PENDING, 0, self.now)

        @rule(key=st.sampled_from(KEYS), how=st.sampled_from(("mark", "again", "purge")))
        def operator(self, key: str, how: str) -> None:
            """An operator acts on an entry resting unknown (or purges a failed one)."""
            expected = self.model.get(key)
            if expected is None or expected.status not in (DeliveryStatus.UNKNOWN,
                                                             DeliveryStatus.FAILED):
                return
            if how == "purge":
                self.store.purge(self.ids[key])
                del self.model[key]  # its effect record stays: never enqueued again
            elif expected.status is DeliveryStatus.UNKNOWN and how == "mark":
                assert self.store.mark_delivered(self.ids[key], now=self.now).status \
                    is DeliveryStatus.ACKED
                expected.status = DeliveryStatus.ACKED
            elif expected.status is DeliveryStatus.UNKNOWN:
                entry = self.store.send_again(self.ids[key], now=self.now)
                assert (entry.status, entry.attempts) == (DeliveryStatus.PENDING, 0)
                expected.status, expected.attempts, expected.unknown = (
                    DeliveryStatus.PENDING, 0, 0)
                expected.next_at = self.now

        @invariant()
        def store_matches_model(self) -> None:
            stored = {e.idempotency_key: e for e in self.store.list(limit=500)}
            assert set(stored) == set(self.model), "nothing lost, nothing invented"
            for key, expected in self.model.items():
                entry = stored[key]
                assert (entry.status, entry.attempts, entry.unknown_sends) == (
                    expected.status, expected.attempts, expected.unknown), key
                assert entry.attempts <= MAX_ATTEMPTS, "the limit is a limit"
                if key not in DEDUPLICATING:
                    assert entry.unknown_sends <= RESENDS + 1, "one more send at most"
            assert self.store.known_effects(KEYS) == self.recorded, "effects outlive entries"

    return DeliveryQueueModel


def test_the_delivery_queue_behaves_like_its_model(db: Database) -> None:
    run_model(machine_for(db))
