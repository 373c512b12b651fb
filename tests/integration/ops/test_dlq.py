"""Dead letters are read: list, show, redrive (re-signed, once), purge — SQS, in process, ledger."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sluice.billing.deadletters import RedisNotConfigured
from sluice.core.services import Services
from sluice.jobs.runs import RunStore
from sluice.ops.deadletters import DeadLetters
from sluice.queues.consumer import Consumer, InboundMessage
from sluice.queues.publish import Publisher, Registry
from sluice.queues.signing import Signer
from sluice.store.redis_clients import LEDGER_RETRY_DLQ, LEDGER_RETRY_QUEUE
from tests.sqs_helpers import bodies, create_queues, new_prefix, poll, receive

SECRET = "queue-secret-for-tests-0123456789"
NEW_SECRET = "rotated-queue-secret-0123456789ab"


class Flaky:
    """Fails until ``healthy`` is set; counts runs per batch id."""

    def __init__(self) -> None:
        self.healthy = False
        self.runs: dict[str, int] = {}

    def __call__(self, message: dict[str, Any], inbound: InboundMessage) -> None:
        self.runs[message["batchId"]] = self.runs.get(message["batchId"], 0) + 1
        if not self.healthy:
            raise RuntimeError("downstream is down")


def _poison(services: Services, url: str, consumer: Consumer, batch: str) -> str:
    message_id = Publisher(services.settings, registry=None).publish(
        "rss.ingest", {"batchId": batch}).message_id
    for _ in range(4):
        receive(url, visibility=0)
    polled = poll(url, consumer.lambda_handler)
    assert polled.deleted_ids == [message_id]
    return str(message_id)


@pytest.mark.aws
def test_sqs_dlq_list_show_redrive_once_and_purge(
        aws_env: dict[str, str], sqlite_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                             SLUICE_QUEUE_SIGNING_SECRET=SECRET, SLUICE_QUEUE_PREFIX=new_prefix())
    urls = create_queues(services.settings.queue_prefix, ("rss.ingest",))
    handler = Flaky()
    consumer = Consumer("rss.ingest", handler, services, registry=None)
    first = _poison(services, urls["rss.ingest"], consumer, "poison-1")
    _poison(services, urls["rss.ingest"], consumer, "poison-2")

    dlq = DeadLetters(services, sleep=lambda s: None)
    listed = dlq.list_letters("rss.ingest")
    assert listed["depth"] == 2 and len(listed["items"]) == 2
    assert listed["items"][0]["failedAt"] >= listed["items"][1]["failedAt"]  # newest first
    assert all(i["reason"] == "RuntimeError: downstream is down" for i in listed["items"])
    assert all(0 <= i["ageSeconds"] < 60 for i in listed["items"])
    assert len(bodies(urls["rss.ingest-dlq"])) == 2, "listing hides nothing"

    shown = dlq.show("rss.ingest", first)  # by original message id
    assert shown["body"]["originalMessage"]["batchId"] == "poison-1"
    entry_id = shown["id"]

    dry = dlq.redrive("rss.ingest", ids=[entry_id], dry_run=True, actor="admin-1")
    assert dry["count"] == 1 and dlq.list_letters("rss.ingest")["depth"] == 2
    assert receive(urls["rss.ingest"], visibility=0) == []

    # GIVEN the secret was rotated WHEN redriven THEN re-signed with the current one.
    rotated = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                            SLUICE_QUEUE_SIGNING_SECRET=f"{NEW_SECRET},{SECRET}",
                            SLUICE_QUEUE_PREFIX=services.settings.queue_prefix)
    done = DeadLetters(rotated, sleep=lambda s: None).redrive("rss.ingest", ids=[entry_id],
                                                              actor="admin-1")
    assert done["count"] == 1 and done["failed"] == [] and done["notFound"] == []
    [back] = receive(urls["rss.ingest"], visibility=0)
    body = json.loads(back["Body"])
    assert Signer([NEW_SECRET]).check(body) is None and body["batchId"] == "poison-1"
    assert dlq.list_letters("rss.ingest")["depth"] == 1

    # The redriven message runs once, even if it is delivered (or redriven) twice.
    handler.healthy = True
    rotated_consumer = Consumer("rss.ingest", handler, rotated, registry=None)
    poll(urls["rss.ingest"], rotated_consumer.lambda_handler)
    assert handler.runs["poison-1"] == 2
    from tests.sqs_helpers import sqs_client
    sqs_client().send_message(QueueUrl=urls["rss.ingest"], MessageBody=back["Body"])
    poll(urls["rss.ingest"], rotated_consumer.lambda_handler)
    assert handler.runs["poison-1"] == 2

    audit = [r for r in RunStore(services.db).recent_audit() if r["action"] == "dlq:redrive"]
    assert [r["outcome"] for r in audit] == ["ok"], "the dry run changed nothing: no row"
    assert audit[0]["actor"] == "admin-1" and audit[0]["target"] == "dlq:rss.ingest"

    assert dlq.purge("rss.ingest", actor="admin-1") == {"queue": "rss.ingest", "purged": 1}
    assert dlq.list_letters("rss.ingest")["items"] == [] and bodies(urls["rss.ingest-dlq"]) == []


@pytest.mark.aws
def test_redrive_is_capped_and_paced(aws_env: dict[str, str], sqlite_url: str,
                                     make_services: Callable[..., Services]) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                             SLUICE_QUEUE_SIGNING_SECRET=SECRET, SLUICE_QUEUE_PREFIX=new_prefix())
    urls = create_queues(services.settings.queue_prefix, ("rss.ingest",))
    consumer = Consumer("rss.ingest", Flaky(), services, registry=None)
    for n in range(3):
        _poison(services, urls["rss.ingest"], consumer, f"p{n}")
    slept: list[float] = []
    dlq = DeadLetters(services, sleep=slept.append, per_second=4)
    with pytest.raises(Exception, match="limit must be between 1 and 100"):
        dlq.redrive("rss.ingest", limit=101)
    result = dlq.redrive("rss.ingest", limit=2, actor="admin-1")
    assert result["count"] == 2 and slept == [0.25]
    assert dlq.list_letters("rss.ingest")["depth"] == 1
    assert len(receive(urls["rss.ingest"], visibility=0)) == 2


def test_in_process_dlq_and_redrive(sqlite_url: str,
                                    make_services: Callable[..., Services]) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    registry = Registry()
    handler = Flaky()
    Consumer("rss.ingest", handler, services, registry=registry)
    publisher = Publisher(services.settings, registry=registry)
    published = publisher.publish("rss.ingest", {"batchId": "local-1"})
    assert published.mode == "local" and not published.dispatched
    assert (published.outcome, published.reason) == ("dead_lettered", "downstream is down")
    assert handler.runs == {"local-1": 5}
    dlq = DeadLetters(services, publisher=publisher, sleep=lambda s: None)
    [item] = dlq.list_letters("rss.ingest")["items"]
    assert item["reason"] == "RuntimeError: downstream is down"
    handler.healthy = True
    assert dlq.redrive("rss.ingest", actor="admin-1")["count"] == 1
    assert handler.runs == {"local-1": 6} and dlq.list_letters("rss.ingest")["depth"] == 0
    # a second publish of the same message is skipped: its key completed
    publisher.send_signed(published.message)
    assert handler.runs == {"local-1": 6}


def test_in_process_without_a_consumer_drops_with_a_log_line(
        sqlite_url: str, make_services: Callable[..., Services],
        caplog: pytest.LogCaptureFixture) -> None:
    services = make_services(sqlite_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    published = Publisher(services.settings, registry=Registry()).publish("rss.ingest", {})
    assert not published.dispatched
    assert "no in-process handler registered; message dropped" in caplog.text


def _ledger_item(entry_id: str, *, attempts: int = 10, at: str = "2026-11-29T01:00:00Z") -> str:
    return json.dumps({"id": entry_id, "attempts": attempts, "enqueuedAt": at,
                       "lastError": "db down", "entry": {"id": entry_id, "model": "m"},
                       "reason": "max attempts", "deadLetteredAt": at}, separators=(",", ":"))


@pytest.mark.redis
def test_ledger_dlq_list_show_redrive_purge(sqlite_url: str, redis_prefix: str,
                                            make_services: Callable[..., Services]) -> None:
    from tests.conftest import REDIS_URL

    services = make_services(sqlite_url, SLUICE_REDIS_URL=REDIS_URL,
                             SLUICE_REDIS_KEY_PREFIX=redis_prefix)
    redis = services.redis
    redis.lpush(LEDGER_RETRY_DLQ, _ledger_item("old", at="2026-11-29T01:00:00Z"))
    redis.lpush(LEDGER_RETRY_DLQ, _ledger_item("new", at="2026-11-29T02:00:00Z"))
    redis.lpush(LEDGER_RETRY_DLQ, "garbage{")
    dlq = DeadLetters(services, sleep=lambda s: None)
    listed = dlq.list_letters("ledger")
    assert listed["depth"] == 3
    assert [i["id"] for i in listed["items"]][:2] == ["new", "old"]
    garbage_id = listed["items"][2]["id"]
    assert garbage_id.startswith("raw-")
    assert dlq.show("ledger", "old")["body"]["entry"] == {"id": "old", "model": "m"}

    assert dlq.redrive("ledger", ids=["old"], dry_run=True, actor="a")["count"] == 1
    assert redis.llen(LEDGER_RETRY_QUEUE) == 0
    result = dlq.redrive("ledger", ids=["old", garbage_id, "missing"], actor="a")
    assert [r["id"] for r in result["redriven"]] == ["old"]
    assert result["refused"] == [{"id": garbage_id, "reason": "not a ledger retry envelope; "
                                                         "it cannot be redriven"}]
    assert result["failed"] == []
    assert result["notFound"] == ["missing"]
    [queued] = redis.lrange(LEDGER_RETRY_QUEUE, 0, -1)
    assert json.loads(queued) == {"id": "old", "attempts": 0, "enqueuedAt": "2026-11-29T01:00:00Z",
                                  "lastError": "max attempts",
                                  "entry": {"id": "old", "model": "m"}}
    assert redis.llen(LEDGER_RETRY_DLQ) == 2
    assert dlq.purge("ledger", ids=[garbage_id], actor="a")["purged"] == 1
    assert dlq.purge("ledger", actor="a")["purged"] == 1
    assert redis.llen(LEDGER_RETRY_DLQ) == 0


def test_ledger_dlq_without_redis_says_so(sqlite_url: str,
                                          make_services: Callable[..., Services]) -> None:
    dlq = DeadLetters(make_services(sqlite_url))
    with pytest.raises(RedisNotConfigured):
        dlq.list_letters("ledger")
    assert {"queue": "ledger", "depth": None, "error": "redis_not_configured"} in dlq.overview()


def test_failed_deliveries_are_a_dlq_too(db_url: str,
                                         make_services: Callable[..., Services]) -> None:
    from datetime import timedelta

    from sluice.delivery.store import DeliveryStatus, DeliveryStore

    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    store = DeliveryStore(services.db)
    for n in range(3):
        store.enqueue("telegram", f"chat-{n}", {"text": f"alert {n}"})
    claimed = store.claim(timedelta(minutes=1), limit=3)
    for entry in claimed[:2]:
        store.fail(entry, f"Bad Request: chat not found ({entry.recipient})")
    dead = DeadLetters(services, per_second=0)

    assert {"queue": "delivery", "depth": 2} in dead.overview()
    listing = dead.list_letters("delivery")
    assert listing["depth"] == 2
    assert {item["reason"] for item in listing["items"]} == {
        "Bad Request: chat not found (chat-0)", "Bad Request: chat not found (chat-1)"}
    first = listing["items"][0]["id"]
    assert dead.show("delivery", first)["body"]["status"] == "failed"

    dry = dead.redrive("delivery", ids=[first], dry_run=True, actor="ops-1")
    assert dry["count"] == 1 and store.get(first).status is DeliveryStatus.FAILED
    done = dead.redrive("delivery", ids=[first], actor="ops-1")
    assert done["redriven"] == [{"id": first, "status": "pending"}]
    assert store.get(first).status is DeliveryStatus.PENDING and store.get(first).attempts == 0

    assert dead.purge("delivery", actor="ops-1") == {"queue": "delivery", "purged": 1}
    assert dead.depth("delivery") == 0
    actions = [(a["action"], a["target"], a["actor"]) for a in RunStore(services.db).recent_audit()]
    assert ("dlq:purge", "dlq:delivery", "ops-1") in actions
    assert ("dlq:redrive", "dlq:delivery", "ops-1") in actions


OLD_SECRET = "retired-queue-secret-0123456789ab"


def test_quarantine_is_its_own_source_and_redrives_only_what_verifies(
        db_url: str, make_services: Callable[..., Services]) -> None:
    from sluice.queues.deadletters import Quarantine

    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    registry = Registry()
    handler = Flaky()
    handler.healthy = True
    Consumer("rss.ingest", handler, services, registry=registry)
    old = Signer([OLD_SECRET]).sign({"topic": "rss.ingest", "batchId": "old-secret",
                                     "sourceId": "s", "feedUrl": "", "publishedAt": "p"})
    registry.get("rss.ingest").deliver_local(json.dumps(old), "m-old")  # type: ignore[union-attr]
    registry.get("rss.ingest").deliver_local("{x", "m-garbage")  # type: ignore[union-attr]
    assert handler.runs == {}

    dead = DeadLetters(services, publisher=Publisher(services.settings, registry=registry),
                       per_second=0)
    assert {"queue": "quarantine", "depth": 2} in dead.overview()
    assert {"queue": "rss.ingest", "depth": 0} in dead.overview()  # never in the -dlq
    listed = dead.list_letters("quarantine")
    assert {i["id"] for i in listed["items"]} == {"m-old", "m-garbage"}
    shown = dead.show("quarantine", "m-old")
    assert shown["reason"] == "signature does not match"
    assert shown["body"]["topic"] == "rss.ingest" and shown["body"]["message"] == old

    refused = dead.redrive("quarantine", limit=10, actor="ops-1")
    assert refused["count"] == 0 and refused["failed"] == []
    assert {r["id"]: r["reason"] for r in refused["refused"]} == {
        "m-old": "does not verify against a current or retired secret (signature does not match)",
        "m-garbage": "no original message to redrive"}
    assert dead.depth("quarantine") == 2 and handler.runs == {}

    # GIVEN the secret it was signed with is configured again as a retired one
    rotated = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=f"{SECRET},{OLD_SECRET}")
    Consumer("rss.ingest", handler, rotated, registry=registry)
    again = DeadLetters(rotated, publisher=Publisher(rotated.settings, registry=registry),
                        per_second=0)
    done = again.redrive("quarantine", ids=["m-old"], actor="ops-1")
    assert [r["id"] for r in done["redriven"]] == ["m-old"] and done["refused"] == []
    assert handler.runs == {"old-secret": 1}
    assert [row["id"] for row in Quarantine(services.db).list(10)] == ["m-garbage"]

    assert again.purge("quarantine", actor="ops-1") == {"queue": "quarantine", "purged": 1}
    assert again.depth("quarantine") == 0
    audit = [(a["action"], a["outcome"]) for a in RunStore(services.db).recent_audit()
             if a["target"] == "dlq:quarantine"]
    assert audit == [("dlq:purge", "ok"), ("dlq:redrive", "ok"), ("dlq:redrive", "failures")]


def test_a_dead_letter_that_does_not_verify_is_refused_not_re_signed(
        db_url: str, make_services: Callable[..., Services]) -> None:
    from sluice.queues.deadletters import LocalDeadLetters

    services = make_services(db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    registry = Registry()
    handler = Flaky()
    handler.healthy = True
    Consumer("rss.ingest", handler, services, registry=registry)
    forged = Signer(["not-our-secret-0123456789abcdef"]).sign(
        {"topic": "rss.ingest", "batchId": "forged", "sourceId": "s", "feedUrl": "",
         "publishedAt": "p"})
    entry = LocalDeadLetters(services.db).add("rss.ingest", {
        "originalMessageId": "m-1", "originalTopic": "rss.ingest", "deliveryCount": 5,
        "failedAt": "2026-11-30T00:00:00.000Z", "errorMessage": "x", "originalMessage": forged})
    dead = DeadLetters(services, publisher=Publisher(services.settings, registry=registry),
                       per_second=0)
    dry = dead.redrive("rss.ingest", dry_run=True, actor="ops-1")
    assert dry["count"] == 0 and [r["id"] for r in dry["refused"]] == [entry]
    result = dead.redrive("rss.ingest", actor="ops-1")
    assert result["count"] == 0 and result["refused"] == [{
        "id": entry,
        "reason": "does not verify against a current or retired secret (signature does not match)"}]
    assert handler.runs == {} and dead.depth("rss.ingest") == 1


@pytest.mark.aws
def test_sqs_dlq_refuses_a_raw_forgery_and_redrives_what_the_redrive_policy_moved(
        aws_env: dict[str, str], sqlite_url: str, make_services: Callable[..., Services]) -> None:
    from tests.sqs_helpers import sqs_client

    services = make_services(sqlite_url, SLUICE_QUEUE_MODE="sqs",
                             SLUICE_QUEUE_SIGNING_SECRET=SECRET, SLUICE_QUEUE_PREFIX=new_prefix())
    urls = create_queues(services.settings.queue_prefix, ("rss.ingest",), max_receive_count=1)
    # GIVEN a consumer that cannot start: its message is received and never deleted, so
    # the queue's redrive policy moves it to the DLQ as it is.
    published = Publisher(services.settings, registry=None).publish(
        "rss.ingest", {"batchId": "stranded"})
    assert len(receive(urls["rss.ingest"], visibility=0)) == 1
    assert receive(urls["rss.ingest"], visibility=0) == []
    forged = Signer(["not-our-secret-0123456789abcdef"]).sign({**published.message,
                                                              "batchId": "forged"})
    sqs_client().send_message(QueueUrl=urls["rss.ingest-dlq"], MessageBody=json.dumps(forged))
    assert len(bodies(urls["rss.ingest-dlq"])) == 2

    dead = DeadLetters(services, per_second=0)
    result = dead.redrive("rss.ingest", limit=10, actor="ops-1")
    assert [r["id"] for r in result["redriven"]] == [published.message_id]
    [refusal] = result["refused"]
    assert refusal["reason"].startswith("does not verify against a current or retired secret")
    [back] = bodies(urls["rss.ingest"])
    assert back["batchId"] == "stranded" and Signer([SECRET]).check(back) is None
    [stays] = bodies(urls["rss.ingest-dlq"])
    assert stays["batchId"] == "forged"
