"""Push-queue topics and publishing: SQS when provisioned, the in-process registry when not.

There is no silent fallback from one to the other: with ``SLUICE_QUEUE_MODE=sqs``
a client that cannot be built raises, because "maybe ran in process, maybe not"
is worse than a publish that fails loud.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol

from shared.core.errors import ConfigurationError, Conflict, NotFound
from shared.core.observe import logger
from shared.core.settings import Settings
from shared.core.times import iso_z
from shared.queues.signing import SIGNATURE_FIELD, Signer, js_stringify
from shared.store.db import Database, load_queries, utcnow

if TYPE_CHECKING:
    from shared.core.services import Services

Q = load_queries("queues")

TOPICS: tuple[str, ...] = ("rss.ingest", "rss.enrich", "rss.cluster", "rss.synthesize")
IMPLEMENTED: frozenset[str] = frozenset({"rss.ingest"})
RESERVED: frozenset[str] = frozenset(TOPICS) - IMPLEMENTED
MAX_ATTEMPTS = 5
VISIBILITY_TIMEOUT_S = 300
# How long a completed idempotency key is remembered: SQS's default retention
# (4 days); a redrive from a DLQ completes the key again with a fresh expiry.
KEY_RETENTION = timedelta(days=4)
EXPIRED_KEYS_PER_WRITE = 100
IDEMPOTENCY_ATTRIBUTE = "idempotencyKey"
_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")

Mode = Literal["local", "sqs"]


class UnknownTopic(NotFound):
    """No such push-queue topic."""

    code = "unknown_topic"


class QueueMissing(NotFound):
    """The SQS queue does not exist (not provisioned for this prefix and stage)."""

    code = "queue_missing"


class ReservedTopic(Conflict):
    """This topic is reserved: its consumer is not implemented, so nothing may publish to it."""

    code = "reserved_topic"


def check_topic(topic: str, *, publishing: bool = False) -> str:
    if topic not in TOPICS:
        raise UnknownTopic(f"unknown topic {topic!r}; known: {', '.join(TOPICS)}")
    if publishing and topic in RESERVED:
        raise ReservedTopic(f"{topic} consumer is not implemented; do not enable a producer "
                            "for this topic")
    return topic


def queue_name(prefix: str, topic: str) -> str:
    return prefix + topic.replace(".", "-")


def dlq_name(prefix: str, topic: str) -> str:
    return queue_name(prefix, topic) + "-dlq"


def idempotency_key(message: Mapping[str, Any]) -> str:
    """``<topic>:<batchId>:<first 96 chars of the JSON, non-alphanumerics as _>``.

    The JSON is the message without its signature, written as ``JSON.stringify``
    writes it, so a TypeScript producer computes the same key and a re-signed
    (redriven) message keeps it.
    """
    body = {k: v for k, v in message.items() if k != SIGNATURE_FIELD}
    text = _NON_ALNUM.sub("_", js_stringify(body)[:96])
    return f"{message.get('topic', '')}:{message.get('batchId', '')}:{text}"


def js_iso(moment: datetime) -> str:
    """``Date.prototype.toISOString()``: millisecond precision, ``Z``."""
    return iso_z(moment)


class Delivery(NamedTuple):
    """What the queue says about one delivery of a message."""

    message_id: str
    topic: str
    delivery_count: int
    idempotency_key: str | None = None
    queue_url: str | None = None
    receipt_handle: str | None = None


class InProcess(Protocol):
    def deliver_local(self, body: str, message_id: str) -> Any: ...


class Registry:
    """Topic -> in-process consumer (the not-provisioned path). Consumers register themselves."""

    def __init__(self) -> None:
        self._consumers: dict[str, InProcess] = {}

    def register(self, topic: str, consumer: InProcess) -> None:
        self._consumers[check_topic(topic)] = consumer

    def get(self, topic: str) -> InProcess | None:
        return self._consumers.get(topic)

    def clear(self) -> None:
        self._consumers.clear()


REGISTRY = Registry()


class Sqs:
    """The boto3 SQS client with queue URLs looked up once and cached."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._urls: dict[str, str] = {}

    @classmethod
    def connect(cls, settings: Settings) -> Sqs:
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]
        from botocore.exceptions import BotoCoreError  # type: ignore[import-untyped]

        try:
            # boto3 reads AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL itself.
            client = boto3.client("sqs", config=Config(retries={"mode": "standard",
                                                                "max_attempts": 3},
                                                       connect_timeout=5, read_timeout=20))
        except BotoCoreError as exc:
            raise ConfigurationError(f"SLUICE_QUEUE_MODE=sqs but no SQS client: {exc}") from exc
        return cls(client, settings.queue_prefix)

    def url(self, name: str) -> str:
        url = self._urls.get(name)
        if url is None:
            try:
                url = str(self.client.get_queue_url(QueueName=name)["QueueUrl"])
            except self.client.exceptions.QueueDoesNotExist:
                raise QueueMissing(f"SQS queue {name} does not exist", queue=name) from None
            self._urls[name] = url
        return url

    def topic_url(self, topic: str) -> str:
        return self.url(queue_name(self.prefix, topic))

    def dlq_url(self, topic: str) -> str:
        return self.url(dlq_name(self.prefix, topic))

    def url_from_arn(self, arn: str) -> str:
        return self.url(arn.rsplit(":", 1)[-1])

    def send(self, url: str, body: str, key: str | None = None) -> str:
        attributes = ({IDEMPOTENCY_ATTRIBUTE: {"DataType": "String", "StringValue": key}}
                      if key else {})
        sent = self.client.send_message(QueueUrl=url, MessageBody=body,
                                        MessageAttributes=attributes)
        return str(sent["MessageId"])

    def change_visibility(self, url: str, receipt_handle: str, seconds: int) -> None:
        self.client.change_message_visibility(QueueUrl=url, ReceiptHandle=receipt_handle,
                                              VisibilityTimeout=seconds)

    def receive(self, url: str, *, max_messages: int = 10, visibility: int = 30,
                wait: int = 0) -> list[dict[str, Any]]:
        got = self.client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=max_messages, VisibilityTimeout=visibility,
            WaitTimeSeconds=wait, MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"])
        messages: list[dict[str, Any]] = got.get("Messages", [])
        return messages

    def delete(self, url: str, receipt_handle: str) -> None:
        self.client.delete_message(QueueUrl=url, ReceiptHandle=receipt_handle)

    def depth(self, url: str) -> dict[str, int]:
        attrs = self.client.get_queue_attributes(QueueUrl=url, AttributeNames=[
            "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessagesDelayed"])["Attributes"]
        return {"visible": int(attrs.get("ApproximateNumberOfMessages", 0)),
                "inFlight": int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
                "delayed": int(attrs.get("ApproximateNumberOfMessagesDelayed", 0))}


