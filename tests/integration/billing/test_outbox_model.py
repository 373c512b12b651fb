"""The metering outbox against a model: rows added, claimed (the attempt counted at the
claim), settled processed / failed (counted, refunded, exhausted), an outage's attempts
given back, and a sender that dies with rows in flight, in any order on the real store;
each row's status and attempts match the model, and the eligible count with them."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.billing.metering import OutboxStore
from sluice.billing.usage import MAX_METERING_ATTEMPTS, UsageEntry, insert_entries
from sluice.store.db import Database
from tests.model import EPOCH, run_model

THEN = ("processed", "count", "refund", "exhaust", "dies", "outage")


@dataclass
class Row:
    status: str = "pending"
    attempts: int = 0

    @property
    def eligible(self) -> bool:
        return self.status == "pending" or (self.status == "failed"
                                            and self.attempts < MAX_METERING_ATTEMPTS)


def machine_for(db: Database) -> type[RuleBasedStateMachine]:
    class OutboxModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with db.transaction() as tx:
                tx.execute("DELETE FROM ai_usage_metering_outbox")
                tx.execute("DELETE FROM ai_usage_ledger")
            self.store = OutboxStore(db)
            self.rows: dict[str, Row] = {}
            self.added = 0

        def _by_ledger(self) -> dict[str, dict[str, object]]:
            with db.transaction() as tx:
                return {r["id"]: r for r in tx.fetchall("SELECT * FROM ai_usage_metering_outbox")}

        @rule(count=st.integers(1, 3))
        def add(self, count: int) -> None:
            entries = [UsageEntry(id=f"u{self.added + i}", model="m", occurred_at=EPOCH,
                                  tenant_id="t1", user_id="u") for i in range(count)]
            self.added += count
            insert_entries(db, entries)
            for row_id in self._by_ledger():
                self.rows.setdefault(str(row_id), Row())

        @rule(limit=st.integers(1, 3), then=st.sampled_from(THEN))
        def claim(self, limit: int, then: str) -> None:
            eligible = {k for k, r in self.rows.items() if r.eligible}
            claimed = [str(r["id"]) for r in self.store.claim(limit)]
            assert set(claimed) <= eligible and len(claimed) == min(limit, len(eligible))
            for row_id in claimed:
                self.rows[row_id].status = "failed"
                self.rows[row_id].attempts += 1
            if then == "dies":  # in flight for good: the attempt stays counted
                return
            if then == "processed":
                self.store.settle(claimed, {}, EPOCH)
                for row_id in claimed:
                    self.rows[row_id].status = "processed"
            elif then == "outage":  # failed as counted, then given back at the run's end
                self.store.settle([], {i: ("polar 503", "count") for i in claimed}, EPOCH)
                self.store.settle([], {}, EPOCH, refund=claimed)
                for row_id in claimed:
                    self.rows[row_id].attempts -= 1
            else:
                self.store.settle([], {i: ("polar says no", then) for i in claimed},  # type: ignore[misc]
                                  EPOCH)
                for row_id in claimed:
                    row = self.rows[row_id]
                    if then == "exhaust":
                        row.attempts = MAX_METERING_ATTEMPTS
                    elif then == "refund":
                        row.attempts -= 1

        @invariant()
        def store_matches_model(self) -> None:
            stored = self._by_ledger()
            assert set(map(str, stored)) == set(self.rows), "no row lost"
            for row_id, row in self.rows.items():
                got = stored[row_id]
                assert (got["status"], got["attempt_count"]) == (row.status, row.attempts), row_id
            assert self.store.eligible_count() == sum(r.eligible for r in self.rows.values())

    return OutboxModel


def test_the_metering_outbox_behaves_like_its_model(db: Database) -> None:
    run_model(machine_for(db))
