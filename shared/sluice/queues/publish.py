"""Publishing: SQS when provisioned, the in-process registry when not.

There is no silent fallback from one to the other: with ``SLUICE_QUEUE_MODE=sqs``
a client that cannot be built raises, because "maybe ran in process, maybe not"
is worse than a publish that fails loud.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Literal, NamedTuple, Protocol

from sluice.core import trace
from sluice.core.errors import Conflict, TransientStoreError
from sluice.core.observe import logger
from sluice.core.settings import Settings
from sluice.core.times import iso_z
from sluice.core.trace import SYSTEM_SLUICE, SYSTEM_SQS
from sluice.queues.keys import idempotency_key
from sluice.queues.signing import Signer
from sluice.queues.sqs import Sqs
from sluice.queues.topics import check_topic, get_topic
from sluice.store.db import utcnow

Mode = Literal["local", "sqs"]


def js_iso(moment: datetime) -> str:
    """``Date.prototype.toISOString()``: millisecond precision, ``Z``."""
    return iso_z(moment)


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
        """The signed message: ``topic``, the topic's own fields (``Topic.compose``: its
        declared ones in order, defaults filled), then ``signature``."""
        message = {"topic": topic, **get_topic(topic).compose(fields, self.clock())}
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
        with trace.span(f"publish {topic}", kind="producer", attributes={
                "messaging.system": SYSTEM_SQS if self.mode == "sqs" else SYSTEM_SLUICE,
                "messaging.operation.type": "send", "messaging.operation.name": "publish",
                "messaging.destination.name": topic, "sluice.topic": topic,
                "sluice.idempotency_key": key}) as span:
            published = self._send(topic, key, body, message)
            span.set("messaging.message.id", published.message_id)
            span.set("sluice.outcome", published.outcome)
            return published

    def _send(self, topic: str, key: str, body: str, message: dict[str, Any]) -> Published:
        if self.mode == "sqs":
            # the context travels in the message's attributes: the signed body is the
            # producers' own, byte for byte (tests/js_signing.js)
            message_id = self.sqs.send(self.sqs.topic_url(topic), body, key,
                                       trace=trace.carrier())
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
        if outcome == "waiting":  # as SQS down would be: the caller's to retry, typed
            raise TransientStoreError(f"{topic}: the in-process consumer's store is down: "
                                      f"{decision.reason}")
        return Published(topic, message_id, key, "local", outcome in LOCAL_HANDLED, message,
                         outcome, decision.reason)
