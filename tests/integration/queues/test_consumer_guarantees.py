"""What the consumer guarantees on both stores: no start without a secret, rejected messages
quarantined, deduplication on signed content only, and a batch that respects its deadline."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from sluice.core.errors import SluiceError
from sluice.core.services import Services
from sluice.queues.consumer import Consumer, InboundMessage, MessageOutcome
from sluice.queues.deadletters import Quarantine
from sluice.queues.keys import IDEMPOTENCY_ATTRIBUTE, CompletedKeys, dedupe_key, idempotency_key
from sluice.queues.publish import Publisher, Registry
from sluice.queues.signing import MissingSecret, Signer

SECRET = "queue-secret-for-tests-0123456789"


class Recorder:
    def __init__(self) -> None:
        self.batches: list[str] = []

    def __call__(self, message: dict[str, Any], inbound: InboundMessage) -> None:
        self.batches.append(message["batchId"])


def _services(db_url: str, make_services: Callable[..., Services], **env: str) -> Services:
    return make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET, **env)


def _message(batch: str, **fields: Any) -> dict[str, Any]:
    return Signer([SECRET]).sign({"topic": "rss.ingest", "batchId": batch, "sourceId": "s",
                                  "feedUrl": "", "publishedAt": "2026-11-30T00:00:00.000Z",
                                  **fields})


def _record(message: dict[str, Any] | str, *, key: str | None = None) -> dict[str, Any]:
    body = message if isinstance(message, str) else json.dumps(message)
    attributes = {} if key is None else {IDEMPOTENCY_ATTRIBUTE: {"stringValue": key,
                                                                  "dataType": "String"}}
    return {"messageId": str(uuid.uuid4()), "receiptHandle": "rh", "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "0"},
            "messageAttributes": attributes, "md5OfBody": "", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:eu-north-1:123456789012:t-rss-ingest",
            "awsRegion": "eu-north-1"}


def test_a_consumer_without_a_signing_secret_refuses_to_start(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url)
    with pytest.raises(MissingSecret, match="SLUICE_QUEUE_SIGNING_SECRET is not set"):
        Consumer("rss.ingest", Recorder(), services, registry=None)


def test_a_rejected_message_is_quarantined_and_never_runs(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(db_url, make_services)
    handler = Recorder()
    consumer = Consumer("rss.ingest", handler, services, registry=None)
    forged = Signer(["another-secret-0123456789abcdef"]).sign(_message("forged"))
    assert consumer.deliver_local(json.dumps(forged), "m-forged").outcome is MessageOutcome.REJECTED
    assert consumer.deliver_local("{nope", "m-malformed").outcome is MessageOutcome.REJECTED
    assert handler.batches == []
    rows = {row["id"]: row for row in Quarantine(services.db).list(10)}
    assert set(rows) == {"m-forged", "m-malformed"}
    assert rows["m-forged"]["reason"] == "signature does not match"
    assert json.loads(rows["m-forged"]["body"]) == forged
    assert rows["m-malformed"]["body"] == "{nope"
    assert rows["m-forged"]["topic"] == "rss.ingest"


def test_messages_sharing_the_first_96_characters_both_run(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(db_url, make_services)
    handler = Recorder()
    registry = Registry()
    Consumer("rss.ingest", handler, services, registry=registry)
    publisher = Publisher(services.settings, registry=registry)
    fields = {"batchId": "same", "feedUrl": "https://feeds.example/" + "x" * 120,
              "publishedAt": "2026-11-30T00:00:00.000Z"}
    first = publisher.publish("rss.ingest", {**fields, "item": 1})
    second = publisher.publish("rss.ingest", {**fields, "item": 2})
    assert first.idempotency_key == second.idempotency_key  # the attribute collides
    assert handler.batches == ["same", "same"]
    publisher.send_signed(second.message)  # the same signed content again: skipped
    assert handler.batches == ["same", "same"]
    assert CompletedKeys(services.db).done(dedupe_key("rss.ingest", second.message))


def test_the_unsigned_attribute_never_suppresses_nor_replays(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(db_url, make_services)
    handler = Recorder()
    consumer = Consumer("rss.ingest", handler, services, registry=None)
    done = _message("done")
    assert consumer.lambda_handler({"Records": [_record(done)]}) == {"batchItemFailures": []}
    fresh = _message("fresh")
    # A new message carrying a completed message's key runs; a completed message carrying
    # a new key does not run again.
    event = {"Records": [_record(fresh, key=idempotency_key(done)),
                         _record(done, key="rss.ingest:other:key")]}
    assert consumer.lambda_handler(event) == {"batchItemFailures": []}
    assert handler.batches == ["done", "fresh"]


class FakeLambda:
    """Lambda's remaining time, driven by the handler instead of the wall clock."""

    def __init__(self, budget_ms: int) -> None:
        self.budget_ms = budget_ms
        self.elapsed_s = 0.0

    def clock(self) -> float:
        return self.elapsed_s

    def get_remaining_time_in_millis(self) -> int:
        return int(self.budget_ms - self.elapsed_s * 1000)


