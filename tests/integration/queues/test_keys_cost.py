"""Recording a completed key costs one round trip on Postgres (a write-only transaction)."""

from __future__ import annotations

from sluice.queues.keys import CompletedKeys
from sluice.store.db import PostgresDatabase
from tests.integration.store.test_transaction_cost import round_trips


def test_a_completion_and_a_lookup_are_one_round_trip_each(pg_url: str) -> None:
    db = PostgresDatabase(pg_url, max_size=1)
    keys = CompletedKeys(db)
    try:
        keys.complete("rss.ingest:warm", "rss.ingest", "m-0")
        flights, trace = round_trips(db, lambda: keys.complete("rss.ingest:a", "rss.ingest", "m-1"))
        assert flights == 1, trace  # insert, retire expired keys and COMMIT in one flight
        flights, trace = round_trips(db, lambda: keys.done_many(["rss.ingest:a", "rss.ingest:b"]))
        assert flights == 1, trace  # a read-only transaction of one statement: one flight
        assert keys.done_many(["rss.ingest:a", "rss.ingest:b"]) == {"rss.ingest:a"}
    finally:
        db.close()
