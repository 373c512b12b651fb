"""A corpus of hostile messages through the SQS consumer on both stores: none reaches the
handler, and each is either quarantined with its reason or acknowledged as a duplicate of
a message that completed (nothing is lost without a trace)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from sluice.core.services import Services
from sluice.queues.consumer import Consumer, InboundMessage
from sluice.queues.deadletters import Quarantine
from sluice.queues.keys import CompletedKeys, dedupe_key
from sluice.queues.signing import Signer, canonical

SECRET = "queue-secret-for-tests-0123456789"
TOPIC = "rss.ingest"


def signed(batch: str, secret: str = SECRET, **fields: Any) -> dict[str, Any]:
    return Signer([secret]).sign({"topic": TOPIC, "batchId": batch, "sourceId": "s",
                                  "feedUrl": "", "publishedAt": "2026-11-30T00:00:00.000Z",
                                  **fields})


def record(body: str, message_id: str | None = None) -> dict[str, Any]:
    return {"messageId": message_id or str(uuid.uuid4()), "receiptHandle": "rh", "body": body,
            "attributes": {"ApproximateReceiveCount": "1", "SentTimestamp": "0"},
            "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
            "eventSourceARN": "arn:aws:sqs:eu-north-1:123456789012:t-rss-ingest",
            "awsRegion": "eu-north-1"}


def hostile() -> dict[str, str]:
    """name -> message body."""
    good = signed("good")
    tampered = dict(signed("tampered"))
    tampered["sourceId"] = "someone-else"
    unsigned = {k: v for k, v in signed("unsigned").items() if k not in ("signature", "sig")}
    other_topic = signed("other-topic")
    other_topic_body = dict(other_topic)
    other_topic_body["topic"] = "delivery.send"
    return {
        "forged": json.dumps(signed("forged", secret="another-secret-0123456789abcdef")),
        "tampered": json.dumps(tampered),
        "unsigned": json.dumps(unsigned),
        "not json": "{nope",
        "an array": json.dumps([good]),
        "a string": json.dumps("hello"),
        "256 KB": json.dumps({**signed("big"), "pad": "x" * 262_144}),
        "lone surrogate, forged": json.dumps(signed("\ud800", secret="x" * 32)),
        "raw lone surrogate": '{"topic": "rss.ingest", "batchId": "\ud800"}',
        "NUL, unsigned": json.dumps({"topic": TOPIC, "batchId": "nul\u0000"}),
        "raw NUL": '{"topic": "rss.ingest", "batchId": "a\x00b"}',
        "another topic's message": json.dumps(Signer([SECRET]).sign(other_topic_body)),
    }


def test_no_hostile_message_reaches_the_handler_or_vanishes(
        db_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    handled: list[str] = []

    def handler(message: dict[str, Any], inbound: InboundMessage) -> None:
        handled.append(message["batchId"])

    consumer = Consumer(TOPIC, handler, services, registry=None)
    good = signed("good")
    first = consumer.lambda_handler({"Records": [record(json.dumps(good), "m-good")]})
    assert first == {"batchItemFailures": []} and handled == ["good"]

    corpus = hostile()
    reordered = json.dumps(dict(reversed(list(good.items()))))
    records = [record(body, f"m-{name}") for name, body in corpus.items()]
    records += [record(reordered, "m-reordered"),
                record(json.dumps(signed("dup-a")), "m-dup"),  # two records, one message id
                record(json.dumps(signed("dup-a", secret="another-secret-0123456789abcdef")),
                       "m-dup")]
    result = consumer.lambda_handler({"Records": records})

    assert result == {"batchItemFailures": []}, "everything is settled, nothing left to retry"
    assert handled == ["good", "dup-a"], "only the signed message of the duplicate id ran"
    quarantined = {row["id"]: row for row in Quarantine(services.db).list(100)}
    for name in corpus:
        row = quarantined.get(f"m-{name}")
        assert row is not None and row["reason"], f"{name}: not quarantined with a reason"
    assert quarantined["m-raw NUL"]["body"] == '{"topic": "rss.ingest", "batchId": "a\\u0000b"}'
    assert "\\ud800" in quarantined["m-raw lone surrogate"]["body"]
    assert "m-dup" in quarantined, "the forged twin of the duplicate id is kept"
    key = dedupe_key(TOPIC, canonical(good))
    assert CompletedKeys(services.db).done(key), "the reordered copy is a known duplicate"