def test_a_batch_stops_starting_records_when_time_is_short(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(db_url, make_services)
    lam = FakeLambda(30_000)
    keys = CompletedKeys(services.db)
    ran: list[str] = []
    messages = [_message(f"b{n}") for n in range(4)]

    def slow(message: dict[str, Any], inbound: InboundMessage) -> None:
        if ran:  # the previous record's completion is already written
            assert keys.done(dedupe_key("rss.ingest", messages[len(ran) - 1]))
        ran.append(message["batchId"])
        lam.elapsed_s += 12

    consumer = Consumer("rss.ingest", slow, services, registry=None, margin_s=5,
                        clock=lam.clock, completions="record")
    records = [_record(m) for m in messages]
    result = consumer.lambda_handler({"Records": records}, lam)
    # 30 s left: b0 runs (12 s); 18 s >= 5 + 12: b1 runs; 6 s < 17: b2 and b3 wait.
    assert ran == ["b0", "b1"]
    assert result == {"batchItemFailures": [{"itemIdentifier": r["messageId"]}
                                            for r in records[2:]]}
    assert [keys.done(dedupe_key("rss.ingest", m)) for m in messages] == [True, True, False,
                                                                           False]
    # Delivered again, the completed records are skipped and the rest run.
    again = FakeLambda(60_000)
    consumer.clock = again.clock
    ran.clear()
    lam.elapsed_s = 0
    assert consumer.lambda_handler({"Records": records}, again) == {"batchItemFailures": []}
    assert ran == ["b2", "b3"]


class CountingKeys:
    """The real completed-key store, with its reads and writes counted."""

    def __init__(self, keys: Any) -> None:
        self.keys = keys
        self.reads = 0
        self.writes: list[int] = []  # records per write

    def done(self, key: str) -> bool:
        self.reads += 1
        return bool(self.keys.done(key))

    def done_many(self, keys: list[str]) -> set[str]:
        self.reads += 1
        return set(self.keys.done_many(keys))

    def complete(self, key: str, topic: str, message_id: str) -> None:
        self.complete_many([(key, topic, message_id)])

    def complete_many(self, done: list[tuple[str, str, str]]) -> None:
        self.writes.append(len(done))
        self.keys.complete_many(done)


def test_an_idempotent_topic_reads_and_writes_a_batch_once(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(db_url, make_services)
    handler = Recorder()
    consumer = Consumer("rss.ingest", handler, services, registry=None)
    assert consumer.completions == "batch"  # rss.ingest is declared idempotent
    keys = CountingKeys(consumer.keys)
    consumer.keys = keys
    messages = [_message(f"m{n}") for n in range(5)]
    records = [_record(m) for m in messages]
    assert consumer.lambda_handler({"Records": records}) == {"batchItemFailures": []}
    assert (keys.reads, keys.writes) == (1, [5])
    assert CompletedKeys(services.db).done_many(
        [dedupe_key("rss.ingest", m) for m in messages]) == {
        dedupe_key("rss.ingest", m) for m in messages}
    # Delivered again: one read, every record a duplicate, nothing to write.
    assert consumer.lambda_handler({"Records": records}) == {"batchItemFailures": []}
    assert (keys.reads, keys.writes, len(handler.batches)) == (2, [5], 5)


def test_a_topic_without_an_idempotent_handler_writes_each_completion_at_once(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(db_url, make_services)
    assert Consumer("rss.enrich", Recorder(), services, registry=None).completions == "record"
    consumer = Consumer("rss.ingest", Recorder(), services, registry=None,
                        completions="record")
    keys = CountingKeys(consumer.keys)
    consumer.keys = keys
    records = [_record(_message(f"r{n}")) for n in range(3)]
    assert consumer.lambda_handler({"Records": records}) == {"batchItemFailures": []}
    assert (keys.reads, keys.writes) == (1, [1, 1, 1])


def test_a_batch_stopped_at_its_deadline_writes_what_it_finished(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(db_url, make_services)
    lam = FakeLambda(30_000)
    messages = [_message(f"d{n}") for n in range(4)]

    def slow(message: dict[str, Any], inbound: InboundMessage) -> None:
        lam.elapsed_s += 12

    consumer = Consumer("rss.ingest", slow, services, registry=None, margin_s=5,
                        clock=lam.clock)
    keys = CountingKeys(consumer.keys)
    consumer.keys = keys
    records = [_record(m) for m in messages]
    result = consumer.lambda_handler({"Records": records}, lam)
    assert result == {"batchItemFailures": [{"itemIdentifier": r["messageId"]}
                                            for r in records[2:]]}
    assert keys.writes == [2]
    store = CompletedKeys(services.db)
    assert [store.done(dedupe_key("rss.ingest", m)) for m in messages] == [True, True, False,
                                                                            False]


def test_a_batch_completion_that_cannot_be_written_fails_the_invocation(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    """The whole batch comes back (its handler is idempotent), rather than being
    acknowledged with its completions unrecorded."""
    services = _services(sqlite_url, make_services)
    consumer = Consumer("rss.ingest", Recorder(), services, registry=None)
    with services.db.transaction() as tx:  # the read works; the write cannot
        tx.execute("CREATE TRIGGER no_completions BEFORE INSERT ON queue_completed_keys "
                   "BEGIN SELECT RAISE(ABORT, 'completions refused'); END")
    with pytest.raises(SluiceError, match="completions refused"):
        consumer.lambda_handler({"Records": [_record(_message("w"))]})


def test_a_rejection_that_cannot_be_kept_is_not_acknowledged(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    services = _services(sqlite_url, make_services)
    consumer = Consumer("rss.ingest", Recorder(), services, registry=None)
    with services.db.transaction() as tx:
        tx.execute("DROP TABLE queue_quarantine")
    record = _record("{not json")
    assert consumer.lambda_handler({"Records": [record, _record(_message("ok"))]}) == {
        "batchItemFailures": [{"itemIdentifier": record["messageId"]}]}
