"""Completed idempotency keys against a model: complete, look up (one and many), retire
expired keys, as time passes, on the real store; a key is done exactly while its
retention lasts, and completing it again extends it."""

from __future__ import annotations

from datetime import datetime, timedelta

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sluice.queues.keys import CompletedKeys
from sluice.store.db import Database
from tests.model import EPOCH, run_model

RETENTION = timedelta(hours=1)
KEYS = [f"rss.ingest:{i}" for i in range(5)]


def machine_for(db: Database) -> type[RuleBasedStateMachine]:
    class CompletedKeysModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            with db.transaction() as tx:
                tx.execute("DELETE FROM queue_completed_keys")
            self.keys = CompletedKeys(db, RETENTION)
            self.now = EPOCH
            self.expires: dict[str, datetime] = {}

        def _done(self, key: str) -> bool:
            return key in self.expires and self.expires[key] > self.now

        @rule(key=st.sampled_from(KEYS))
        def complete(self, key: str) -> None:
            self.keys.complete(key, "rss.ingest", f"m-{key}", now=self.now)
            self.expires = {k: at for k, at in self.expires.items()
                            if not at < self.now or k == key}  # each write retires expired keys
            self.expires[key] = self.now + RETENTION

        @rule(key=st.sampled_from(KEYS))
        def done(self, key: str) -> None:
            assert self.keys.done(key, now=self.now) == self._done(key)

        @rule(keys=st.lists(st.sampled_from(KEYS), max_size=5))
        def done_many(self, keys: list[str]) -> None:
            assert self.keys.done_many(keys, now=self.now) == {k for k in keys if self._done(k)}

        @rule(minutes=st.sampled_from([1, 30, 59, 60, 61, 240]))
        def tick(self, minutes: int) -> None:
            self.now += timedelta(minutes=minutes)

        @rule()
        def delete_expired(self) -> None:
            gone = [k for k, at in self.expires.items() if at < self.now]
            assert self.keys.delete_expired(now=self.now) == len(gone)
            for key in gone:
                del self.expires[key]

        @invariant()
        def table_matches_model(self) -> None:
            with db.transaction() as tx:
                rows = {r["key"] for r in tx.fetchall("SELECT key FROM queue_completed_keys")}
            assert rows == set(self.expires)
            assert self.keys.done_many(KEYS, now=self.now) == {k for k in KEYS if self._done(k)}

    return CompletedKeysModel


def test_completed_keys_behave_like_their_model(db: Database) -> None:
    run_model(machine_for(db))
