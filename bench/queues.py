"""Push queues: consumer overhead per message and signature verification per message.

- consumer: Sluice's wrapper (parse, verify, dedupe against the completed-key store,
  dispatch, batch bookkeeping) on SQS events of 10 signed messages with a no-op
  handler, against Powertools' bare ``process_partial_response`` with the same no-op
  handler on the same events. Completed keys live in the embedded SQLite default (a
  temporary file; the write transaction's fsync dominates) and in Redis (what a
  deployment with Redis uses): one read per batch and one write per completed record
  (recorded as each record finishes, so a batch cut short does not run them again).
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
from pathlib import Path
from typing import Any

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)

from bench.common import median, row
from shared.core.observe import Reporter
from shared.core.services import Services
from shared.core.settings import Settings
from shared.queues.consumer import Consumer, InboundMessage
from shared.queues.keys import IDEMPOTENCY_ATTRIBUTE, idempotency_key
from shared.queues.signing import Signer
from shared.store.db import open_database
from shared.store.migrate import migrate

SECRET = "bench-queue-secret-0123456789abcdef"
BATCH = 10
ROUNDS = 15
BATCHES_PER_ROUND = 40
VERIFY_PER_ROUND = 2000
REDIS_URL = os.environ.get("SLUICE_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")


def _message(signer: Signer, n: int) -> dict[str, Any]:
    return signer.sign({"topic": "rss.ingest", "batchId": str(uuid.uuid4()),
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


def bench_consumer(services: Services, store: str) -> dict[str, Any]:
    consumer = Consumer("rss.ingest", _noop, services, registry=None)
    if store == "memory":
        consumer.keys = _MemoryKeys()
    processor = BatchProcessor(event_type=EventType.SQS)
    signer = Signer([SECRET])
    events = [_event(signer) for _ in range(ROUNDS * BATCHES_PER_ROUND + 5)]
    for event in events[-5:]:  # warm up both paths
        consumer.lambda_handler(event)
        process_partial_response(event=event, record_handler=_bare_noop, processor=processor)
    sluice, bare = [], []
    for r in range(ROUNDS):
        chunk = events[r * BATCHES_PER_ROUND:(r + 1) * BATCHES_PER_ROUND]
        start = time.perf_counter()
        for event in chunk:
            result = consumer.lambda_handler(event)
        sluice.append((time.perf_counter() - start) / (len(chunk) * BATCH))
        assert result == {"batchItemFailures": []}
        start = time.perf_counter()
        for event in chunk:
            process_partial_response(event=event, record_handler=_bare_noop,
                                     processor=processor)
        bare.append((time.perf_counter() - start) / (len(chunk) * BATCH))
    return dict(row(f"queues: consumer overhead, batch of 10, no-op handler ({store})",
                    median(sluice) * 1e6, median(bare) * 1e6, "µs/msg", higher_is_better=False,
                    note=f"vs Powertools bare process_partial_response; completed keys in {store}"
                         + ("" if store == "memory" else ", 1 read per batch + 1 write per record")))


def _services(url: str, **env: str) -> Services:
    settings = Settings.from_env({"SLUICE_DATABASE_URL": url,
                                  "SLUICE_QUEUE_SIGNING_SECRET": SECRET, **env})
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


def run() -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        services = _services(f"sqlite:///{Path(tmp)}/bench.db")
        rows.append(bench_consumer(services, "memory"))
        rows.append(bench_consumer(services, "SQLite"))
        prefix = f"sluice-bench:{uuid.uuid4().hex[:8]}:"
        services = _services(f"sqlite:///{Path(tmp)}/bench-redis.db", SLUICE_REDIS_URL=REDIS_URL,
                             SLUICE_REDIS_KEY_PREFIX=prefix)
        try:
            rows.append(bench_consumer(services, "Redis"))
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
