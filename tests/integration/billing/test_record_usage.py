"""The producer: one ledger row and its outbox row in one transaction, or the Redis queue."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from sluice.billing.ledger_redrive import redrive
from sluice.billing.usage import record_usage, usage_figures
from sluice.core.errors import PermanentStoreError, TransientStoreError
from sluice.jobs.registry import Deadline
from sluice.store.db import Database, PostgresDatabase, open_database, utcnow
from sluice.store.redis_clients import LEDGER_RETRY_QUEUE, RedisClient
from tests.conftest import free_port
from tests.integration.billing.usage_data import T0, entry


@pytest.fixture
def store(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


@pytest.fixture
def unreachable_pg() -> Iterator[PostgresDatabase]:
    database = PostgresDatabase(f"postgresql://postgres@127.0.0.1:{free_port()}/none",
                                timeout=0.5)
    yield database
    database.close()


def table(db: Database, name: str) -> list[dict[str, object]]:
    with db.transaction() as tx:
        return tx.fetchall(f"SELECT * FROM {name} ORDER BY id")


def test_a_billable_entry_writes_ledger_and_outbox_rows(store: Database) -> None:
    assert record_usage(entry(1), db=store, redis=None) == "recorded"
    assert record_usage(entry(1), db=store, redis=None) == "duplicate"
    [ledger] = table(store, "ai_usage_ledger")
    [outbox] = table(store, "ai_usage_metering_outbox")
    assert ledger["id"] == "use-00001" and ledger["occurred_at"] == entry(1).occurred_at
    assert (outbox["id"], outbox["ledger_id"], outbox["status"], outbox["attempt_count"]) == \
        ("use-00001:metering", "use-00001", "pending", 0)
    assert outbox["last_error"] is None and outbox["processed_at"] is None


@pytest.mark.parametrize("changes", [
    {"tenant_id": None, "user_id": None},
    {"input_tokens": 0, "output_tokens": 0, "cost_micros": 0},
])
def test_an_entry_that_is_not_billable_writes_no_outbox_row(store: Database,
                                                            changes: dict[str, object]) -> None:
    assert record_usage(entry(2, **changes), db=store, redis=None) == "recorded"
    assert len(table(store, "ai_usage_ledger")) == 1
    assert table(store, "ai_usage_metering_outbox") == []


def test_the_user_is_billed_when_there_is_no_tenant(store: Database) -> None:
    record_usage(entry(3, tenant_id=None), db=store, redis=None)
    [outbox] = table(store, "ai_usage_metering_outbox")
    assert outbox["external_customer_id"] == "u3"


def test_an_unreachable_postgres_parks_the_entry_in_redis(
        unreachable_pg: PostgresDatabase, redis_client: RedisClient, pg_url: str) -> None:
    assert record_usage(entry(4), db=unreachable_pg, redis=redis_client, now=T0) == "queued"
    [raw] = redis_client.lrange(LEDGER_RETRY_QUEUE, 0, -1)
    item = json.loads(raw)
    assert item["id"] == "use-00004" and item["attempts"] == 0
    assert item["enqueuedAt"] == "2026-03-01T12:00:00.000Z"
    assert item["lastError"].startswith("store_unavailable: ")
    assert item["entry"] == {"id": "use-00004", "tenantId": "t1", "userId": "u4",
                             "model": "gpt-4.1-mini", "inputTokens": 104, "outputTokens": 20,
                             "costMicros": 1004, "occurredAt": "2026-03-01T12:00:04.000Z"}
    # ... and the redrive later writes what the producer would have written.
    pg = open_database(pg_url)
    result = redrive(redis_client, pg, now=T0, deadline=Deadline(30))
    assert result["succeeded"] == 1
    assert [r["id"] for r in table(pg, "ai_usage_metering_outbox")] == ["use-00004:metering"]
    pg.close()


def test_without_redis_an_unreachable_postgres_raises(unreachable_pg: PostgresDatabase) -> None:
    with pytest.raises(TransientStoreError):
        record_usage(entry(5), db=unreachable_pg, redis=None)


def test_a_permanent_error_is_not_parked(store: Database, redis_client: RedisClient) -> None:
    with store.transaction() as tx:
        tx.execute("DROP TABLE ai_usage_metering_outbox")
    with pytest.raises(PermanentStoreError):
        record_usage(entry(6), db=store, redis=redis_client)
    assert redis_client.llen(LEDGER_RETRY_QUEUE) == 0
    assert table(store, "ai_usage_ledger") == [], "the ledger row went with its transaction"


def test_figures_for_the_operations_page(store: Database, redis_client: RedisClient) -> None:
    assert usage_figures(store, None) == {
        "meteringOutbox": {"pending": 0, "processed": 0, "retrying": 0, "exhausted": 0,
                           "oldestEligibleAt": None},
        "ledgerRetry": None}
    started = utcnow()
    for i in range(4):
        record_usage(entry(i), db=store, redis=None)
    with store.transaction() as tx:
        tx.execute("UPDATE ai_usage_metering_outbox SET status = 'processed' "
                   "WHERE ledger_id = 'use-00000'")
        tx.execute("UPDATE ai_usage_metering_outbox SET status = 'failed', attempt_count = 2 "
                   "WHERE ledger_id = 'use-00001'")
        tx.execute("UPDATE ai_usage_metering_outbox SET status = 'failed', attempt_count = 5 "
                   "WHERE ledger_id = 'use-00002'")
    redis_client.lpush(LEDGER_RETRY_QUEUE, "a", "b")
    figures = usage_figures(store, redis_client)
    assert figures["ledgerRetry"] == {"queue": 2, "processing": 0, "dlq": 0}
    outbox = figures["meteringOutbox"]
    assert (outbox["pending"], outbox["processed"], outbox["retrying"], outbox["exhausted"]) \
        == (1, 1, 1, 1)
    oldest = datetime.fromisoformat(outbox["oldestEligibleAt"])
    assert outbox["oldestEligibleAt"].endswith("Z")
    assert started - timedelta(seconds=1) <= oldest <= utcnow()
