"""Erased users stay erased: every producer of ledger rows honours erasure tombstones."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sluice.billing.ledger_redrive import redrive
from sluice.billing.usage import record_usage
from sluice.jobs.registry import Deadline
from sluice.store.db import Database, open_database
from sluice.store.redis_clients import LEDGER_RETRY_DLQ, LEDGER_RETRY_QUEUE, RedisClient
from tests.integration.billing.usage_data import T0, entry, envelope


@pytest.fixture
def store(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


def tombstone(db: Database, subject: str) -> None:
    with db.transaction() as tx:
        tx.execute("INSERT INTO erasure_tombstones (subject_user_id, request_id, erased_at, "
                   "sweep_pending) VALUES (:s, 'req-1', :now, false)", {"s": subject, "now": T0})


def ids(db: Database, table: str) -> list[str]:
    with db.transaction() as tx:
        return [r["id"] for r in tx.fetchall(f"SELECT id FROM {table} ORDER BY id")]


def test_record_usage_drops_an_entry_of_an_erased_user(store: Database) -> None:
    tombstone(store, "u1")
    assert record_usage(entry(1), db=store, redis=None) == "erased"
    assert record_usage(entry(2), db=store, redis=None) == "recorded"
    assert ids(store, "ai_usage_ledger") == ["use-00002"]


def test_an_erased_customer_gets_no_outbox_row(store: Database) -> None:
    tombstone(store, "t-gone")
    assert record_usage(entry(3, tenant_id="t-gone"), db=store, redis=None) == "recorded"
    assert ids(store, "ai_usage_ledger") == ["use-00003"]
    assert ids(store, "ai_usage_metering_outbox") == []


def test_ledger_redrive_drops_and_counts_entries_of_an_erased_user(
        store: Database, redis_client: RedisClient) -> None:
    tombstone(store, "u1")
    redis_client.lpush(LEDGER_RETRY_QUEUE, envelope(1), envelope(2), envelope(11, user_id="u1"))
    result = redrive(redis_client, store, now=T0, deadline=Deadline(60))
    assert (result["drained"], result["succeeded"], result["erased"]) == (3, 1, 2)
    assert result["deadLettered"] == 0 and result["errors"] == []
    assert ids(store, "ai_usage_ledger") == ["use-00002"]
    assert redis_client.llen(LEDGER_RETRY_QUEUE) == redis_client.llen(LEDGER_RETRY_DLQ) == 0
    assert not any(json.loads(raw).get("entry", {}).get("userId") == "u1"
                   for raw in redis_client.lrange(LEDGER_RETRY_DLQ, 0, -1))
