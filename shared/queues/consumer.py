"""The one consumer wrapper every topic uses, on SQS (Powertools batch) and in process.

Per message: parse, verify the signature, skip a completed idempotency key, run
the handler, and on failure decide by the delivery count: retry after
``min(300, 2^n)`` s (the message's visibility on SQS), or at ``MAX_ATTEMPTS``
send a summary to ``<topic>-dlq``, wait for it, and only then acknowledge.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from shared.core.errors import SluiceError
from shared.core.observe import logger
from shared.queues.publish import (
    IDEMPOTENCY_ATTRIBUTE,
    MAX_ATTEMPTS,
    REGISTRY,
    VISIBILITY_TIMEOUT_S,
    Delivery,
    LocalDeadLetters,
    Registry,
    Sqs,
    check_topic,
    completed_keys,
    idempotency_key,
    js_iso,
)
from shared.queues.signing import Signer

if TYPE_CHECKING:
    from shared.core.services import Services

Handler = Callable[[dict[str, Any], Delivery], None]
ERROR_MESSAGE_LIMIT = 500


class MessageOutcome(Enum):
    """What the consumer did with one received queue message."""

    DONE = "done"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    RETRY = "retry"
    DEAD_LETTERED = "dead_lettered"


class Decision(NamedTuple):
    outcome: MessageOutcome
    delay_s: int = 0
    reason: str | None = None


class Rejected(SluiceError):
    """The message was rejected (malformed, forged or misrouted) and acknowledged."""


class RetryLater(SluiceError):
    """The handler failed; the message is retried after its backoff."""


class DeadLetterFailed(SluiceError):
    """The dead-letter summary could not be sent, so the message is not acknowledged."""


def backoff_s(delivery_count: int) -> int:
    """Seconds before the next delivery after a failure on delivery ``delivery_count``."""
    return min(VISIBILITY_TIMEOUT_S, int(2 ** max(0, delivery_count)))


def dead_letter_summary(message: dict[str, Any], delivery: Delivery, error: BaseException,
                        failed_at: str) -> dict[str, Any]:
    return {"originalMessageId": delivery.message_id, "originalTopic": delivery.topic,
            "deliveryCount": delivery.delivery_count, "failedAt": failed_at,
            "errorMessage": f"{type(error).__name__}: {error}"[:ERROR_MESSAGE_LIMIT],
            "originalMessage": message}


class _Batch:
    """One SQS batch: completed keys looked up once, completions written once at the end."""

    __slots__ = ("completed", "done")

    def __init__(self, done: set[str]) -> None:
        self.done = done  # completed before the batch or during it
        self.completed: list[tuple[str, str, str]] = []


class Consumer:
    def __init__(self, topic: str, handler: Handler, services: Services, *,
                 sqs: Sqs | None = None, registry: Registry | None = REGISTRY,
                 max_attempts: int = MAX_ATTEMPTS,
                 sleep: Callable[[float], None] | None = None) -> None:
        self.topic = check_topic(topic)
        self.handler = handler
        self.services = services
        self.signer = Signer(services.settings.queue_signing_secrets)
        self.keys = completed_keys(services)
        self.local_dlq = LocalDeadLetters(services.db)
        self.max_attempts = max_attempts
        # In process there is no queue to hold a message back: retries run at once
        # unless a sleep is given (the backoff is logged either way).
        self.sleep = sleep
        self._sqs = sqs
        self._processor = BatchProcessor(event_type=EventType.SQS)
        self._context = f"queues:{topic}"
        self._batch: _Batch | None = None
        if registry is not None:
            registry.register(topic, self)

    @property
    def sqs(self) -> Sqs:
        if self._sqs is None:
            self._sqs = Sqs.connect(self.services.settings)
        return self._sqs

    # --- the transport-independent core ------------------------------------

    def handle(self, body: str, delivery: Delivery) -> Decision:
        reporter = self.services.reporter
        try:
            message = json.loads(body)
        except ValueError:
            message = None
        if not isinstance(message, dict):
            return self._reject(delivery, "malformed message: not a JSON object")
        reason = self.signer.check(message)
        if reason is None and message.get("topic") != self.topic:
            reason = f"message topic {message.get('topic')!r} is not {self.topic!r}"
        if reason is not None:
            return self._reject(delivery, reason)

        key = delivery.idempotency_key or idempotency_key(message)
        if self._completed(key, delivery):
            logger.info(f"[{self._context}] already completed; acknowledged",
                        extra={"messageId": delivery.message_id, "idempotencyKey": key})
            return Decision(MessageOutcome.DUPLICATE)
        try:
            self.handler(message, delivery)
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
            reporter.error(self._context, exc, messageId=delivery.message_id,
                           deliveryCount=delivery.delivery_count)
            if delivery.delivery_count < self.max_attempts:
                return Decision(MessageOutcome.RETRY, backoff_s(delivery.delivery_count), str(exc))
            self._dead_letter(dead_letter_summary(message, delivery, exc,
                                                  js_iso(self._now())), key)
            reporter.metric("QueueDeadLettered", 1, topic=self.topic)
            return Decision(MessageOutcome.DEAD_LETTERED, reason=str(exc))
        if self._batch is not None:
            self._batch.done.add(key)
            self._batch.completed.append((key, self.topic, delivery.message_id))
        else:
            self.keys.complete(key, self.topic, delivery.message_id)
        return Decision(MessageOutcome.DONE)

    def _completed(self, key: str, delivery: Delivery) -> bool:
        batch = self._batch
        if batch is None:
            return self.keys.done(key)
        if key in batch.done:  # completed before this batch, or earlier in it
            return True
        # A key carried as an attribute was looked up with the batch; one computed here was not.
        return delivery.idempotency_key is None and self.keys.done(key)

    def _reject(self, delivery: Delivery, reason: str) -> Decision:
        # Acknowledged, never retried, never dead-lettered: retrying a forgery is
        # pointless and would only mirror attacker payloads into the DLQ.
        self.services.reporter.error(self._context, Rejected(f"rejected: {reason}"),
                                     messageId=delivery.message_id,
                                     deliveryCount=delivery.delivery_count)
        self.services.reporter.metric("QueueMessagesRejected", 1, topic=self.topic)
        return Decision(MessageOutcome.REJECTED, reason=reason)

    def _now(self) -> Any:
        from shared.store.db import utcnow

        return utcnow()

    def _dead_letter(self, summary: dict[str, Any], key: str) -> None:
        body = json.dumps(summary, ensure_ascii=False, separators=(",", ":"))
        try:
            if self.services.settings.queue_mode == "sqs":
                self.sqs.send(self.sqs.dlq_url(self.topic), body, key)
            else:
                self.local_dlq.add(self.topic, summary)
        except Exception as exc:  # any send failure: not acknowledged
            self.services.reporter.error(self._context, exc, during="dead-letter send",
                                         messageId=summary["originalMessageId"])
            raise DeadLetterFailed(f"{self.topic}-dlq send failed: {exc}") from exc
        logger.error(f"[{self._context}] dead-lettered after {summary['deliveryCount']} attempts",
                     extra={"messageId": summary["originalMessageId"]})

    # --- SQS (Lambda event source mapping) -----------------------------------

    def _record(self, record: SQSRecord) -> None:
        attribute = (record.get("messageAttributes") or {}).get(IDEMPOTENCY_ATTRIBUTE) or {}
        delivery = Delivery(
            message_id=record.message_id, topic=self.topic,
            delivery_count=int(record.attributes.approximate_receive_count or 1),
            idempotency_key=attribute.get("stringValue"),
            receipt_handle=record.receipt_handle)
        try:
            decision = self.handle(record.body, delivery)
        except DeadLetterFailed:
            # Not acknowledged: the send is tried again on the next delivery.
            self._hold_back(record, backoff_s(delivery.delivery_count))
            raise
        except Exception as exc:  # a store outage: report, retry on the queue's timeout
            self.services.reporter.error(self._context, exc, during="consume",
                                         messageId=record.message_id)
            raise
        if decision.outcome is MessageOutcome.RETRY:
            self._hold_back(record, decision.delay_s)
            raise RetryLater(f"retry in {decision.delay_s}s: {decision.reason}")

    def _hold_back(self, record: SQSRecord, seconds: int) -> None:
        """The backoff, as the message's visibility (the retry happens either way)."""
        try:
            url = self.sqs.url_from_arn(record.event_source_arn)
            self.sqs.change_visibility(url, record.receipt_handle, seconds)
        except Exception as exc:  # noqa: BLE001 - the queue's timeout still brings it back
            self.services.reporter.error(self._context, exc, during="visibility change",
                                         messageId=record.message_id)

    def lambda_handler(self, event: dict[str, Any], context: Any = None) -> dict[str, Any]:
        """The SQS-triggered Lambda: item failures reported, the rest acknowledged.

        Completed keys are read in one query before the batch and written in one
        transaction after it, before the acknowledgement; if that write fails the
        invocation fails and SQS delivers the batch again (at least once, never lost).
        """
        keys = [key for record in event.get("Records") or ()
                if (key := ((record.get("messageAttributes") or {}).get(IDEMPOTENCY_ATTRIBUTE)
                            or {}).get("stringValue"))]
        self._batch = batch = _Batch(self.keys.done_many(keys))
        try:
            result: dict[str, Any] = process_partial_response(
                event=event, record_handler=self._record, processor=self._processor,
                context=context)  # type: ignore[assignment]
        finally:
            self._batch = None
            if batch.completed:
                self.keys.complete_many(batch.completed)
        return result

    # --- in process (not provisioned) ----------------------------------------

    def deliver_local(self, body: str, message_id: str) -> Decision:
        decision = Decision(MessageOutcome.RETRY)
        for attempt in range(1, self.max_attempts + 1):
            decision = self.handle(body, Delivery(message_id, self.topic, attempt))
            if decision.outcome is not MessageOutcome.RETRY:
                break
            logger.warning(f"[{self._context}] retrying in process",
                           extra={"messageId": message_id, "attempt": attempt,
                                  "backoffSeconds": decision.delay_s})
            if self.sleep is not None:
                self.sleep(decision.delay_s)
        return decision
