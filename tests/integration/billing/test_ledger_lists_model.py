"""The ledger retry lists against a model: push, claim, settle (ack / requeue / dead-letter),
a worker that dies and the reclaim, and settles by workers whose claim was reclaimed, in any
order on the real Redis (both transports); the three lists match the model exactly, and
every entry is in exactly one place (queue, processing, DLQ) or acknowledged once."""

from __future__ import annotations

from collections import Counter

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.billing.ledger_redrive import Settlement, claim, reclaim, settle
from sluice.billing.usage import RetryEnvelope, UsageEntry
from sluice.store.redis_clients import (
    LEDGER_RETRY_DLQ,
    LEDGER_RETRY_PROCESSING,
    LEDGER_RETRY_QUEUE,
    RedisClient,
)
from tests.model import EPOCH, run_model

OPS = ("ack", "requeue", "dlq")


def envelope_id(raw: str) -> str:
    return RetryEnvelope.parse(raw).id


def machine_for(redis: RedisClient) -> type[RuleBasedStateMachine]:
    class LedgerListsModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            redis.delete(LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING, LEDGER_RETRY_DLQ)
            self.queue: list[str] = []  # left to right, as LRANGE 0 -1 shows it
            self.processing: list[str] = []
            self.dlq: list[str] = []
            self.acked: Counter[str] = Counter()
            self.held: list[list[str]] = []
            self.pushed = 0

        @rule()
        def push(self) -> None:
            entry = UsageEntry(id=f"e{self.pushed}", model="m", occurred_at=EPOCH, user_id="u")
            self.pushed += 1
            raw = RetryEnvelope.for_entry(entry, last_error="seeded", now=EPOCH).to_json()
            redis.lpush(LEDGER_RETRY_QUEUE, raw)
            self.queue.insert(0, raw)

        @rule(count=st.integers(1, 3))
        def claim(self, count: int) -> None:
            got = claim(redis, count)
            expected = [self.queue.pop() for _ in range(min(count, len(self.queue)))]
            assert got == expected, "oldest first"
            for raw in got:
                self.processing.insert(0, raw)
            if got:
                self.held.append(got)

        @rule(index=st.integers(0, 5), op=st.sampled_from(OPS))
        def settle(self, index: int, op: str) -> None:
            if not self.held:
                return
            batch = self.held.pop(index % len(self.held))
            plan = Settlement()
            for raw in batch:
                if op == "ack":
                    plan.ack(raw)
                elif op == "requeue":
                    plan.later(raw, RetryEnvelope.parse(raw), "store_unavailable: model")
                else:
                    plan.dead(raw, "malformed: model", EPOCH)
            counts = [0, 0, 0]
            for step, raw, replacement in plan.steps:
                if raw not in self.processing:
                    continue  # reclaimed meanwhile: not pushed again
                self.processing.remove(raw)
                if step == "ack":
                    self.acked[envelope_id(raw)] += 1
                    counts[0] += 1
                elif step == "requeue":
                    self.queue.insert(0, replacement)
                    counts[1] += 1
                else:
                    self.dlq.insert(0, replacement)
                    counts[2] += 1
            assert list(settle(redis, plan.steps)) == counts

        @rule()
        def worker_dies_and_reclaim(self) -> None:
            """Everything in processing goes back, the oldest claim rightmost again."""
            moved = reclaim(redis)
            assert moved == len(self.processing)
            self.queue = self.queue + self.processing  # LMOVE LEFT -> RIGHT, one by one
            self.processing = []

        @invariant()
        def lists_match_and_nothing_is_lost_or_doubled(self) -> None:
            assert redis.lrange(LEDGER_RETRY_QUEUE, 0, -1) == self.queue
            assert redis.lrange(LEDGER_RETRY_PROCESSING, 0, -1) == self.processing
            assert redis.lrange(LEDGER_RETRY_DLQ, 0, -1) == self.dlq
            places = Counter(envelope_id(raw) for raw in self.queue + self.processing + self.dlq)
            places.update(self.acked)
            assert set(places) == {f"e{i}" for i in range(self.pushed)}, "nothing lost"
            assert all(n == 1 for n in places.values()), "each entry in one place, acked once"

    return LedgerListsModel


def test_the_ledger_lists_behave_like_their_model(redis_client: RedisClient) -> None:
    run_model(machine_for(redis_client))
