"""ledger-redrive over both Redis transports (real Redis) into both SQL backends."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sluice.billing.ledger_redrive import (
    DEFAULT_REDRIVE_BATCH_SIZE,
    MAX_ATTEMPTS,
    claim,
    reclaim,
    redrive,
)
from sluice.billing.usage import insert_entries
from sluice.core.errors import TransientStoreError
from sluice.core.services import Services
from sluice.jobs.registry import JOBS, Deadline
from sluice.jobs.runner import run_job
from sluice.store.db import Database, open_database
from sluice.store.redis_clients import (
    LEDGER_RETRY_DLQ,
    LEDGER_RETRY_PROCESSING,
    LEDGER_RETRY_QUEUE,
    RedisClient,
    UpstashClient,
)
from tests.conftest import free_port
from tests.integration.billing.usage_data import T0, entry, envelope
from tests.providers.upstash import UpstashRestServer

pytestmark = [pytest.mark.redis]
QUEUE, PROCESSING, DLQ = LEDGER_RETRY_QUEUE, LEDGER_RETRY_PROCESSING, LEDGER_RETRY_DLQ


@pytest.fixture
def store(db_url: str) -> Iterator[Database]:
    database = open_database(db_url)
    yield database
    database.close()


def ledger_ids(db: Database) -> list[str]:
    with db.transaction() as tx:
        return [r["id"] for r in tx.fetchall("SELECT id FROM ai_usage_ledger ORDER BY id")]


def outbox_ids(db: Database) -> list[str]:
    with db.transaction() as tx:
        return [r["ledger_id"] for r in
                tx.fetchall("SELECT ledger_id FROM ai_usage_metering_outbox ORDER BY ledger_id")]


def poison(db: Database) -> None:
    """Make the store refuse ledger rows whose model is 'poison' (a constraint violation)."""
    with db.transaction() as tx:
        if tx.dialect == "postgres":
            tx.execute("ALTER TABLE ai_usage_ledger ADD CONSTRAINT no_poison "
                       "CHECK (model <> 'poison')")
        else:
            tx.execute("CREATE TRIGGER no_poison BEFORE INSERT ON ai_usage_ledger "
                       "WHEN NEW.model = 'poison' BEGIN SELECT RAISE(ABORT, 'poisoned'); END")


def enqueue(redis: RedisClient, items: list[str]) -> None:
    """As producers do: LPUSH, so the oldest is the queue's right end."""
    for start in range(0, len(items), 500):
        redis.lpush(QUEUE, *items[start:start + 500])


def run(redis: RedisClient, db: Database, **kwargs: Any) -> dict[str, Any]:
    return redrive(redis, db, now=T0, deadline=Deadline(60), **kwargs)


def test_a_batch_lands_in_the_ledger_with_its_outbox_rows(redis_client: RedisClient,
                                                          store: Database) -> None:
    enqueue(redis_client, [envelope(i) for i in range(150)]
            + [envelope(900, tenant_id=None, user_id=None)])  # not billable: no customer
    first = run(redis_client, store, max_batches=1)
    assert first == {"drained": 100, "succeeded": 100, "requeued": 0, "deadLettered": 0,
                     "erased": 0, "errors": [], "reason": None}
    assert ledger_ids(store) == [f"use-{i:05d}" for i in range(100)], "oldest first"
    second = run(redis_client, store)
    assert (second["drained"], second["succeeded"]) == (51, 51)
    assert len(ledger_ids(store)) == 151
    assert outbox_ids(store) == [f"use-{i:05d}" for i in range(150)]
    with store.transaction() as tx:
        row = tx.fetchone("SELECT * FROM ai_usage_ledger WHERE id = 'use-00007'")
        outbox = tx.fetchone("SELECT * FROM ai_usage_metering_outbox WHERE ledger_id = 'use-00007'")
    assert row is not None and outbox is not None
    assert (row["tenant_id"], row["user_id"], row["input_tokens"], row["cost_micros"]) == \
        ("t1", "u7", 107, 1007)
    assert row["occurred_at"] == entry(7).occurred_at
    assert outbox["id"] == "use-00007:metering" and outbox["status"] == "pending"
    assert outbox["external_customer_id"] == "t1"
    assert outbox["metadata"]["total_tokens"] == 127
    for name in (QUEUE, PROCESSING, DLQ):
        assert redis_client.llen(name) == 0


