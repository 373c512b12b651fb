"""Push queues: consumer overhead per message and signature verification per message.

- consumer: Sluice's wrapper on SQS events of 10 signed messages with a no-op handler,
  against the necessary-work reference: Powertools ``BatchProcessor`` +
  ``process_partial_response`` whose record handler does ``json.loads`` of the body,
  the same canonical signing input (the key-sorted ``[key, value]`` pairs, compact
  JSON), HMAC-SHA256 compared with ``hmac.compare_digest``, the same content dedupe
  key (SHA-256 of that input) checked against the same completed-key store, and the
  no-op handler. With a store, the reference reads the batch's keys once and writes
  its completions once. Sluice runs the same events in both completion modes: ``batch``
  (a topic whose handler is idempotent: one read and one write per batch) and
  ``record`` (the default: one read per batch and one write per completed record).
  A second row keeps Powertools' bare ``process_partial_response`` with the no-op
  handler (no parsing, no verification, no dedupe) as a floor.
- verify: ``Signer.check`` (JS-compatible canonical JSON + HMAC-SHA256 + constant-time
  compare) against a plain ``json.dumps(sort_keys=True)`` + ``hmac`` reference.

Both sides run interleaved in the same process; the figure is the median of rounds.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)

from bench.common import median, row, scratch_database
from sluice.core.observe import Reporter
from sluice.core.services import Services
from sluice.core.settings import Settings
from sluice.queues.consumer import Consumer, InboundMessage
from sluice.queues.keys import IDEMPOTENCY_ATTRIBUTE, KeyStore, idempotency_key
from sluice.queues.signing import Signer
from sluice.store.db import Database, open_database
from sluice.store.migrate import migrate

SECRET = "bench-queue-secret-0123456789abcdef"
TOPIC = "rss.ingest"
BATCH = 10
ROUNDS = 15
BATCHES_PER_ROUND = 40
VERIFY_PER_ROUND = 2000
REDIS_URL = os.environ.get("SLUICE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def _message(signer: Signer, n: int) -> dict[str, Any]:
    return signer.sign({"topic": TOPIC, "batchId": str(uuid.uuid4()),
                        "sourceId": "all-sources", "feedUrl": f"https://example.com/feed/{n}",
                        "publishedAt": "2026-11-29T03:20:00.000Z"})


def _event(signer: Signer) -> dict[str, Any]:
    records = []
    for n in range(BATCH):
        message = _message(signer, n)
        records.append({
            "messageId": str(uuid.uuid4()), "receiptHandle": "bench",
            "body": json.dumps(message, separators=(",", ":")),
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "0"},
            "messageAttributes": {IDEMPOTENCY_ATTRIBUTE: {
                "stringValue": idempotency_key(message), "dataType": "String"}},
            "md5OfBody": "", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:eu-north-1:123456789012:bench-rss-ingest",
            "awsRegion": "eu-north-1"})
    return {"Records": records}


def _noop(message: dict[str, Any], inbound: InboundMessage) -> None:
    return None


def _bare_noop(record: Any) -> None:
    return None


class _MemoryKeys:
    """Completed keys in a set: isolates the wrapper's own CPU cost from the store's I/O."""

    def __init__(self) -> None:
        self.keys: set[str] = set()

    def done(self, key: str) -> bool:
        return key in self.keys

    def done_many(self, keys: list[str]) -> set[str]:
        return self.keys.intersection(keys)

    def complete(self, key: str, topic: str, message_id: str) -> None:
        self.keys.add(key)

    def complete_many(self, done: list[tuple[str, str, str]]) -> None:
        self.keys.update(key for key, _, _ in done)


class Reference:
    """The necessary work, written directly: Powertools batch, parse, verify, dedupe, no-op.

    Each body is parsed once (before the batch, since the one read of the batch's
    completed keys needs them); one write of the batch's completions after it.
    """

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys
        self.secret = SECRET.encode()
        self.processor = BatchProcessor(event_type=EventType.SQS)
        self.parsed: dict[str, tuple[dict[str, Any], str, bytes, str]] = {}
        self.done: set[str] = set()
        self.completed: list[tuple[str, str, str]] = []

    def record(self, record: Any) -> None:
        message, given, payload, key = self.parsed[record.message_id]
        expected = hmac.new(self.secret, payload, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, given):
            raise ValueError("signature does not match")
        if key in self.done:
            return
        _noop(message, None)  # type: ignore[arg-type]
        self.done.add(key)
        self.completed.append((key, TOPIC, record.message_id))

    def __call__(self, event: dict[str, Any]) -> dict[str, Any]:
        self.parsed = {}
        for record in event["Records"]:
            message = json.loads(record["body"])
            given = message.pop("signature")
            payload = json.dumps(sorted(message.items()), separators=(",", ":"),
                                 ensure_ascii=False).encode()
            self.parsed[record["messageId"]] = (
                message, given, payload, f"{TOPIC}:{hashlib.sha256(payload).hexdigest()}")
        self.done = self.keys.done_many([key for *_, key in self.parsed.values()])
        self.completed = []
        result: dict[str, Any] = process_partial_response(
            event=event, record_handler=self.record, processor=self.processor)  # type: ignore[assignment]
        self.keys.complete_many(self.completed)
        return result


def _interleaved(sluice: Callable[[dict[str, Any]], dict[str, Any]],
                 baseline: Callable[[dict[str, Any]], Any]) -> tuple[float, float]:
    signer = Signer([SECRET])
    count = ROUNDS * BATCHES_PER_ROUND
    # Each side gets messages of its own (a store may be shared: neither sees the other's
    # completions as duplicates).
    ours_events = [_event(signer) for _ in range(count + 5)]
    their_events = [_event(signer) for _ in range(count + 5)]
    for mine, theirs in zip(ours_events[-5:], their_events[-5:], strict=True):  # warm up
        sluice(mine)
        baseline(theirs)
    ours, theirs_s = [], []
    for r in range(ROUNDS):
        part = slice(r * BATCHES_PER_ROUND, (r + 1) * BATCHES_PER_ROUND)
        start = time.perf_counter()
        for event in ours_events[part]:
            result = sluice(event)
        ours.append((time.perf_counter() - start) / (BATCHES_PER_ROUND * BATCH))
        assert result == {"batchItemFailures": []}
        start = time.perf_counter()
        for event in their_events[part]:
            baseline(event)
        theirs_s.append((time.perf_counter() - start) / (BATCHES_PER_ROUND * BATCH))
    return median(ours), median(theirs_s)


def _consumer(services: Services, store: str, completions: str) -> Consumer:
    consumer = Consumer(TOPIC, _noop, services, registry=None, completions=completions)
    if store == "memory":
        consumer.keys = _MemoryKeys()
    return consumer


def bench_consumer(services: Services, store: str, completions: str) -> dict[str, Any]:
    consumer = _consumer(services, store, completions)
    reference = Reference(_MemoryKeys() if store == "memory" else _twin(services))
    ours, theirs = _interleaved(consumer.lambda_handler, reference)
    writes = "1 write per batch" if completions == "batch" else "1 write per completed record"
    return dict(row(f"queues: consumer, batch of 10, no-op handler ({store}, {completions})",
                    ours * 1e6, theirs * 1e6, "µs/msg", higher_is_better=False,
                    note="vs necessary work (Powertools batch + json.loads + canonical HMAC + "
                         f"dedupe); keys in {store}"
                         + ("" if store == "memory"
                            else f", Sluice 1 read per batch + {writes}, reference 1 + 1")))


def _twin(services: Services) -> KeyStore:
    from sluice.queues.keys import completed_keys

    return completed_keys(services)


def bench_bare(services: Services) -> dict[str, Any]:
    consumer = _consumer(services, "memory", "batch")
    processor = BatchProcessor(event_type=EventType.SQS)

    def bare(event: dict[str, Any]) -> Any:
        return process_partial_response(event=event, record_handler=_bare_noop,
                                        processor=processor)

    ours, theirs = _interleaved(consumer.lambda_handler, bare)
    return dict(row("queues: consumer vs a bare loop (memory; floor, not a target)",
                    ours * 1e6, theirs * 1e6, "µs/msg", higher_is_better=False,
                    note="vs Powertools bare process_partial_response + no-op: no parse, "
                         "no verification, no dedupe"))


def _services(url: str, db: Database | None = None, **env: str) -> Services:
    settings = Settings.from_env({"SLUICE_DATABASE_URL": url,
                                  "SLUICE_QUEUE_SIGNING_SECRET": SECRET, **env})
    if db is None:
        db = open_database(url)
        migrate(db)
    return Services(settings, db, Reporter())


def bench_verify() -> dict[str, Any]:
    signer = Signer([SECRET])
    messages = [_message(signer, n) for n in range(100)]
    key = SECRET.encode()

    def reference(message: dict[str, Any]) -> bool:
        body = {k: v for k, v in message.items() if k != "signature"}
        digest = hmac.new(key, json.dumps(body, sort_keys=True, separators=(",", ":")).encode(),
                          hashlib.sha256).hexdigest()
        return hmac.compare_digest(digest, message["signature"])

    sluice, baseline = [], []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        for n in range(VERIFY_PER_ROUND):
            ok = signer.check(messages[n % 100]) is None
        sluice.append((time.perf_counter() - start) / VERIFY_PER_ROUND)
        assert ok
        start = time.perf_counter()
        for n in range(VERIFY_PER_ROUND):
            reference(messages[n % 100])
        baseline.append((time.perf_counter() - start) / VERIFY_PER_ROUND)
    return dict(row("queues: signature verification", median(sluice) * 1e6,
                    median(baseline) * 1e6, "µs/msg", higher_is_better=False,
                    note="vs json.dumps(sort_keys) + hmac reference"))


def _stores(services: Services) -> list[dict[str, Any]]:
    return [bench_consumer(services, services_store(services), mode)
            for mode in ("batch", "record")]


def services_store(services: Services) -> str:
    if services.settings.redis_configured:
        return "Redis"
    return "Postgres" if services.settings.database_url.startswith("postgres") else "SQLite"


def run() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        services = _services(f"sqlite:///{Path(tmp)}/bench.db")
        rows = [bench_consumer(services, "memory", "batch"), bench_bare(services)]
        rows += _stores(services)
        with scratch_database() as db:
            rows += _stores(_services(db.conninfo, db))
        prefix = f"sluice-bench:{uuid.uuid4().hex[:8]}:"
        services = _services(f"sqlite:///{Path(tmp)}/bench-redis.db", SLUICE_REDIS_URL=REDIS_URL,
                             SLUICE_REDIS_KEY_PREFIX=prefix)
        try:
            rows += _stores(services)
        finally:
            raw = services.redis.client
            keys = list(raw.scan_iter(match=prefix + "*", count=1000))
            if keys:
                raw.delete(*keys)
            services.close()
    rows.append(bench_verify())
    return rows


if __name__ == "__main__":
    for result in run():
        print(result)
