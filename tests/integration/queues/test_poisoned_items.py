"""One bad message never stops a consumer's batch: a message nested past the parser's
depth is quarantined with its reason, one whose handler raises is that message's retry,
and every other message of the batch is handled."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from sluice.core.services import Services
from sluice.queues.consumer import Consumer, InboundMessage
from sluice.queues.deadletters import Quarantine
from tests.integration.queues.test_hostile_corpus import SECRET, TOPIC, record, signed


def test_a_poisoned_message_fails_alone_and_the_batch_goes_on(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    handled: list[str] = []

    def handler(message: dict[str, Any], inbound: InboundMessage) -> None:
        if message["batchId"] == "explodes":
            raise KeyError("a field this handler did not expect")
        handled.append(message["batchId"])

    consumer = Consumer(TOPIC, handler, services, registry=None)
    nested = '{"topic": "rss.ingest", "batchId": ' + "[" * 100_000 + "]" * 100_000 + "}"
    records = [record(json.dumps(signed("a")), "m-a"), record(nested, "m-nested"),
               record(json.dumps(signed("explodes")), "m-explodes"),
               record(json.dumps(signed("b")), "m-b")]

    result = consumer.lambda_handler({"Records": records})

    assert result == {"batchItemFailures": [{"itemIdentifier": "m-explodes"}]}
    assert handled == ["a", "b"]
    quarantined = {row["id"]: row for row in Quarantine(services.db).list(100)}
    reason = quarantined["m-nested"]["reason"]
    assert reason.startswith("malformed message") and "nested" in reason