def test_an_entry_already_in_the_ledger_is_not_counted_twice(redis_client: RedisClient,
                                                             store: Database) -> None:
    insert_entries(store, [entry(1)])
    with store.transaction() as tx:
        tx.execute("DELETE FROM ai_usage_metering_outbox")  # e.g. billed and archived
    enqueue(redis_client, [envelope(1), envelope(1), envelope(2)])
    result = run(redis_client, store)
    assert (result["drained"], result["succeeded"]) == (3, 3)
    assert ledger_ids(store) == ["use-00001", "use-00002"]
    assert outbox_ids(store) == ["use-00002"], "a row already in the ledger brings no new outbox row"



def test_an_entry_s_time_is_stored_as_python_reads_it(redis_client: RedisClient,
                                                      store: Database) -> None:
    # GIVEN entries whose occurredAt Python accepts in forms Postgres reads otherwise or not
    # at all (offsets, no offset = UTC, ISO basic and week dates, 7 fraction digits)
    forms = ["2026-03-01T12:00:00.000Z", "2026-03-01T13:00:00+01:00", "2026-03-01T12:00:00",
             "20260301T120000Z", "2026-W09-7T12:00Z", "2026-03-01T12:00:00.0000009Z"]
    raws = []
    for i, occurred in enumerate(forms):
        data = json.loads(envelope(i))
        data["entry"]["occurredAt"] = occurred
        raws.append(json.dumps(data))
    enqueue(redis_client, raws)
    # WHEN they are redriven
    result = run(redis_client, store)
    # THEN every one is stored at the instant Python read from it
    assert result["succeeded"] == len(forms) and result["deadLettered"] == 0
    with store.transaction() as tx:
        stored = [r["occurred_at"] for r in
                  tx.fetchall("SELECT occurred_at FROM ai_usage_ledger ORDER BY id")]
    assert stored == [T0] * len(forms)

@pytest.mark.parametrize("raw, reason", [
    ("not json", "malformed: not JSON"),
    ("[1, 2]", "malformed: not a JSON object"),
    ('{"attempts": 0, "entry": {}}', "malformed: no string id"),
    ('{"id": "x1", "entry": "nope"}', "malformed: no entry object"),
    ('{"id": "x2", "entry": {"id": "x2", "model": "m"}}', "malformed: entry.occurredAt is not a string"),
    (('{"id": "x3", "entry": {"id": "x3", "model": "m", "occurredAt": "2026-01-01T00:00:00Z",'
      ' "inputTokens": -4}}'), "malformed: usage entry input_tokens must be a whole number >= 0"),
    (('{"id": "x5", "entry": {"id": "x5", "model": "m", "occurredAt": "2026-01-01T00:00:00Z",'
      ' "outputTokens": 4294967296}}'),
     "malformed: usage entry output_tokens is larger than 2147483647"),
    ('{"id": "x4", "entry": {"id": "other", "model": "m", "occurredAt": "2026-01-01T00:00:00Z"}}',
     "malformed: entry.id does not match id"),
])
def test_a_malformed_entry_goes_to_the_dlq_at_once(redis_client: RedisClient, store: Database,
                                                   raw: str, reason: str) -> None:
    enqueue(redis_client, [envelope(1), raw, envelope(2)])
    result = run(redis_client, store)
    assert result == {"drained": 3, "succeeded": 2, "requeued": 0, "deadLettered": 1,
                      "erased": 0, "errors": [], "reason": None}
    [dead] = redis_client.lrange(DLQ, 0, -1)
    item = json.loads(dead)
    assert item["reason"] == reason
    assert item["deadLetteredAt"] == "2026-03-01T12:00:00.000Z"
    if raw.startswith("{"):
        assert {k: item[k] for k in json.loads(raw)} == json.loads(raw), "the entry is kept"
    else:
        assert item["raw"] == raw and item["id"] is None
    assert redis_client.llen(QUEUE) == redis_client.llen(PROCESSING) == 0


class DownDatabase:
    """A Database whose every transaction fails as an unreachable Postgres would."""

    dialect = "postgres"

    def transaction(self) -> Any:
        raise TransientStoreError("postgres: connection refused")

    def close(self) -> None:
        pass


