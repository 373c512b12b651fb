"""One bad item never stops a billing drain: a poisoned entry or row among good ones is
that item's failure, recorded with its reason, and the good ones go through."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from sluice.billing.ledger_redrive import redrive
from sluice.billing.metering import OutboxStore, PolarClient, flush
from sluice.billing.usage import insert_entries
from sluice.egress import Egress
from sluice.jobs.registry import Deadline
from sluice.store.db import Database, open_database
from sluice.store.redis_clients import LEDGER_RETRY_DLQ, LEDGER_RETRY_QUEUE, RedisClient
from tests.integration.billing.usage_data import T0, entry, envelope
from tests.providers.polar import PolarStandIn


@pytest.fixture
def store(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


@pytest.mark.redis
def test_an_entry_nested_past_the_parser_s_depth_is_dead_lettered_alone(
        redis_client: RedisClient, store: Database) -> None:
    poisoned = '{"id": "deep", "entry": ' + "[" * 100_000 + "]" * 100_000 + "}"
    redis_client.lpush(LEDGER_RETRY_QUEUE, envelope(1), poisoned, envelope(2))

    result = redrive(redis_client, store, now=T0, deadline=Deadline(60))

    assert (result["succeeded"], result["deadLettered"], result["reason"]) == (2, 1, None)
    [dead] = redis_client.lrange(LEDGER_RETRY_DLQ, 0, -1)
    assert json.loads(dead)["reason"].startswith("malformed: RecursionError")
    again = redrive(redis_client, store, now=T0, deadline=Deadline(60))
    assert again["drained"] == 0, "the poisoned entry does not come back"


def test_a_row_json_cannot_carry_fails_alone_and_for_good(
        sqlite_url: str, polar: PolarStandIn) -> None:
    # SQLite keeps the text as written, and reads it back as an infinite float, which no
    # JSON request can carry (Postgres's jsonb spells 1e1000 out in digits instead).
    store = open_database(sqlite_url)
    insert_entries(store, [entry(i) for i in range(3)])
    with store.transaction() as tx:
        tx.execute("UPDATE ai_usage_metering_outbox SET metadata = '{\"n\": 1e1000}' "
                   "WHERE ledger_id = 'use-00001'")

    with Egress(timeout_s=5) as http:
        client = PolarClient(polar.url, polar.token, client=http)
        result = flush(OutboxStore(store), client, now=T0, deadline=Deadline(60))
        again = flush(OutboxStore(store), client, now=T0, deadline=Deadline(60))

    assert (result["processed"], result["failed"], result["reason"]) == (2, 1, None)
    assert sorted(polar.events) == ["use-00000:metering", "use-00002:metering"]
    with store.transaction() as tx:
        bad = tx.fetchone("SELECT * FROM ai_usage_metering_outbox WHERE ledger_id = 'use-00001'")
    assert bad is not None and bad["status"] == "failed"
    assert "unsendable" in bad["last_error"]
    assert (again["processed"], again["failed"]) == (0, 0), "used up: not tried again"
    store.close()
