"""A topic message carries its producer's trace context in its SQS message attributes,
outside the signed body (the JavaScript producer's signature stays byte for byte), and
the consumer's record span is the producer span's child, linked to its batch, which links
to each message's producer (moto in
server mode, a local OTLP collector)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from sluice.core import trace
from sluice.core.services import Services
from sluice.queues.publish import Publisher
from sluice.queues.signing import Signer
from tests.integration.queues.test_consumer_sqs import SECRET, Recorder, consumer
from tests.providers.otlp import OtlpReceiver, exporting
from tests.sqs_helpers import create_queues, deliver, new_prefix, receive
from tests.unit.queues.test_signing import run_node

pytestmark = pytest.mark.aws


@pytest.fixture
def collector() -> Iterator[OtlpReceiver]:
    with exporting() as receiver:
        yield receiver


def test_the_context_travels_beside_the_signed_body_and_parents_the_record(
        aws_env: dict[str, str], sqlite_url: str, make_services: Callable[..., Services],
        collector: OtlpReceiver) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                             SLUICE_QUEUE_SIGNING_SECRET=SECRET, SLUICE_QUEUE_PREFIX=new_prefix())
    url = create_queues(services.settings.queue_prefix, ("rss.ingest",))["rss.ingest"]
    published = Publisher(services.settings, registry=None).publish(
        "rss.ingest", {"batchId": "b-1", "note": "caf\u00e9"})

    [message] = receive(url)
    attributes = message["MessageAttributes"]
    assert set(attributes) == {"idempotencyKey", "traceparent"}
    # the body is the producer's contract alone: the JavaScript producer signs it the same
    body = json.loads(message["Body"])
    assert "traceparent" not in message["Body"] and Signer([SECRET]).check(body) is None
    [js] = run_node([{"secret": SECRET, "text": message["Body"]}])
    assert js["signature"] == body["signature"]

    handler = Recorder()
    polled = deliver([message], url, consumer(services, handler).lambda_handler)
    assert polled.failed_ids == [] and len(handler.calls) == 1
    trace.flush()

    [publish] = collector.named("publish rss.ingest")
    [batch] = collector.named("receive rss.ingest")
    [record] = collector.named("process rss.ingest")
    version, trace_id, span_id, _flags = attributes["traceparent"]["StringValue"].split("-")
    assert (version, trace_id, span_id) == ("00", publish.trace_id, publish.span_id)
    assert publish.kind == "producer" and publish.attributes["messaging.system"] == "aws_sqs"
    assert publish.attributes["messaging.message.id"] == published.message_id
    assert publish.attributes["messaging.destination.name"] == "rss.ingest"
    assert (record.trace_id, record.parent_span_id) == (publish.trace_id, publish.span_id)
    assert record.kind == "consumer"
    assert record.attributes["messaging.operation.type"] == "process"
    assert record.attributes["messaging.message.id"] == message["MessageId"]
    assert record.attributes["sluice.outcome"] == "done"
    assert record.attributes["sluice.attempt"] == 1
    assert [(link.span_id, link.attributes["sluice.link"]) for link in record.links] == [
        (batch.span_id, "batch")]
    assert [(link.span_id, link.attributes["sluice.link"]) for link in batch.links] == [
        (publish.span_id, f"message {message['MessageId']}")]
    assert batch.attributes["messaging.operation.type"] == "receive"
    assert batch.attributes["messaging.batch.message_count"] == 1
