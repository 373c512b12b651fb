"""The one consumer wrapper every topic uses, on SQS (Powertools batch) and in process.

Per message: parse, verify the signature (a rejected message goes to the quarantine
and is acknowledged), skip one whose signed content already completed, run the
handler, and on failure decide by the delivery count: retry after ``min(300, 2^n)``
s (the message's visibility on SQS), or at ``MAX_ATTEMPTS`` send a summary to
``<topic>-dlq``, wait for it, and only then acknowledge.

A store outage (``TransientStoreError``: the SQL store or Redis down, in the handler or
in the consumer's own key lookups) is not the message's failure and counts no attempt:
on SQS the message waits for the store as a copy of itself, sent back to its queue with
a delay of ``OUTAGE_DELAY_S`` (a new message: its receive count starts again), and the
delivery is acknowledged once the copy is sent. Only when the copy cannot be sent is the
delivery held back and retried as a failure would be (SQS then counts it).

Completions are recorded per record (the default: a crash repeats at most the record
in flight) or, for a topic whose handler is idempotent, once per SQS batch (a crash
repeats the batch's finished records, which their handler's own key makes harmless).

A consumer refuses to exist without a signing secret: on Lambda the function then
fails at cold start, its messages stay on the queue and the queue's redrive policy
moves them to the DLQ, where a redrive can verify them once the secret is back.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from enum import Enum
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from aws_lambda_powertools.utilities.batch import (
    BatchProcessor,
    EventType,
    process_partial_response,
)
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from sluice.core import trace
from sluice.core.crash import ENV as CRASH_ENV
from sluice.core.crash import crash_point
from sluice.core.errors import RequestError, SluiceError, TransientStoreError
from sluice.core.observe import logger
from sluice.core.trace import SYSTEM_SLUICE, SYSTEM_SQS
from sluice.core.validate import check_depth
from sluice.queues.deadletters import LocalDeadLetters, Quarantine
from sluice.queues.keys import IDEMPOTENCY_ATTRIBUTE, completed_keys, dedupe_key, idempotency_key
from sluice.queues.publish import REGISTRY, Registry, js_iso
from sluice.queues.signing import MissingSecret, Signer, canonical
from sluice.queues.sqs import Sqs
from sluice.queues.topics import MAX_ATTEMPTS, VISIBILITY_TIMEOUT_S, check_topic, get_topic

if TYPE_CHECKING:
    from sluice.core.services import Services


class InboundMessage(NamedTuple):
    """One delivery of a message from its queue, as the queue describes it."""

    message_id: str
    topic: str
    delivery_count: int
    idempotency_key: str | None = None  # the unsigned attribute as sent; informational only
    queue_url: str | None = None
    receipt_handle: str | None = None


Handler = Callable[[dict[str, Any], InboundMessage], None]
# When a completion is written: as each record finishes, or once per SQS batch.
Completions = Literal["record", "batch"]
ERROR_MESSAGE_LIMIT = 500
# A batch stops starting records when Lambda's remaining time is below this margin
# plus the longest record of the batch so far.
DEADLINE_MARGIN_S = 5.0
# How long a message waits for a store that is down before it is tried again (SQS's
# longest delay is 900 s).
OUTAGE_DELAY_S = 300
# A batch span links to at most this many of its messages' producers.
MAX_LINKS = 32


class MessageOutcome(Enum):
    """What the consumer did with one received queue message."""

    DONE = "done"
    DUPLICATE = "duplicate"
    REJECTED = "rejected"
    RETRY = "retry"
    DEAD_LETTERED = "dead_lettered"
    WAITING = "waiting"  # a store is down: the message waits for it, no attempt counted


class Decision(NamedTuple):
    outcome: MessageOutcome
    delay_s: int = 0
    reason: str | None = None


_DONE = Decision(MessageOutcome.DONE)
_DUPLICATE = Decision(MessageOutcome.DUPLICATE)


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
    key: str  # its dedupe key


def parse(body: str, topic: str) -> Parsed | str:
    """The message, its signing input and dedupe key, or why it cannot be one."""
    try:
        check_depth(body, field="message")
        message = json.loads(body)
    except RequestError as exc:  # nested past any real message: refused before parsing
        return f"malformed message: {exc.message}"
    except ValueError:
        return "malformed message: not a JSON object"
    except RecursionError:  # one message must not fail its whole batch, every delivery
        return "malformed message: nested too deeply"
    if type(message) is not dict:
        return "malformed message: not a JSON object"
    try:
        payload = canonical(message)
    except (TypeError, ValueError) as exc:
        return f"malformed message: {exc}"
    except RecursionError:
        return "malformed message: nested too deeply"
    return Parsed(message, payload, dedupe_key(topic, payload))


class _Batch:
    """One SQS batch: its messages parsed once, completed keys looked up once, its deadline,
    and (completions per batch) the completions it has yet to write."""

    __slots__ = ("done", "longest_s", "margin_s", "parsed", "pending", "remaining_ms")

    def __init__(self, done: set[str] | None, parsed: dict[str, Parsed | str],
                 remaining_ms: Callable[[], int] | None, margin_s: float,
                 pending: list[tuple[str, str, str]] | None) -> None:
        # completed before the batch or during it (None: the lookup failed; each record
        # asks for its own)
        self.done = done
        self.parsed = parsed
        self.remaining_ms = remaining_ms
        self.margin_s = margin_s
        self.longest_s = 0.0
        self.pending = pending  # None: each completion is written as its record finishes

    def out_of_time(self) -> bool:
        if self.remaining_ms is None:
            return False
        return self.remaining_ms() / 1000 < self.margin_s + self.longest_s


def carried(attributes: dict[str, Any] | None) -> dict[str, str]:
    """The producer's trace context a record's message attributes carry (empty: none)."""
    found = {name: str((attributes or {}).get(name, {}).get("stringValue") or "")
             for name in ("traceparent", "tracestate")}
    return {k: v for k, v in found.items() if v} if found["traceparent"] else {}


def _unarmed(name: str) -> None:
    return None


class Consumer:
    def __init__(self, topic: str, handler: Handler, services: Services, *,
                 sqs: Sqs | None = None, registry: Registry | None = REGISTRY,
                 max_attempts: int = MAX_ATTEMPTS, margin_s: float = DEADLINE_MARGIN_S,
                 sleep: Callable[[float], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 completions: Completions | None = None) -> None:
        self.topic = check_topic(topic)
        # Per batch only where the topic's handler is idempotent: a crash before the
        # batch's one write runs its finished records again.
        self.completions: Completions = completions or (
            "batch" if get_topic(topic).idempotent else "record")
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
        # Each crash point costs an environment lookup; unarmed, the consumer skips them.
        self.crash_point = crash_point if os.environ.get(CRASH_ENV) else _unarmed
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
        if parsed is None:
            parsed = parse(body, self.topic)
        if isinstance(parsed, str):
            return self._reject(inbound, body, parsed)
        message = parsed.message
        reason = self.signer.check(message, parsed.payload)
        if reason is None and message.get("topic") != self.topic:
            reason = f"message topic {message.get('topic')!r} is not {self.topic!r}"
        if reason is not None:
            return self._reject(inbound, body, reason)
        self.crash_point("consumer.after_verify")

        key = parsed.key
        batch = self._batch
        if batch is not None and batch.done is not None:  # looked up with the batch
            completed = key in batch.done
        else:
            completed = self.keys.done(key)
        if completed:
            logger.info(f"[{self._context}] already completed; acknowledged",
                        extra={"messageId": inbound.message_id, "dedupeKey": key})
            return _DUPLICATE
        try:
            self.handler(message, inbound)
        except TransientStoreError as exc:  # the store's outage, not the message's failure
            return self._outage(inbound, exc)
        except Exception as exc:  # noqa: BLE001 - any handler failure is retried, then dead-lettered
            return self._failed(message, inbound, exc)
        self.crash_point("consumer.after_handler")
        if batch is not None:
            if batch.done is not None:
                batch.done.add(key)
            if batch.pending is not None:  # written once, when the batch ends
                batch.pending.append((key, self.topic, inbound.message_id))
                return _DONE
        # Recorded as soon as it completed: a batch cut short later does not run it again.
        self.keys.complete(key, self.topic, inbound.message_id)
        self.crash_point("consumer.after_complete")
        return _DONE

    def _outage(self, inbound: InboundMessage, exc: TransientStoreError) -> Decision:
        self.services.reporter.error(self._context, exc, during="store outage",
                                     messageId=inbound.message_id,
                                     deliveryCount=inbound.delivery_count)
        return Decision(MessageOutcome.WAITING, OUTAGE_DELAY_S, str(exc))

    def _failed(self, message: dict[str, Any], inbound: InboundMessage,
                exc: Exception) -> Decision:
        reporter = self.services.reporter
        reporter.error(self._context, exc, messageId=inbound.message_id,
                       deliveryCount=inbound.delivery_count)
        if inbound.delivery_count < self.max_attempts:
            return Decision(MessageOutcome.RETRY, backoff_s(inbound.delivery_count), str(exc))
        self._dead_letter(dead_letter_summary(message, inbound, exc, js_iso(self._now())),
                          idempotency_key(message))
        reporter.metric("QueueDeadLettered", 1, topic=self.topic)
        return Decision(MessageOutcome.DEAD_LETTERED, reason=str(exc))

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
        from sluice.store.db import utcnow

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
        # Only a batch with a deadline times its records.
        timed = batch if batch is not None and batch.remaining_ms is not None else None
        if timed is not None and timed.out_of_time():
            raise OutOfTime(f"{timed.remaining_ms() if timed.remaining_ms else 0} ms left; "
                            "not started")
        raw = record.raw_event  # the event's own dict: no wrapper objects per field
        attribute = (raw.get("messageAttributes") or {}).get(IDEMPOTENCY_ATTRIBUTE) or {}
        message_id = raw["messageId"]
        inbound = InboundMessage(
            message_id, self.topic,
            int((raw.get("attributes") or {}).get("ApproximateReceiveCount") or 1),
            attribute.get("stringValue"), None, raw.get("receiptHandle"))
        started = self.clock() if timed is not None else 0.0
        with self._span(inbound, raw.get("messageAttributes")) as span:
            decision = self._handled(record, raw, inbound, batch, timed, started)
            span.set("sluice.outcome", decision.outcome.value)
        if decision.outcome is MessageOutcome.WAITING:
            self._wait_for_store(record, raw, attribute.get("stringValue"), decision)
            return
        if decision.outcome is MessageOutcome.RETRY:
            self._hold_back(record, decision.delay_s)
            raise RetryLater(f"retry in {decision.delay_s}s: {decision.reason}")

    def _span(self, inbound: InboundMessage,
              attributes: dict[str, Any] | None = None) -> AbstractContextManager[trace.Span]:
        """A record's ``process`` span: a child of its producer's span when the message
        carries the producer's context (SQS message attributes), linked to its batch."""
        if not trace.enabled():
            return trace.OFF
        parent = carried(attributes) or None
        return trace.span(f"process {self.topic}", kind="consumer", parent=parent,
                          links={"batch": trace.carrier()} if parent else None, attributes={
                              "messaging.system": SYSTEM_SQS if inbound.receipt_handle
                              else SYSTEM_SLUICE,
                              "messaging.operation.type": "process",
                              "messaging.destination.name": self.topic,
                              "messaging.message.id": inbound.message_id,
                              "sluice.topic": self.topic, "sluice.attempt": inbound.delivery_count})

    def _handled(self, record: SQSRecord, raw: dict[str, Any], inbound: InboundMessage,
                 batch: _Batch | None, timed: _Batch | None, started: float) -> Decision:
        message_id = inbound.message_id
        try:
            decision = self.handle(raw.get("body") or "", inbound,
                                   batch.parsed.get(message_id) if batch else None)
        except DeadLetterFailed:
            # Not acknowledged: the send is tried again on the next delivery.
            self._hold_back(record, backoff_s(inbound.delivery_count))
            raise
        except TransientStoreError as exc:  # the keys' or the quarantine's store is down
            decision = self._outage(inbound, exc)
        except Exception as exc:  # anything else: report, retry on the queue's timeout
            self.services.reporter.error(self._context, exc, during="consume",
                                         messageId=record.message_id)
            raise
        finally:
            if timed is not None:
                timed.longest_s = max(timed.longest_s, self.clock() - started)
        return decision

    def _wait_for_store(self, record: SQSRecord, raw: dict[str, Any], key: str | None,
                        decision: Decision) -> None:
        """The message waits for the store as a delayed copy of itself, and this delivery
        is acknowledged (no attempt counted). If the copy cannot be sent, the delivery is
        held back and fails instead: never acknowledged without its copy on the queue."""
        try:
            url = self.sqs.url_from_arn(record.event_source_arn)
            copy_id = self.sqs.send(url, raw.get("body") or "", key, delay_s=decision.delay_s,
                                    trace=carried(raw.get("messageAttributes")))
        except Exception as exc:
            self.services.reporter.error(self._context, exc, during="outage copy",
                                         messageId=record.message_id)
            self._hold_back(record, decision.delay_s)
            raise RetryLater(f"store down and the copy not sent: {exc}") from exc
        logger.warning(f"[{self._context}] a store is down; the message waits "
                       f"{decision.delay_s} s as {copy_id}, no attempt counted",
                       extra={"messageId": record.message_id, "copyId": copy_id,
                              "reason": decision.reason})
        self.services.reporter.metric("QueueOutageWaits", 1, topic=self.topic)

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

        The batch's completed keys are read in one query before it. Completions are
        written as each record finishes, or (``completions="batch"``) in one write when
        the batch ends, however it ends: done, stopped at its deadline, or failed. When
        Lambda's remaining time runs short, the records not yet started are reported as
        item failures and delivered again.
        """
        topic = self.topic
        parsed: dict[str, Parsed | str] = {}
        twice: set[str] = set()
        for record in event.get("Records") or ():
            message_id = record.get("messageId", "")
            if message_id in parsed:
                twice.add(message_id)
            parsed[message_id] = parse(record.get("body") or "", topic)
        # A message id seen twice in one batch is parsed again from its own record's body.
        for message_id in twice:
            del parsed[message_id]
        keys = [p.key for p in parsed.values() if type(p) is Parsed]
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        try:
            done: set[str] | None = self.keys.done_many(keys)
        except TransientStoreError as exc:  # each record asks again (and waits if it must)
            self.services.reporter.error(self._context, exc, during="completed keys")
            done = None
        batch = self._batch = _Batch(done, parsed, remaining,
                                     self.margin_s,
                                     [] if self.completions == "batch" else None)
        try:
            # the batch links to each message's producer (up to MAX_LINKS of them)
            links = {f"message {record.get('messageId')}": carried(
                record.get("messageAttributes")) for record in
                (event.get("Records") or ())[:MAX_LINKS]} if trace.enabled() else None
            with trace.span(f"receive {topic}", kind="consumer", links=links, attributes={
                    "messaging.system": SYSTEM_SQS, "messaging.operation.type": "receive",
                    "messaging.destination.name": topic, "sluice.topic": topic,
                    "messaging.batch.message_count": len(event.get("Records") or ())}) as span:
                try:
                    result: dict[str, Any] = process_partial_response(
                        event=event, record_handler=self._record, processor=self._processor,
                        context=context)  # type: ignore[assignment]
                finally:
                    self._batch = None
                    if batch.pending:
                        self._complete_batch(batch.pending)
                span.set("sluice.failed", len(result.get("batchItemFailures") or ()))
            self.crash_point("consumer.before_response")
            return result
        finally:
            trace.flush()

    def _complete_batch(self, done: list[tuple[str, str, str]]) -> None:
        """The batch's completions, in one write. If it fails the invocation fails and the
        whole batch is delivered again (its handler is idempotent; that is why it may)."""
        try:
            self.keys.complete_many(done)
        except Exception as exc:
            self.services.reporter.error(self._context, exc, during="batch completion",
                                         records=len(done))
            raise
        self.crash_point("consumer.after_complete")

    # --- in process (not provisioned) ----------------------------------------

    def deliver_local(self, body: str, message_id: str) -> Decision:
        decision = Decision(MessageOutcome.RETRY)
        parsed = parse(body, self.topic)
        for attempt in range(1, self.max_attempts + 1):
            inbound = InboundMessage(message_id, self.topic, attempt)
            with self._span(inbound) as span:
                decision = self.handle(body, inbound, parsed)
                span.set("sluice.outcome", decision.outcome.value)
            if decision.outcome is not MessageOutcome.RETRY:
                break
            logger.warning(f"[{self._context}] retrying in process",
                           extra={"messageId": message_id, "attempt": attempt,
                                  "backoffSeconds": decision.delay_s})
            if self.sleep is not None:
                self.sleep(decision.delay_s)
        return decision
