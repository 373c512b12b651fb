"""The consumer wrapper on SQS (moto in server mode, over real HTTP)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.queues.consumer import Consumer, InboundMessage, backoff_s
from sluice.queues.deadletters import Quarantine
from sluice.queues.handlers import register_catalog_refresh
from sluice.queues.keys import idempotency_key
from sluice.queues.publish import Publisher, Registry
from sluice.queues.runtime import consumers_for
from sluice.queues.signing import Signer
from sluice.queues.sqs import Sqs
from tests.sqs_helpers import (
    bodies,
    create_queues,
    deliver,
    new_prefix,
    poll,
    queue_arn,
    receive,
    sqs_client,
    to_record,
)

pytestmark = pytest.mark.aws
SECRET = "queue-secret-for-tests-0123456789"


@pytest.fixture
def queue_services(aws_env: dict[str, str], sqlite_url: str,
                   make_services: Callable[..., Services]) -> Services:
    return make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs", SLUICE_QUEUE_SIGNING_SECRET=SECRET,
                         SLUICE_QUEUE_PREFIX=new_prefix())


@pytest.fixture
def urls(queue_services: Services) -> dict[str, str]:
    return create_queues(queue_services.settings.queue_prefix)


class Recorder:
    def __init__(self, fail: Callable[[dict[str, Any]], bool] = lambda m: False) -> None:
        self.calls: list[tuple[dict[str, Any], InboundMessage]] = []
        self.fail = fail

    def __call__(self, message: dict[str, Any], inbound: InboundMessage) -> None:
        self.calls.append((message, inbound))
        if self.fail(message):
            raise RuntimeError(f"handler failed for {message['batchId']}")


def consumer(services: Services, handler: Recorder, topic: str = "rss.ingest") -> Consumer:
    return Consumer(topic, handler, services, registry=None)


def publish(services: Services, **fields: Any) -> str:
    return Publisher(services.settings, registry=None).publish("rss.ingest", fields).message_id or ""


def send_raw(url: str, body: str) -> str:
    return str(sqs_client().send_message(QueueUrl=url, MessageBody=body)["MessageId"])


def test_publish_sends_a_signed_message_with_its_idempotency_key(queue_services: Services,
                                                                  urls: dict[str, str]) -> None:
    message_id = publish(queue_services, batchId="b-1", note="caf\u00e9")
    [received] = receive(urls["rss.ingest"])
    assert received["MessageId"] == message_id
    body = json.loads(received["Body"])
    assert Signer([SECRET]).check(body) is None
    assert list(body)[:5] == ["topic", "batchId", "sourceId", "feedUrl", "publishedAt"]
    assert body["note"] == "caf\u00e9" and list(body)[-1] == "signature"
    key = received["MessageAttributes"]["idempotencyKey"]["StringValue"]
    assert key == idempotency_key(body) and key.startswith("rss.ingest:b-1:_")
    assert len(key.split(":", 2)[2]) == 96


def test_publish_refuses_reserved_topics_and_a_missing_secret(
        aws_env: dict[str, str], sqlite_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                             SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    publisher = Publisher(services.settings, registry=None)
    for topic in ("rss.enrich", "rss.cluster", "rss.synthesize"):
        with pytest.raises(Exception, match="consumer is not implemented"):
            publisher.publish(topic, {})
    unsigned = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs")
    with pytest.raises(Exception, match="SLUICE_QUEUE_SIGNING_SECRET"):
        Publisher(unsigned.settings, registry=None).publish("rss.ingest", {})


def test_forged_tampered_reordered_unsigned_and_malformed_never_reach_the_handler(
        queue_services: Services, urls: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    url = urls["rss.ingest"]
    good = Signer([SECRET]).sign({"topic": "rss.ingest", "batchId": "ok", "sourceId": "s",
                                  "feedUrl": "", "publishedAt": "p"})
    forged = Signer(["another-secret-0123456789abcdef"]).sign({**good, "batchId": "forged"})
    tampered = {**good, "batchId": "tampered"}
    unsigned = {k: v for k, v in good.items() if k != "signature"}
    misrouted = Signer([SECRET]).sign({**unsigned, "topic": "rss.enrich"})
    # Re-ordering the fields keeps a valid signature valid; re-ordering array content does not.
    reordered = dict(reversed(list(good.items())))
    reordered_values = Signer([SECRET]).sign({**unsigned, "tags": ["a", "b"]})
    reordered_values["tags"] = ["b", "a"]
    for body in (forged, tampered, unsigned, misrouted, reordered_values):
        send_raw(url, json.dumps(body))
    send_raw(url, "{not json")
    send_raw(url, "[1, 2]")
    ok_id = send_raw(url, json.dumps(reordered))
    handler = Recorder()
    caplog.set_level("ERROR", logger="sluice")
    polled = poll(url, consumer(queue_services, handler).lambda_handler)
    assert [m["batchId"] for m, _ in handler.calls] == ["ok"]
    rejections = [r for r in caplog.records if "rejected:" in r.getMessage()]
    assert len(rejections) == 7
    assert all(r.levelname == "ERROR" and getattr(r, "deliveryCount", None) == 1
               and getattr(r, "messageId", None) for r in rejections)
    assert handler.calls[0][1].message_id == ok_id
    assert polled.failed_ids == []  # rejected messages are acknowledged, never retried
    assert bodies(url) == [] and bodies(urls["rss.ingest-dlq"]) == []
    kept = Quarantine(queue_services.db).list(20)  # ... but kept, out of every -dlq
    assert len(kept) == 7 and ok_id not in {row["id"] for row in kept}


def test_a_failing_handler_is_retried_after_its_backoff_visibility(
        queue_services: Services, urls: dict[str, str], caplog: pytest.LogCaptureFixture) -> None:
    url = urls["rss.ingest"]
    message_id = publish(queue_services, batchId="flaky")
    handler = Recorder(fail=lambda m: len(handler.calls) < 2)
    caplog.set_level("ERROR", logger="sluice")
    first = poll(url, consumer(queue_services, handler).lambda_handler)
    assert first.failed_ids == [message_id] and first.response is None  # whole batch failed
    [reported] = [r for r in caplog.records if getattr(r, "context", None) == "queues:rss.ingest"]
    assert (reported.messageId, reported.deliveryCount) == (message_id, 1)  # type: ignore[attr-defined]
    assert reported.exc_info is not None, "the handler's error itself is reported"
    assert backoff_s(1) == 2
    assert receive(url) == []  # invisible for 2 s, not the queue's 300 s
    time.sleep(2.3)
    second = poll(url, consumer(queue_services, handler).lambda_handler)
    assert second.deleted_ids == [message_id]
    assert [d.delivery_count for _, d in handler.calls] == [1, 2]


def test_backoff_schedule_is_data() -> None:
    assert [backoff_s(n) for n in range(1, 11)] == [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]


def _receive_times(url: str, times: int) -> None:
    for _ in range(times):
        assert len(receive(url, visibility=0)) == 1


def test_the_fifth_failure_lands_in_the_dlq_and_is_acknowledged(
        queue_services: Services, urls: dict[str, str]) -> None:
    url = urls["rss.ingest"]
    message_id = publish(queue_services, batchId="poison", note="x" * 50)
    handler = Recorder(fail=lambda m: True)
    _receive_times(url, 4)  # deliveries 1-4 failed earlier
    polled = poll(url, consumer(queue_services, handler).lambda_handler)
    assert handler.calls[0][1].delivery_count == 5
    assert polled.failed_ids == [] and polled.deleted_ids == [message_id]
    [summary] = bodies(urls["rss.ingest-dlq"])
    assert set(summary) == {"originalMessageId", "originalTopic", "deliveryCount", "failedAt",
                            "errorMessage", "originalMessage"}
    assert summary["originalMessageId"] == message_id and summary["deliveryCount"] == 5
    assert summary["originalTopic"] == "rss.ingest"
    assert summary["errorMessage"] == "RuntimeError: handler failed for poison"
    assert summary["originalMessage"]["batchId"] == "poison"
    assert Signer([SECRET]).check(summary["originalMessage"]) is None
    assert bodies(url) == []


def test_error_message_in_the_summary_is_cut_at_500(queue_services: Services,
                                                    urls: dict[str, str]) -> None:
    def explode(message: dict[str, Any], inbound: InboundMessage) -> None:
        raise ValueError("e" * 2000)

    publish(queue_services, batchId="long")
    _receive_times(urls["rss.ingest"], 4)
    poll(urls["rss.ingest"], Consumer("rss.ingest", explode, queue_services,
                                      registry=None).lambda_handler)
    [summary] = bodies(urls["rss.ingest-dlq"])
    assert len(summary["errorMessage"]) == 500


def test_a_failed_dlq_send_leaves_the_message_unacknowledged(
        queue_services: Services, urls: dict[str, str]) -> None:
    url = urls["rss.ingest"]
    message_id = publish(queue_services, batchId="poison")
    sqs_client().delete_queue(QueueUrl=urls["rss.ingest-dlq"])
    _receive_times(url, 4)
    handler = Recorder(fail=lambda m: True)
    polled = poll(url, consumer(queue_services, handler).lambda_handler)
    assert polled.failed_ids == [message_id] and polled.deleted_ids == []
    assert len(handler.calls) == 1
    attrs = sqs_client().get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"  # held back, not deleted
    # GIVEN the DLQ is back WHEN the message comes round again THEN it is dead-lettered.
    sqs_client().change_message_visibility(
        QueueUrl=url, ReceiptHandle=polled.event["Records"][0]["receiptHandle"],
        VisibilityTimeout=0)
    create_queues(queue_services.settings.queue_prefix, ("rss.ingest",))
    again = poll(url, consumer(queue_services, handler).lambda_handler)
    assert again.deleted_ids == [message_id]
    [summary] = bodies(urls["rss.ingest-dlq"])
    assert summary["originalMessageId"] == message_id and summary["deliveryCount"] == 6


def test_a_mixed_batch_reports_exactly_the_failed_items(queue_services: Services,
                                                        urls: dict[str, str]) -> None:
    url = urls["rss.ingest"]
    done_before = publish(queue_services, batchId="done-before")
    handler = Recorder(fail=lambda m: m["batchId"].startswith("bad"))
    poll(url, consumer(queue_services, handler).lambda_handler)
    again = Signer([SECRET]).sign(json.loads(json.dumps(handler.calls[0][0])))
    ids = {
        "good": publish(queue_services, batchId="good"),
        "bad-1": publish(queue_services, batchId="bad-1"),
        "forged": send_raw(url, json.dumps({**again, "batchId": "forged"})),
        "duplicate": send_raw(url, json.dumps(again)),
        "bad-2": publish(queue_services, batchId="bad-2"),
        "malformed": send_raw(url, "nope"),
        "good-2": publish(queue_services, batchId="good-2"),
    }
    assert done_before not in ids.values()
    handler.calls.clear()
    messages = []
    while len(messages) < len(ids):
        messages += receive(url)
    polled = deliver(messages, url, consumer(queue_services, handler).lambda_handler)
    assert sorted(polled.failed_ids) == sorted([ids["bad-1"], ids["bad-2"]])
    assert polled.response == {"batchItemFailures": [
        {"itemIdentifier": m["MessageId"]} for m in messages
        if m["MessageId"] in (ids["bad-1"], ids["bad-2"])]}
    assert sorted(m["batchId"] for m, _ in handler.calls) == ["bad-1", "bad-2", "good", "good-2"]


def test_the_same_message_twice_in_one_batch_runs_once(queue_services: Services,
                                                       urls: dict[str, str]) -> None:
    url = urls["rss.ingest"]
    publish(queue_services, batchId="twice")
    [sent] = receive(url, visibility=0)
    sqs_client().send_message(QueueUrl=url, MessageBody=sent["Body"])  # no key attribute
    sqs_client().send_message(QueueUrl=url, MessageBody=sent["Body"],
                              MessageAttributes={"idempotencyKey": {
                                  "DataType": "String",
                                  "StringValue": sent["MessageAttributes"]["idempotencyKey"][
                                      "StringValue"]}})
    messages: list[dict[str, Any]] = []
    while len(messages) < 3:
        messages += receive(url)
    handler = Recorder()
    polled = deliver(messages, url, consumer(queue_services, handler).lambda_handler)
    assert len(handler.calls) == 1 and len(polled.deleted_ids) == 3


def test_a_message_to_a_reserved_topic_fails_loud_retries_and_dead_letters(
        queue_services: Services, urls: dict[str, str]) -> None:
    url = urls["rss.enrich"]
    message = Signer([SECRET]).sign({"topic": "rss.enrich", "batchId": "stray", "sourceId": "s",
                                     "feedUrl": "", "publishedAt": "p"})
    message_id = send_raw(url, json.dumps(message))
    consumers = consumers_for(queue_services, registry=None)
    first = poll(url, consumers["rss.enrich"].lambda_handler)
    assert first.failed_ids == [message_id]
    sqs_client().change_message_visibility(
        QueueUrl=url, ReceiptHandle=first.event["Records"][0]["receiptHandle"],
        VisibilityTimeout=0)
    _receive_times(url, 3)
    last = poll(url, consumers["rss.enrich"].lambda_handler)
    assert last.deleted_ids == [message_id]
    [summary] = bodies(urls["rss.enrich-dlq"])
    assert summary["errorMessage"] == ("NotImplementedTopic: rss.enrich consumer is not "
                                       "implemented; do not enable a producer for this topic")


def test_ingest_rechecks_the_flag_and_runs_the_registered_refresh(
        queue_services: Services, urls: dict[str, str]) -> None:
    from sluice.store.flags import FlagStore

    refreshed: list[Services] = []
    register_catalog_refresh(lambda services, message: refreshed.append(services))
    try:
        ingest = consumers_for(queue_services, registry=None)["rss.ingest"]
        publish(queue_services, batchId="while-off")
        off = poll(urls["rss.ingest"], ingest.lambda_handler)
        assert off.failed_ids == [] and refreshed == []
        FlagStore(queue_services.state).set("rssQueuePipeline", True)
        publish(queue_services, batchId="while-on")
        on = poll(urls["rss.ingest"], ingest.lambda_handler)
        assert on.failed_ids == [] and refreshed == [queue_services]
    finally:
        register_catalog_refresh(None)


def test_the_queue_url_is_looked_up_once(queue_services: Services,
                                         urls: dict[str, str]) -> None:
    calls: list[str] = []
    sqs = Sqs.connect(queue_services.settings)
    sqs.client.meta.events.register("before-call.sqs.GetQueueUrl",
                                    lambda **kw: calls.append("GetQueueUrl"))
    publisher = Publisher(queue_services.settings, sqs=sqs, registry=None)
    for n in range(3):
        publisher.publish("rss.ingest", {"batchId": f"b{n}"})
    assert calls == ["GetQueueUrl"]
    assert len(receive(urls["rss.ingest"], visibility=0)) == 3


def test_a_missing_queue_is_named(queue_services: Services) -> None:
    from sluice.queues.sqs import QueueMissing

    with pytest.raises(QueueMissing, match=r"SQS queue t\w+-rss-ingest does not exist"):
        publish(queue_services, batchId="nowhere")


def test_aws_endpoint_url_sqs_is_honoured(queue_services: Services, urls: dict[str, str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens here
    monkeypatch.setenv("AWS_ENDPOINT_URL_SQS", urls["rss.ingest"].split("/", 3)[0] + "//"
                       + urls["rss.ingest"].split("/", 3)[2])
    publish(queue_services, batchId="via-sqs-endpoint")
    assert len(receive(urls["rss.ingest"])) == 1


def test_a_client_that_cannot_be_built_raises_instead_of_falling_back(
        sqlite_url: str, make_services: Callable[..., Services], tmp_path: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.core.errors import ConfigurationError

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                             SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    ran: list[str] = []
    registry = Registry()
    Consumer("rss.ingest", lambda m, d: ran.append(m["batchId"]), services, registry=registry)
    with pytest.raises(ConfigurationError, match="SLUICE_QUEUE_MODE=sqs but no SQS client"):
        Publisher(services.settings, registry=registry).publish("rss.ingest", {})
    assert ran == []


# --- a store outage is not the message's failure -------------------------------------

def _delayed(url: str) -> int:
    attrs = sqs_client().get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attrs["ApproximateNumberOfMessagesDelayed"])


def test_a_store_outage_counts_no_attempt_the_message_waits_as_a_delayed_copy(
        queue_services: Services, urls: dict[str, str]) -> None:
    """Four deliveries failed before: a fifth that meets a store outage is not dead-lettered
    but acknowledged once a copy of it waits on the queue, delayed (a new message, so its
    count starts again)."""
    from sluice.core.errors import TransientStoreError

    url = urls["rss.ingest"]
    message_id = publish(queue_services, batchId="outage")
    calls: list[int] = []

    def handler(message: dict[str, Any], inbound: InboundMessage) -> None:
        calls.append(inbound.delivery_count)
        raise TransientStoreError("sqlite: unable to open database file")

    _receive_times(url, 4)  # deliveries 1-4 happened before
    polled = poll(url, Consumer("rss.ingest", handler, queue_services,
                                registry=None).lambda_handler)
    assert calls == [5] and polled.failed_ids == [] and polled.deleted_ids == [message_id]
    assert bodies(urls["rss.ingest-dlq"]) == []  # nothing dead-lettered
    assert _delayed(url) == 1 and receive(url, visibility=0) == []  # the copy waits


def test_the_copy_keeps_the_body_and_key_of_the_original(
        queue_services: Services, urls: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.core.errors import TransientStoreError
    from sluice.queues.consumer import OUTAGE_DELAY_S

    url = urls["rss.ingest"]
    publish(queue_services, batchId="same")
    [original] = receive(url, visibility=0)
    sent: list[tuple[str, str, str | None, int]] = []
    real_send = Sqs.send

    def recording(self: Sqs, url: str, body: str, key: str | None = None, *,
                  delay_s: int = 0, trace: Mapping[str, str] | None = None) -> str:
        sent.append((url, body, key, delay_s))
        return real_send(self, url, body, key, delay_s=delay_s, trace=trace)

    def handler(message: dict[str, Any], inbound: InboundMessage) -> None:
        raise TransientStoreError("redis: connection refused")

    monkeypatch.setattr(Sqs, "send", recording)
    consumer_ = Consumer("rss.ingest", handler, queue_services, registry=None)
    answer = consumer_.lambda_handler({"Records": [to_record(original, queue_arn(url))]}, None)
    assert answer == {"batchItemFailures": []}
    key = original["MessageAttributes"]["idempotencyKey"]["StringValue"]
    assert sent == [(url, original["Body"], key, OUTAGE_DELAY_S)]
    assert Sqs(sqs_client(), queue_services.settings.queue_prefix).depth(url)["delayed"] == 1


def test_a_copy_that_cannot_be_sent_holds_the_delivery_back_instead(
        queue_services: Services, urls: dict[str, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.core.errors import TransientStoreError

    url = urls["rss.ingest"]
    message_id = publish(queue_services, batchId="no-copy")

    def handler(message: dict[str, Any], inbound: InboundMessage) -> None:
        raise TransientStoreError("sqlite: unable to open database file")

    def refuse(self: Sqs, url: str, body: str, key: str | None = None, *,
               delay_s: int = 0) -> str:
        raise RuntimeError("SQS refused the send")

    monkeypatch.setattr(Sqs, "send", refuse)
    polled = poll(url, Consumer("rss.ingest", handler, queue_services,
                                registry=None).lambda_handler)
    assert polled.failed_ids == [message_id] and polled.deleted_ids == []
    assert receive(url, visibility=0) == []  # held back for the outage delay, not lost
    attrs = sqs_client().get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attrs["ApproximateNumberOfMessagesNotVisible"] == "1"


def test_completed_keys_unreachable_each_record_waits_for_its_store(
        queue_services: Services, urls: dict[str, str]) -> None:
    """The batch's completed-keys lookup fails (Redis down): no record is handled blind;
    each waits as a copy, none is dead-lettered or counted."""
    from sluice.core.errors import TransientStoreError

    url = urls["rss.ingest"]
    ids = {publish(queue_services, batchId=f"k{n}") for n in range(3)}
    handler = Recorder()
    consumer_ = consumer(queue_services, handler)

    class Down:
        def done_many(self, keys: list[str]) -> set[str]:
            raise TransientStoreError("redis: connection refused")

        def done(self, key: str) -> bool:
            raise TransientStoreError("redis: connection refused")

    consumer_.keys = Down()  # type: ignore[assignment]
    polled = poll(url, consumer_.lambda_handler)
    assert set(polled.deleted_ids) == ids and polled.failed_ids == []
    assert handler.calls == [] and _delayed(url) == 3
    assert bodies(urls["rss.ingest-dlq"]) == []
