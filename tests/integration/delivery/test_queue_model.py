"""The delivery queue against a model: enqueue, claim, ack, nack, fail, lease expiry,
recovery and redrive in any order, on the real store; after every step each entry's
status and attempts match the model, nothing is lost, and a settle by a holder whose
claim was superseded changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from shared.delivery.store import DEFAULT_SCHEDULE, DeliveryEntry, DeliveryStatus, DeliveryStore
from shared.store.db import Database
from tests.model import EPOCH, run_model

LEASE = timedelta(seconds=60)
KEYS = [f"k{i}" for i in range(4)]
SETTLES = ("ack", "nack", "fail")


@dataclass
class Expected:
    status: DeliveryStatus
    attempts: int
    next_at: datetime  # due time when pending, lease end when in flight


def machine_for(db: Database) -> type[RuleBasedStateMachine]:
    class DeliveryQueueModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with db.transaction() as tx:
                tx.execute("DELETE FROM delivery_queue")
            self.store = DeliveryStore(db)
            self.now = EPOCH
            self.model: dict[str, Expected] = {}
            self.ids: dict[str, str] = {}
            self.held: list[DeliveryEntry] = []

        def _due(self) -> set[str]:
            return {k for k, e in self.model.items()
                    if e.status is DeliveryStatus.PENDING and e.next_at <= self.now}

        @rule(key=st.sampled_from(KEYS))
        def enqueue(self, key: str) -> None:
            entry, created = self.store.enqueue("webhook", "http://127.0.0.1:9/h", {"k": key},
                                                idempotency_key=key, now=self.now)
            assert created == (key not in self.model)
            if created:
                self.model[key] = Expected(DeliveryStatus.PENDING, 0, self.now)
                self.ids[key] = entry.id
            assert entry.id == self.ids[key]

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
            if then == "hold":
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
            elif how == "fail":
                assert self.store.fail(entry, "chat not found", now=self.now) == ours
                if ours:
                    expected.status = DeliveryStatus.FAILED
            else:
                status = self.store.nack(entry, "503 from the stand-in", now=self.now)
                if not ours:
                    assert status is None
                    return
                decision = DEFAULT_SCHEDULE.decide(entry.attempts)
                if decision.retry:
                    assert status is DeliveryStatus.PENDING
                    expected.status = DeliveryStatus.PENDING
                    expected.next_at = self.now + decision.delay
                else:
                    assert status is DeliveryStatus.FAILED
                    expected.status = DeliveryStatus.FAILED

        @rule(seconds=st.sampled_from([61, 600, 7200, 1]))
        def next_drain(self, seconds: int) -> None:
            """Time passes; the next drain starts by recovering lapsed leases."""
            self.now += timedelta(seconds=seconds)
            lapsed = [e for e in self.model.values()
                      if e.status is DeliveryStatus.IN_FLIGHT and e.next_at < self.now]
            back, failed = self.store.recover(now=self.now)
            gone = [e for e in lapsed if e.attempts >= DEFAULT_SCHEDULE.max_attempts]
            assert (back, failed) == (len(lapsed) - len(gone), len(gone))
            for e in lapsed:
                e.status = DeliveryStatus.FAILED if e in gone else DeliveryStatus.PENDING
                e.next_at = self.now

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

        @invariant()
        def store_matches_model(self) -> None:
            stored = {e.idempotency_key: e for e in self.store.list(limit=500)}
            assert set(stored) == set(self.model), "nothing lost, nothing invented"
            for key, expected in self.model.items():
                entry = stored[key]
                assert (entry.status, entry.attempts) == (expected.status, expected.attempts), key

    return DeliveryQueueModel


def test_the_delivery_queue_behaves_like_its_model(db: Database) -> None:
    run_model(machine_for(db))