def test_an_unreachable_store_requeues_without_counting_and_stops(
        redis_client: RedisClient) -> None:
    enqueue(redis_client, [envelope(i) for i in range(5)] + [envelope(9, attempts=MAX_ATTEMPTS - 1)])
    result = run(redis_client, DownDatabase())  # type: ignore[arg-type]
    assert result["drained"] == 6 and result["succeeded"] == 0
    assert (result["requeued"], result["deadLettered"]) == (6, 0)
    assert result["errors"] == ["store_unavailable: postgres: connection refused"]
    assert result["reason"] == "store_unavailable"
    queued = {q["id"]: q for q in map(json.loads, redis_client.lrange(QUEUE, 0, -1))}
    assert sorted(queued) == [f"use-{i:05d}" for i in (0, 1, 2, 3, 4, 9)]
    assert {q["id"]: q["attempts"] for q in queued.values()} == {
        **{f"use-{i:05d}": 0 for i in range(5)}, "use-00009": MAX_ATTEMPTS - 1}
    assert {q["lastError"] for q in queued.values()} == {
        "store_unavailable: postgres: connection refused"}
    assert queued["use-00000"]["entry"] == entry(0).to_contract()
    assert redis_client.llen(DLQ) == 0 and redis_client.llen(PROCESSING) == 0


def test_a_long_outage_dead_letters_nothing(redis_client: RedisClient, store: Database) -> None:
    enqueue(redis_client, [envelope(1), envelope(2, attempts=MAX_ATTEMPTS - 1)])
    for _ in range(MAX_ATTEMPTS * 3):
        result = run(redis_client, DownDatabase())  # type: ignore[arg-type]
        assert (result["drained"], result["deadLettered"]) == (2, 0)
    assert redis_client.llen(DLQ) == 0
    assert run(redis_client, store)["succeeded"] == 2
    assert ledger_ids(store) == ["use-00001", "use-00002"]


def test_refusals_count_until_the_dlq_and_nothing_loops(redis_client: RedisClient,
                                                        store: Database) -> None:
    poison(store)
    enqueue(redis_client, [envelope(1, model="poison")])
    for attempt in range(1, MAX_ATTEMPTS + 1):
        result = run(redis_client, store)
        assert result["drained"] == 1
        if attempt < MAX_ATTEMPTS:
            assert json.loads(redis_client.lrange(QUEUE, 0, -1)[0])["attempts"] == attempt
    assert result["deadLettered"] == 1
    assert redis_client.llen(QUEUE) == 0 and redis_client.llen(DLQ) == 1
    assert run(redis_client, store)["drained"] == 0


def test_a_run_pages_until_its_deadline(redis_client: RedisClient, store: Database) -> None:
    enqueue(redis_client, [envelope(i) for i in range(450)])
    ticks = iter(range(10_000))  # one tick per look at the clock: three batches fit
    deadline = Deadline(4, clock=lambda: float(next(ticks)))
    result = redrive(redis_client, store, now=T0, deadline=deadline)
    assert (result["drained"], result["succeeded"], result["reason"]) == (300, 300, "deadline")
    assert redis_client.llen(QUEUE) == 150


def test_one_poisoned_entry_does_not_block_its_batch(redis_client: RedisClient,
                                                     store: Database) -> None:
    poison(store)
    poisoned = envelope(3, model="poison")  # valid JSON contract, refused by the store
    enqueue(redis_client, [envelope(1), envelope(2), poisoned, envelope(4)])
    result = run(redis_client, store)
    assert (result["succeeded"], result["requeued"]) == (3, 1)
    assert len(result["errors"]) == 1 and result["errors"][0].startswith("use-00003: ")
    assert ledger_ids(store) == ["use-00001", "use-00002", "use-00004"]
    [back] = [json.loads(raw) for raw in redis_client.lrange(QUEUE, 0, -1)]
    assert back["id"] == "use-00003" and back["attempts"] == 1 and back["lastError"]