class CompletedKeys:
    """Idempotency keys whose handler completed, remembered for the queue's retention."""

    def __init__(self, db: Database, retention: timedelta = KEY_RETENTION) -> None:
        self.db = db
        self.retention = retention

    def done(self, key: str, *, now: datetime | None = None) -> bool:
        with self.db.transaction() as tx:
            return tx.fetchone(Q.key_completed, {"key": key, "now": now or utcnow()}) is not None

    def complete(self, key: str, topic: str, message_id: str, *,
                 now: datetime | None = None) -> None:
        self.complete_many([(key, topic, message_id)], now=now)

    def done_many(self, keys: list[str], *, now: datetime | None = None) -> set[str]:
        """Which of ``keys`` completed (one query for a whole batch)."""
        if not keys:
            return set()
        with self.db.transaction() as tx:
            rows = tx.fetchall(Q.keys_completed, {"keys": tx.json(keys), "now": now or utcnow()})
        return {row["key"] for row in rows}

    def complete_many(self, done: list[tuple[str, str, str]], *,
                      now: datetime | None = None) -> None:
        """``(key, topic, message_id)`` triples, in one transaction.

        Each write also retires a bounded number of expired keys, so the table stays
        bounded by the retention without a job of its own.
        """
        now = now or utcnow()
        with self.db.transaction() as tx:
            tx.executemany(Q.complete_key, [
                {"key": key, "topic": topic, "message_id": message_id, "now": now,
                 "expires_at": now + self.retention} for key, topic, message_id in done])
            tx.execute(Q.delete_expired_keys, {"now": now, "limit": EXPIRED_KEYS_PER_WRITE})

    def delete_expired(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        with self.db.transaction() as tx:
            return tx.execute(Q.delete_expired_keys, {"now": now or utcnow(), "limit": limit})


class RedisCompletedKeys:
    """The same, in Redis (``queue:completed:<key>`` with the retention as its TTL).

    Used when Redis is configured: no write transaction to commit per batch. Each
    call is one EVAL, so a batch costs two round trips whatever its size.
    """

    DONE = ("local found = {} for i, k in ipairs(KEYS) do "
            "if redis.call('EXISTS', k) == 1 then found[#found + 1] = i end end return found")
    COMPLETE = ("for i, k in ipairs(KEYS) do redis.call('SET', k, ARGV[i + 1], 'EX', ARGV[1]) "
                "end return #KEYS")

    def __init__(self, redis: Any, retention: timedelta = KEY_RETENTION) -> None:
        self.redis = redis
        self.retention = retention

    @staticmethod
    def _name(key: str) -> str:
        return f"queue:completed:{key}"

    def done(self, key: str) -> bool:
        return bool(self.done_many([key]))

    def done_many(self, keys: list[str]) -> set[str]:
        if not keys:
            return set()
        found = self.redis.eval(self.DONE, [self._name(k) for k in keys], [])
        return {keys[int(i) - 1] for i in found or ()}

    def complete(self, key: str, topic: str, message_id: str) -> None:
        self.complete_many([(key, topic, message_id)])

    def complete_many(self, done: list[tuple[str, str, str]]) -> None:
        if done:
            self.redis.eval(self.COMPLETE, [self._name(k) for k, _, _ in done],
                            [int(self.retention.total_seconds()),
                             *(f"{topic} {message_id}" for _, topic, message_id in done)])


class KeyStore(Protocol):
    def done(self, key: str) -> bool: ...

    def done_many(self, keys: list[str]) -> set[str]: ...

    def complete(self, key: str, topic: str, message_id: str) -> None: ...

    def complete_many(self, done: list[tuple[str, str, str]]) -> None: ...


def completed_keys(services: Services) -> KeyStore:
    """Redis when configured, else the SQL store."""
    if services.settings.redis_configured:
        return RedisCompletedKeys(services.redis)
    return CompletedKeys(services.db)


class LocalDeadLetters:
    """The ``<topic>-dlq`` of the not-provisioned mode: rows in ``queue_dead_letters``."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def add(self, topic: str, summary: Mapping[str, Any]) -> str:
        entry_id = str(uuid.uuid4())
        with self.db.transaction() as tx:
            tx.execute(Q.dead_letter_add, {"id": entry_id, "topic": topic,
                                           "summary": tx.json(dict(summary)),
                                           "failed_at": utcnow()})
        return entry_id

    def list(self, topic: str, limit: int) -> list[dict[str, Any]]:
        with self.db.transaction() as tx:
            return tx.fetchall(Q.dead_letter_list, {"topic": topic, "limit": limit})

    def get(self, topic: str, entry_id: str) -> dict[str, Any] | None:
        with self.db.transaction() as tx:
            return tx.fetchone(Q.dead_letter_get, {"topic": topic, "id": entry_id})

    def delete(self, topic: str, entry_id: str) -> bool:
        with self.db.transaction() as tx:
            return tx.execute(Q.dead_letter_delete, {"topic": topic, "id": entry_id}) > 0

    def count(self, topic: str) -> int:
        with self.db.transaction() as tx:
            row = tx.fetchone(Q.dead_letter_count, {"topic": topic})
        return int(row["n"]) if row else 0

    def purge(self, topic: str) -> int:
        with self.db.transaction() as tx:
            return tx.execute(Q.dead_letter_purge, {"topic": topic})


# In-process outcomes that mean the message was handled.
LOCAL_HANDLED = frozenset({"done", "duplicate"})


class Published(NamedTuple):
    topic: str
    message_id: str | None
    idempotency_key: str
    mode: Mode
    dispatched: bool  # sent to SQS, or handled by the in-process consumer (done / duplicate)
    message: dict[str, Any]
    outcome: str = "sent"  # sqs: sent; local: the consumer's outcome, or no_handler
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "messageId": self.message_id,
                "idempotencyKey": self.idempotency_key, "mode": self.mode,
                "dispatched": self.dispatched, "outcome": self.outcome, "reason": self.reason}


class Publisher:
    """Signs and publishes messages for the configured mode."""

    def __init__(self, settings: Settings, *, sqs: Sqs | None = None,
                 registry: Registry = REGISTRY,
                 clock: Callable[[], datetime] = utcnow) -> None:
        self.settings = settings
        self.mode: Mode = settings.queue_mode
        self.signer = Signer(settings.queue_signing_secrets)
        self.registry = registry
        self.clock = clock
        self._sqs = sqs

    @property
    def sqs(self) -> Sqs:
        if self._sqs is None:
            self._sqs = Sqs.connect(self.settings)
        return self._sqs

    def build(self, topic: str, fields: Mapping[str, Any]) -> dict[str, Any]:
        """The signed message: the standard fields, then the topic's own, then ``signature``."""
        message: dict[str, Any] = {
            "topic": topic,
            "batchId": str(fields.get("batchId") or uuid.uuid4()),
            "sourceId": fields.get("sourceId", "all-sources"),
            "feedUrl": fields.get("feedUrl", ""),
            "publishedAt": fields.get("publishedAt") or js_iso(self.clock()),
        }
        for key, value in fields.items():
            if key not in message and key not in ("topic", SIGNATURE_FIELD):
                message[key] = value
        return self.signer.sign(message)

    def publish(self, topic: str, fields: Mapping[str, Any] | None = None) -> Published:
        check_topic(topic, publishing=True)
        if fields and fields.get("topic") not in (None, topic):
            raise Conflict(f"message topic {fields.get('topic')!r} does not match {topic!r}")
        return self.send_signed(self.build(topic, fields or {}))

    def send_signed(self, message: dict[str, Any]) -> Published:
        """Send an already signed message to its topic (publish, or a DLQ redrive)."""
        topic = check_topic(str(message.get("topic")), publishing=True)
        key = idempotency_key(message)
        body = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        if self.mode == "sqs":
            message_id = self.sqs.send(self.sqs.topic_url(topic), body, key)
            logger.info(f"[queues:{topic}] published", extra={"messageId": message_id,
                                                              "idempotencyKey": key})
            return Published(topic, message_id, key, "sqs", True, message)
        consumer = self.registry.get(topic)
        message_id = f"local-{uuid.uuid4()}"
        if consumer is None:
            logger.warning(f"[queues:{topic}] no in-process handler registered; message dropped",
                           extra={"messageId": message_id, "idempotencyKey": key})
            return Published(topic, message_id, key, "local", False, message, "no_handler")
        decision = consumer.deliver_local(body, message_id)
        outcome = str(decision.outcome.value)
        return Published(topic, message_id, key, "local", outcome in LOCAL_HANDLED, message,
                         outcome, decision.reason)
