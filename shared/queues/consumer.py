"""The one consumer wrapper every topic uses, on SQS (Powertools batch) and in process.

Per message: parse, verify the signature (a rejected message goes to the quarantine
and is acknowledged), skip one whose signed content already completed, run the
handler, and on failure decide by the delivery count: retry after ``min(300, 2^n)``
s (the message's visibility on SQS), or at ``MAX_ATTEMPTS`` send a summary to
``<topic>-dlq``, wait for it, and only then acknowledge.

A consumer refuses to exist without a signing secret: on Lambda the function then
fails at cold start, its messages stay on the queue and the queue's redrive policy
moves them to the DLQ, where a redrive can verify them once the secret is back.
"""

from __future__ import annotations

import json
import time
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
from shared.queues.deadletters import LocalDeadLetters, Quarantine
from shared.queues.keys import IDEMPOTENCY_ATTRIBUTE, completed_keys, dedupe_key, idempotency_key
from shared.queues.publish import REGISTRY, Registry, js_iso
from shared.queues.signing import MissingSecret, Signer, canonical
from shared.queues.sqs import Sqs
from shared.queues.topics import MAX_ATTEMPTS, VISIBILITY_TIMEOUT_S, check_topic

if TYPE_CHECKING:
    from shared.core.services import Services


class InboundMessage(NamedTuple):
    """One delivery of a message from its queue, as the queue describes it."""

    message_id: str
    topic: str
    delivery_count: int
    idempotency_key: str | None = None  # the unsigned attribute as sent; informational only
    queue_url: str | None = None
    receipt_handle: str | None = None


Handler = Callable[[dict[str, Any], InboundMessage], None]
ERROR_MESSAGE_LIMIT = 500
# A batch stops starting records when Lambda's remaining time is below this margin
# plus the longest record of the batch so far.
DEADLINE_MARGIN_S = 5.0


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
    """The message was rejected (malformed, forged or misrouted), quarantined and acknowledged."""


class RetryLater(SluiceError):
    """The handler failed; the message is retried after its backoff."""


class DeadLetterFailed(SluiceError):
    """The dead-letter summary could not be sent, so the message is not acknowledged."""


class OutOfTime(SluiceError):
    """Too little of the invocation is left to start this message; it is delivered again."""


def backoff_s(delivery_count: int) -> int:
    """Seconds before the next delivery after a failure on delivery ``delivery_count``."""
    return min(VISIBILITY_TIMEOUT_S, int(2 ** max(0, delivery_count)))


def dead_letter_summary(message: dict[str, Any], inbound: InboundMessage, error: BaseException,
                        failed_at: str) -> dict[str, Any]:
    return {"originalMessageId": inbound.message_id, "originalTopic": inbound.topic,
            "deliveryCount": inbound.delivery_count, "failedAt": failed_at,
            "errorMessage": f"{type(error).__name__}: {error}"[:ERROR_MESSAGE_LIMIT],
            "originalMessage": message}


class Parsed(NamedTuple):
    message: dict[str, Any]
    payload: bytes  # the canonical signing input


def parse(body: str) -> Parsed | str:
    """The message and its signing input, or why it cannot be one."""
    try:
        message = json.loads(body)
    except ValueError:
        return "malformed message: not a JSON object"
    if not isinstance(message, dict):
        return "malformed message: not a JSON object"
    try:
        return Parsed(message, canonical(message))
    except (TypeError, ValueError) as exc:
        return f"malformed message: {exc}"


class _Batch:
    """One SQS batch: its messages parsed once, completed keys looked up once, its deadline."""

    __slots__ = ("done", "longest_s", "margin_s", "parsed", "remaining_ms")

    def __init__(self, done: set[str], parsed: dict[str, Parsed | str],
                 remaining_ms: Callable[[], int] | None, margin_s: float) -> None:
        self.done = done  # completed before the batch or during it
        self.parsed = parsed
        self.remaining_ms = remaining_ms
        self.margin_s = margin_s
        self.longest_s = 0.0

    def out_of_time(self) -> bool:
        if self.remaining_ms is None:
            return False
        return self.remaining_ms() / 1000 < self.margin_s + self.longest_s