def test_reclaim_returns_stranded_entries_in_their_order(redis_client: RedisClient) -> None:
    enqueue(redis_client, [envelope(i) for i in range(30)])
    claimed = claim(redis_client, 10)
    assert [json.loads(c)["id"] for c in claimed] == [f"use-{i:05d}" for i in range(10)]
    assert reclaim(redis_client, chunk=4) == 10
    assert redis_client.llen(PROCESSING) == 0
    oldest_first = list(reversed(redis_client.lrange(QUEUE, 0, -1)))
    assert [json.loads(c)["id"] for c in oldest_first] == [f"use-{i:05d}" for i in range(30)]


def test_a_stranded_batch_is_reclaimed_and_inserted_once(redis_client: RedisClient,
                                                         store: Database) -> None:
    enqueue(redis_client, [envelope(i) for i in range(20)])
    stranded = claim(redis_client, 8)  # a run that died after its claim
    insert_entries(store, [entry(i) for i in range(4)])  # ... and after part of an insert
    assert len(stranded) == 8
    result = run(redis_client, store)
    assert (result["drained"], result["succeeded"]) == (20, 20)
    assert ledger_ids(store) == [f"use-{i:05d}" for i in range(20)]
    assert redis_client.llen(PROCESSING) == 0 and redis_client.llen(QUEUE) == 0


def test_a_batch_of_100_costs_a_handful_of_round_trips(upstash_server: UpstashRestServer,
                                                       redis_prefix: str,
                                                       store: Database) -> None:
    client = UpstashClient.from_url(upstash_server.url, upstash_server.token, redis_prefix)
    enqueue(client, [envelope(i) for i in range(DEFAULT_REDRIVE_BATCH_SIZE)])
    upstash_server.reset_counts()
    result = run(client, store)
    assert result["succeeded"] == DEFAULT_REDRIVE_BATCH_SIZE
    assert upstash_server.calls == ["command"] * 4, \
        "reclaim, claim, settle: one EVAL each, and one empty claim that finds the end"
    client.close()


def test_the_job_runs_through_the_cron_contract(make_services: Callable[..., Services],
                                                db_url: str, redis_env: dict[str, str],
                                                redis_client: RedisClient) -> None:
    enqueue(redis_client, [envelope(i) for i in range(250)] + ["garbage"])
    services = make_services(db_url, **redis_env)
    outcome = run_job(JOBS["ledger-redrive"], services, "admin", params={"batches": "1"})
    assert outcome.status == 200 and outcome.outcome == "ok"
    assert outcome.body["drained"] == 100
    rest = run_job(JOBS["ledger-redrive"], services, "cli")
    assert rest.outcome == "failures", "a dead-lettered entry is reported"
    assert (rest.body["drained"], rest.body["deadLettered"]) == (151, 1)
    assert len(ledger_ids(services.db)) == 250
    bad = run_job(JOBS["ledger-redrive"], services, "admin", params={"batches": "0"})
    assert bad.status == 500 and "batches" in bad.body["error"]["message"]
    services.redis.close()


def test_without_redis_the_job_says_so(make_services: Callable[..., Services],
                                       sqlite_url: str) -> None:
    outcome = run_job(JOBS["ledger-redrive"], make_services(sqlite_url), "cli")
    assert outcome.body == {"drained": 0, "succeeded": 0, "requeued": 0, "deadLettered": 0,
                            "erased": 0, "errors": ["redis_not_configured"],
                            "reason": "redis_not_configured"}
    assert outcome.outcome == "ok", "not configured is not a failure: nothing pages"
    assert JOBS["ledger-redrive"].failures(outcome.body) == 0


def test_an_unreachable_redis_is_a_typed_error(make_services: Callable[..., Services],
                                               sqlite_url: str) -> None:
    services = make_services(sqlite_url, SLUICE_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    outcome = run_job(JOBS["ledger-redrive"], services, "cli")
    assert outcome.status == 500
    assert outcome.body["error"]["cause"] == "store_unavailable"


def test_an_expired_deadline_still_reclaims_but_claims_nothing(redis_client: RedisClient,
                                                               store: Database) -> None:
    enqueue(redis_client, [envelope(i) for i in range(5)])
    claim(redis_client, 2)
    result = redrive(redis_client, store, now=T0, deadline=Deadline(0))
    assert result["drained"] == 0
    assert redis_client.llen(QUEUE) == 5 and redis_client.llen(PROCESSING) == 0