class Consumer:
    def __init__(self, topic: str, handler: Handler, services: Services, *,
                 sqs: Sqs | None = None, registry: Registry | None = REGISTRY,
                 max_attempts: int = MAX_ATTEMPTS, margin_s: float = DEADLINE_MARGIN_S,
                 sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.topic = check_topic(topic)
        self.signer = Signer(services.settings.queue_signing_secrets)
        if not self.signer.configured:
            raise MissingSecret(f"SLUICE_QUEUE_SIGNING_SECRET is not set: the {topic} consumer "
                                "refuses to start (its messages stay on the queue)")
        self.handler = handler
        self.services = services
        self.keys = completed_keys(services)
        self.local_dlq = LocalDeadLetters(services.db)
        self.quarantine = Quarantine(services.db)
        self.max_attempts = max_attempts
        self.margin_s = margin_s
        # In process there is no queue to hold a message back: retries run at once
        # unless a sleep is given (the backoff is logged either way).
        self.sleep = sleep
        self.clock = clock
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

    def handle(self, body: str, inbound: InboundMessage,
               parsed: Parsed | str | None = None) -> Decision:
        reporter = self.services.reporter
        if parsed is None:
            parsed = parse(body)
        if isinstance(parsed, str):
            return self._reject(inbound, body, parsed)
        message = parsed.message
        reason = self.signer.check(message, parsed.payload)
        if reason is None and message.get("topic") != self.topic:
            reason = f"message topic {message.get('topic')!r} is not {self.topic!r}"
        if reason is not None:
            return self._reject(inbound, body, reason)

        key = dedupe_key(self.topic, parsed.payload)
        if self._completed(key):
            logger.info(f"[{self._context}] already completed; acknowledged",
                        extra={"messageId": inbound.message_id, "dedupeKey": key})
            return Decision(MessageOutcome.DUPLICATE)
        try:
            self.handler(message, inbound)
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
            reporter.error(self._context, exc, messageId=inbound.message_id,
                           deliveryCount=inbound.delivery_count)
            if inbound.delivery_count < self.max_attempts:
                return Decision(MessageOutcome.RETRY, backoff_s(inbound.delivery_count), str(exc))
            self._dead_letter(dead_letter_summary(message, inbound, exc, js_iso(self._now())),
                              idempotency_key(message))
            reporter.metric("QueueDeadLettered", 1, topic=self.topic)
            return Decision(MessageOutcome.DEAD_LETTERED, reason=str(exc))
        # Recorded as soon as it completed: a batch cut short later does not run it again.
        self.keys.complete(key, self.topic, inbound.message_id)
        if self._batch is not None:
            self._batch.done.add(key)
        return Decision(MessageOutcome.DONE)

    def _completed(self, key: str) -> bool:
        if self._batch is not None:  # every key of the batch was looked up with it
            return key in self._batch.done
        return self.keys.done(key)

    def _reject(self, inbound: InboundMessage, body: str, reason: str) -> Decision:
        # Never retried and never dead-lettered (retrying a forgery is pointless and would
        # mirror attacker payloads into the DLQ): kept in the quarantine, then acknowledged.
        # If the quarantine cannot be written the error propagates and the message stays.
        self.quarantine.add(self.topic, inbound.message_id, reason, body)
        self.services.reporter.error(self._context, Rejected(f"rejected: {reason}"),
                                     messageId=inbound.message_id,
                                     deliveryCount=inbound.delivery_count)
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
        batch = self._batch
        if batch is not None and batch.out_of_time():
            raise OutOfTime(f"{batch.remaining_ms() if batch.remaining_ms else 0} ms left; "
                            "not started")
        attribute = (record.get("messageAttributes") or {}).get(IDEMPOTENCY_ATTRIBUTE) or {}
        inbound = InboundMessage(
            message_id=record.message_id, topic=self.topic,
            delivery_count=int(record.attributes.approximate_receive_count or 1),
            idempotency_key=attribute.get("stringValue"),
            receipt_handle=record.receipt_handle)
        started = self.clock()
        try:
            decision = self.handle(record.body, inbound,
                                   batch.parsed.get(record.message_id) if batch else None)
        except DeadLetterFailed:
            # Not acknowledged: the send is tried again on the next delivery.
            self._hold_back(record, backoff_s(inbound.delivery_count))
            raise
        except Exception as exc:  # a store outage: report, retry on the queue's timeout
            self.services.reporter.error(self._context, exc, during="consume",
                                         messageId=record.message_id)
            raise
        finally:
            if batch is not None:
                batch.longest_s = max(batch.longest_s, self.clock() - started)
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

        The batch's completed keys are read in one query before it; each completion is
        written as its record finishes. When Lambda's remaining time runs short, the
        records not yet started are reported as item failures and delivered again.
        """
        every: list[tuple[str, Parsed | str]] = [
            (record.get("messageId", ""), parse(record.get("body") or ""))
            for record in event.get("Records") or ()]
        keys = [dedupe_key(self.topic, p.payload) for _, p in every if not isinstance(p, str)]
        # A message id seen twice in one batch is parsed again from its own record's body.
        ids = [message_id for message_id, _ in every]
        parsed = {message_id: p for message_id, p in every if ids.count(message_id) == 1}
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        self._batch = _Batch(self.keys.done_many(keys), parsed, remaining, self.margin_s)
        try:
            result: dict[str, Any] = process_partial_response(
                event=event, record_handler=self._record, processor=self._processor,
                context=context)  # type: ignore[assignment]
        finally:
            self._batch = None
        return result

    # --- in process (not provisioned) ----------------------------------------

    def deliver_local(self, body: str, message_id: str) -> Decision:
        decision = Decision(MessageOutcome.RETRY)
        parsed = parse(body)
        for attempt in range(1, self.max_attempts + 1):
            decision = self.handle(body, InboundMessage(message_id, self.topic, attempt), parsed)
            if decision.outcome is not MessageOutcome.RETRY:
                break
            logger.warning(f"[{self._context}] retrying in process",
                           extra={"messageId": message_id, "attempt": attempt,
                                  "backoffSeconds": decision.delay_s})
            if self.sleep is not None:
                self.sleep(decision.delay_s)
        return decision
