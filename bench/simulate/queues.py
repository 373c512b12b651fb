"""The push queue: ``rss.ingest`` through a simulated SQS, consumed by the real consumer.

Odd seeds deploy with the ``rssQueuePipeline`` flag on and ``SLUICE_QUEUE_MODE=sqs`` (even
seeds tick inline, as the regression seeds always did): the tick publishes the global
refresh and one signed message per due build through the real ``Publisher`` and ``Sqs``
wrapper, into this stand-in of the SQS service (the boto3 client's methods the wrapper
calls). Lambda's event source mapping is simulated too: a message visible at a moment is
handed to the real consumer (``Consumer.lambda_handler``, as ``functions/consumers.py``
builds it) in a batch of up to ``BATCH_SIZE`` records shaped like AWS's (the samples in
``tests/events/``), with a context whose time left runs on the simulated clock. What the
handler reports as item failures stays on the queue, visible when the consumer's
visibility change says (its ``min(300, 2^n)`` backoff) or after the queue's visibility
timeout; the rest is deleted; a handler that raises (a crash) leaves the whole batch for
the timeout; a message received ``MAX_RECEIVES`` times moves to ``<topic>-dlq`` (the
redrive policy's backstop).

SQS delivers at least once: now and then (``REDELIVER_EVERY``) a deleted message comes
once more, as a delete lost on its way would. With ``handler_faults`` (``--limits``) some
messages fail for their own sake: the handler's dependency fails on a message's first
deliveries (``FAULTY``: every ``FAULT_EVERY``-th message first seen fails its first 2 or 4
deliveries, fewer than the consumer's 5 attempts), raised in the handler's place as an
error of its own, not a store's. With ``--limits`` the endpoint is throttled in the world's
``sqs_throttled`` windows: one send a minute is answered, the others time out unanswered
(``ReadTimeoutError``), recorded by the stand-in. Invariants (``queue_*``):

- ``queue_nothing_lost``: every message sent is, within ``SETTLE_WITHIN`` while the
  store and Redis are up, deleted after the consumer took it, or on a ``-dlq`` with a
  reason; and its content (its batch id: a copy waiting for the store has the same) has
  been handled by then, its handler run to its end;
- ``queue_backoff``: each visibility the consumer sets for a retry is ``min(300, 2^n)``
  seconds for the n-th receive (judged against the documented formula, never the
  consumer's own);
- ``queue_once``: a message the consumer completed is not handled again (a redelivery is
  answered as a duplicate), except after a crash before its batch's completions were
  written (the documented replay of an idempotent topic's batch);
- ``queue_no_attempt_burned``: no attempt is counted against a message for an outage: no
  invocation fails, no retry is held back but after a failure of the message's own,
  nothing is dead-lettered before its own failures reached the consumer's 5 attempts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

BATCH_SIZE = 10  # serverless.yml: batchSize
VISIBILITY_S = 360  # custom.queues.visibilityTimeout
MAX_RECEIVES = 10  # custom.queues.maxReceiveCount
CONSUMER_TIMEOUT_S = 60  # custom.queues.consumerTimeout
REDELIVER_EVERY = 37  # every 37th deleted message comes once more
SETTLE_WITHIN = timedelta(hours=6)
MAX_ATTEMPTS = 5  # docs/queues.md: a message is dead-lettered at its fifth failed delivery
FAULT_EVERY = 9  # with handler faults: the 9th, 18th... content first seen fails at first
FAULTY = {4: 2, 8: 4}  # (ordinal % FAULT_EVERY) -> its deliveries that fail (fewer than 5)
# with handler faults: the POISON-th content first seen fails every delivery (its dependency
# refuses it for good): the consumer dead-letters it at its fifth failure
POISON = 15
# with handler faults: every LATE_EVERY-th copy SQS delivers once more comes back only
# LATE_BY later (a copy left on a server that was away, within SQS's four-day retention)
LATE_EVERY = 2
LATE_BY = timedelta(hours=30)
# in a throttled window (--limits), the endpoint answers one send per this long; the rest
# of a burst (the tick's per-build messages after its global one) time out
THROTTLE_GAP = timedelta(minutes=1)


class HandlerFault(Exception):
    """A handler's own failure (its dependency failed), not a store's outage."""
ACCOUNT = "123456789012"
REGION = "eu-north-1"


class QueueDoesNotExist(Exception):
    pass


@dataclass
class Message:
    id: str
    body: str
    key: str | None
    sent_at: datetime
    visible_at: datetime
    receives: int = 0
    receipt: str = ""
    deleted: bool = False
    reasons: list[str] = field(default_factory=list)
    owed_from: datetime | None = None  # a late copy is owed from when it comes back


class SimCloudWatch:
    """CloudWatch as the console's queue cards read it (``get_metric_statistics`` of
    ``AWS/SQS`` ``ApproximateAgeOfOldestMessage``), from the SQS stand-in: a point a minute
    old, as the metric lags."""

    def __init__(self, sqs: SimSqsClient) -> None:
        self.sqs = sqs

    def get_metric_statistics(self, *, Namespace: str, MetricName: str,
                              Dimensions: list[dict[str, str]], EndTime: datetime,
                              **kwargs: Any) -> dict[str, Any]:
        from sluice.ops.overview import OLDEST_AGE_METRIC

        if Namespace != "AWS/SQS" or MetricName != OLDEST_AGE_METRIC:
            raise ValueError(f"the CloudWatch stand-in has no {Namespace} {MetricName}")
        name = next(d["Value"] for d in Dimensions if d["Name"] == "QueueName")
        if name not in self.sqs.queues:
            return {"Datapoints": []}
        return {"Datapoints": [{"Timestamp": EndTime - timedelta(minutes=1),
                                "Maximum": self.sqs.oldest_age_s(name)}]}


@dataclass
class Queue:
    name: str
    messages: list[Message] = field(default_factory=list)

    def visible(self, now: datetime) -> list[Message]:
        self.compact()
        return [m for m in self.messages if m.visible_at <= now]

    def next_visible(self) -> datetime | None:
        self.compact()
        return min((m.visible_at for m in self.messages), default=None)

    def compact(self) -> None:
        """Deleted messages leave the list: a year of them made every receive a scan of
        every message ever sent. (A redelivery un-deletes a message of the batch just
        taken, which is still on the list: nothing compacts between the two.)"""
        self.messages = [m for m in self.messages if not m.deleted]


class SimSqsClient:
    """The SQS service as the ``Sqs`` wrapper calls it (boto3's method names and shapes)."""

    class exceptions:
        QueueDoesNotExist = QueueDoesNotExist

    def __init__(self, now: Callable[[], datetime], ids: Callable[[], str],
                 names: list[str]) -> None:
        self.now = now
        self.ids = ids
        self.queues = {name: Queue(name) for name in names}
        self.by_receipt: dict[str, Message] = {}
        self.visibility_set: list[tuple[Message, int, int]] = []  # (message, receives, seconds)
        self.unavailable = False  # the service refuses calls (an outage of ours)
        # windows in which the endpoint answers at most one send per THROTTLE_GAP (the rest
        # time out, unanswered); the service's own record of the sends it left unanswered
        self.throttled: list[Any] = []
        self.unanswered: list[tuple[datetime, str]] = []  # (when, queue url)
        self._answered_at: datetime | None = None

    @staticmethod
    def url_of(name: str) -> str:
        return f"https://sqs.{REGION}.amazonaws.com/{ACCOUNT}/{name}"

    @staticmethod
    def arn_of(name: str) -> str:
        return f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}"

    def _queue(self, url: str) -> Queue:
        return self.queues[url.rsplit("/", 1)[-1]]

    def get_queue_url(self, QueueName: str) -> dict[str, str]:
        if QueueName not in self.queues:
            raise QueueDoesNotExist(QueueName)
        return {"QueueUrl": self.url_of(QueueName)}

    def send_message(self, QueueUrl: str, MessageBody: str,
                     MessageAttributes: dict[str, Any], DelaySeconds: int = 0,
                     ) -> dict[str, str]:
        key = (MessageAttributes.get("idempotencyKey") or {}).get("StringValue")
        now = self.now()
        if any(w.start <= now < w.end for w in self.throttled):
            if self._answered_at is not None and now - self._answered_at < THROTTLE_GAP:
                from botocore.exceptions import ReadTimeoutError  # type: ignore[import-untyped]

                self.unanswered.append((now, QueueUrl))
                raise ReadTimeoutError(endpoint_url=QueueUrl)
            self._answered_at = now
        message = Message(self.ids(), MessageBody, key, now,
                          now + timedelta(seconds=DelaySeconds))
        self._queue(QueueUrl).messages.append(message)
        return {"MessageId": message.id}

    def change_message_visibility(self, QueueUrl: str, ReceiptHandle: str,
                                  VisibilityTimeout: int) -> None:
        message = self.by_receipt[ReceiptHandle]
        self.visibility_set.append((message, message.receives, VisibilityTimeout))
        message.visible_at = self.now() + timedelta(seconds=VisibilityTimeout)

    def delete_message(self, QueueUrl: str, ReceiptHandle: str) -> None:
        self.by_receipt[ReceiptHandle].deleted = True

    def get_queue_attributes(self, QueueUrl: str,
                             AttributeNames: list[str]) -> dict[str, Any]:
        queue, now = self._queue(QueueUrl), self.now()
        live = [m for m in queue.messages if not m.deleted]
        return {"Attributes": {
            "ApproximateNumberOfMessages": str(sum(m.visible_at <= now for m in live)),
            "ApproximateNumberOfMessagesNotVisible": str(sum(m.visible_at > now for m in live)),
            "ApproximateNumberOfMessagesDelayed": "0"}}

    def oldest_age_s(self, name: str) -> float:
        """CloudWatch's ``ApproximateAgeOfOldestMessage`` of ``name``, in seconds."""
        now = self.now()
        live = [m for m in self.queues[name].messages if not m.deleted]
        return max(((now - m.sent_at).total_seconds() for m in live), default=0.0)

    # --- the event source mapping -------------------------------------------------

    def take(self, name: str) -> list[Message]:
        """The next batch Lambda would receive from ``name`` (each message's receive count
        and visibility updated as SQS does); messages past their last receive move to the
        dead-letter queue instead."""
        queue, now = self.queues[name], self.now()
        batch = []
        for message in sorted(queue.visible(now), key=lambda m: (m.visible_at, m.sent_at)):
            if message.receives >= MAX_RECEIVES:
                message.deleted = True
                dlq = self.queues[f"{name}-dlq"]
                dlq.messages.append(Message(message.id, message.body, message.key,
                                            message.sent_at, now, reasons=["maxReceiveCount"]))
                continue
            message.receives += 1
            message.receipt = f"{message.id}#{message.receives}"
            message.visible_at = now + timedelta(seconds=VISIBILITY_S)
            self.by_receipt[message.receipt] = message
            batch.append(message)
            if len(batch) == BATCH_SIZE:
                break
        return batch

    def event(self, name: str, batch: list[Message]) -> dict[str, Any]:
        return {"Records": [{
            "messageId": m.id, "receiptHandle": m.receipt, "body": m.body,
            "attributes": {"ApproximateReceiveCount": str(m.receives),
                           "SentTimestamp": str(int(m.sent_at.timestamp() * 1000)),
                           "SenderId": f"AROASIM:{name}"},
            "messageAttributes": ({"idempotencyKey": {
                "stringValue": m.key, "stringListValues": [], "binaryListValues": [],
                "dataType": "String"}} if m.key else {}),
            "md5OfBody": "", "eventSource": "aws:sqs", "eventSourceARN": self.arn_of(name),
            "awsRegion": REGION} for m in batch]}


class LambdaContext:
    """What the consumer reads of Lambda's context: the time left, on the simulated clock."""

    def __init__(self, now: Callable[[], datetime], timeout_s: int) -> None:
        self._now = now
        self._ends = now() + timedelta(seconds=timeout_s)
        self.function_name = "sluice-sim-rssIngest"
        self.aws_request_id = "sim"

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._ends - self._now()).total_seconds() * 1000))


def failures_of(answer: Any) -> set[str]:
    items = (answer or {}).get("batchItemFailures") or []
    return {str(item.get("itemIdentifier")) for item in items}


def batch_id_of(body: str) -> str:
    """A message's identity for ``queue_once``: its batch id (one per publish)."""
    try:
        return str(json.loads(body).get("batchId"))
    except (ValueError, AttributeError):
        return body[:64]


class PushQueue:
    """The ``rss.ingest`` queue of a pipeline seed: the stand-in service, the real consumer
    fed by the simulated event source mapping, and the ``queue_*`` invariants."""

    TOPIC = "rss.ingest"

    def __init__(self, services: Any, now: Callable[[], datetime], judge: Any,
                 log: Callable[[str], None], windows: Any, end: datetime, *,
                 handler_faults: bool = False) -> None:
        from sluice.queues import runtime
        from sluice.queues.publish import Publisher
        from sluice.queues.sqs import Sqs
        from sluice.queues.topics import dlq_name, queue_name

        self.now, self.judge, self.log = now, judge, log
        self.windows, self.end = windows, end  # the store and Redis outages
        prefix = services.settings.queue_prefix
        self.name = queue_name(prefix, self.TOPIC)
        self.client = SimSqsClient(now, self._message_id, [self.name, dlq_name(prefix,
                                                                                self.TOPIC)])
        sqs = Sqs(self.client, prefix)
        services.__dict__["cloudwatch"] = SimCloudWatch(self.client)  # the cards' oldest age
        runtime._PUBLISHERS[services] = {False: Publisher(services.settings, sqs=sqs)}
        self.consumer = runtime.consumers_for(services, sqs=sqs, registry=None,
                                              topics=(self.TOPIC,))[self.TOPIC]
        handler = self.consumer.handler
        self.completed: set[str] = set()  # batch ids of messages acknowledged as done
        self.deleted = 0
        self.checked_visibility = 0
        self.batches = 0
        self.handler_faults = handler_faults
        self.seen: dict[str, int] = {}  # batch id -> its ordinal, first seen
        self.unhandled: dict[str, datetime] = {}  # batch id -> first sent, until handled
        self.faults_left: dict[str, int] = {}  # batch id -> its deliveries still to fail
        self.own_failures: dict[str, int] = {}  # batch id -> deliveries failed for its sake
        self.failed_at: set[tuple[str, int]] = set()  # (message id, receive) it failed on
        # message id -> its receives an invocation crashed on (SQS counts each one)
        self.crashed: dict[str, int] = {}
        self.settled: set[str] = set()  # batch ids reported or dead-lettered
        self.raised: dict[str, tuple[str, int]] = {}  # batch id -> last error raised, delivery
        self.sent: dict[str, dict[str, Any]] = {}  # batch id -> the message as first sent
        self.redelivered = 0

        def counted(message: dict[str, Any], inbound: Any) -> None:
            batch_id = str(message.get("batchId"))
            if batch_id in self.completed:
                self.judge.fail("queue_once", self.now(),
                                f"{self.TOPIC} message {inbound.message_id} (batch {batch_id}) "
                                "was completed and acknowledged, and is handled again")
            if self.faults_left.get(batch_id):
                self.faults_left[batch_id] -= 1
                self.own_failures[batch_id] = self.own_failures.get(batch_id, 0) + 1
                self.failed_at.add((inbound.message_id, inbound.delivery_count))
                error = (f"simulated: the handler's dependency failed for batch {batch_id} "
                         f"(delivery {inbound.delivery_count})")
                self.raised[batch_id] = (error, inbound.delivery_count)
                raise HandlerFault(error)
            handler(message, inbound)
            self.just_handled.add(batch_id)
            self.unhandled.pop(batch_id, None)

        self.consumer.handler = counted
        self.just_handled: set[str] = set()  # batch ids whose handler returned, this batch

    def _first_seen(self, message: Message) -> None:
        batch_id = batch_id_of(message.body)
        if batch_id in self.seen:
            return
        self.seen[batch_id] = ordinal = len(self.seen) + 1
        self.unhandled[batch_id] = message.sent_at
        self.sent[batch_id] = _without_signature(message.body)
        if self.handler_faults:
            self.faults_left[batch_id] = (MAX_ATTEMPTS if ordinal == POISON
                                          else FAULTY.get(ordinal % FAULT_EVERY, 0))

    def _message_id(self) -> str:
        import uuid

        return str(uuid.uuid4())

    def arm(self, crash_point: Callable[[str], None]) -> None:
        """The consumer's crash points go through the simulator's (it reads them once)."""
        self.consumer.crash_point = crash_point

    def next_visible(self) -> datetime | None:
        return self.client.queues[self.name].next_visible()

    def consume(self, crash: type[BaseException]) -> str:
        """One invocation of the consumer function with the next batch; its log line."""
        batch = self.client.take(self.name)
        if not batch:
            return ""
        self.batches += 1
        for message in batch:
            self._first_seen(message)
        event = self.client.event(self.name, batch)
        context = LambdaContext(self.now, CONSUMER_TIMEOUT_S)
        self.just_handled = set()
        try:
            answer = self.consumer.lambda_handler(event, context)
        except crash as stopped:
            for message in batch:  # the function died: SQS counts this receive of each
                self.crashed[message.id] = self.crashed.get(message.id, 0) + 1
            return f"rss.ingest consumer: crashed at {stopped} with {len(batch)} message(s)"
        except Exception as exc:  # noqa: BLE001 - the invocation failed: the batch comes back
            if all((m.id, m.receives) in self.failed_at for m in batch):
                # every record failed for its own sake: the batch processor then fails the
                # invocation (as documented), and each message returns after its backoff
                self._check_visibility()
                return f"rss.ingest consumer: all {len(batch)} failed, to retry"
            self.judge.fail("queue_no_attempt_burned", self.now(),
                            f"the consumer's invocation failed ({type(exc).__name__}: "
                            f"{str(exc)[:200]}): SQS counts a receive against each of its "
                            f"{len(batch)} message(s), for no fault of theirs")
            return (f"rss.ingest consumer: failed ({type(exc).__name__}) with {len(batch)} "
                    "message(s)")
        failed = failures_of(answer)
        for message in batch:
            if message.id in failed:
                continue
            message.deleted = True  # Lambda's event source mapping deletes what succeeded
            if batch_id_of(message.body) in self.just_handled:  # not a copy left waiting
                self.completed.add(batch_id_of(message.body))
            self.deleted += 1
            if self.deleted % REDELIVER_EVERY == 0:  # at least once: it comes again
                message.deleted = False
                message.visible_at = self.now() + timedelta(minutes=2)
                self.redelivered += 1
                if self.handler_faults and self.redelivered % LATE_EVERY == 0:
                    message.visible_at = message.owed_from = self.now() + LATE_BY
        self._check_visibility()
        return (f"rss.ingest consumer: {len(batch) - len(failed)} done, {len(failed)} to "
                "retry")

    def _check_visibility(self) -> None:
        for message, receives, seconds in self.client.visibility_set[self.checked_visibility:]:
            if (message.id, receives) not in self.failed_at:
                # the handler failed here only as a store's outage or a crash would make it
                # (a crash changes no visibility): a retry held back is an attempt counted
                # for an outage
                self.judge.fail("queue_no_attempt_burned", self.now(),
                                f"a retry was counted against an rss.ingest message (receive "
                                f"{receives}, held {seconds} s) that failed for no fault of "
                                "its own")
            if seconds != min(300, 2 ** receives):
                self.judge.fail("queue_backoff", self.now(),
                                f"a retry after receive {receives} held for {seconds} s, not "
                                f"min(300, 2^{receives})")
        self.checked_visibility = len(self.client.visibility_set)

    def check(self, owed_at: Callable[..., datetime | None]) -> None:
        """``queue_nothing_lost`` and ``queue_no_attempt_burned`` (see the module)."""
        now = self.now()
        for message in self.client.queues[self.name].messages:
            if message.deleted:
                continue
            due = owed_at(message.owed_from or message.sent_at, self.windows, self.end,
                          SETTLE_WITHIN)
            if due is not None and due <= now:
                self.judge.fail("queue_nothing_lost", now,
                                f"{self.TOPIC} message {message.id} sent "
                                f"{message.sent_at:%Y-%m-%d %H:%M} is still on the queue "
                                f"after {message.receives} receive(s)")
                message.deleted = True  # reported once
        for batch_id, sent_at in list(self.unhandled.items()):
            if batch_id in self.settled:
                del self.unhandled[batch_id]
                continue
            due = owed_at(sent_at, self.windows, self.end, SETTLE_WITHIN)
            if due is not None and due <= now:
                self.judge.fail("queue_nothing_lost", now,
                                f"{self.TOPIC} content of batch {batch_id} (sent "
                                f"{sent_at:%Y-%m-%d %H:%M}) was never handled")
                del self.unhandled[batch_id]  # reported once
        dlq = self.client.queues[f"{self.name}-dlq"]
        for message in dlq.messages:
            if not message.deleted:
                batch_id = _original_batch(message.body)
                self.settled.add(batch_id)
                self._dead_letter_kept(message, batch_id)
                original = _original_id(message)
                own, crashed = receives_charged(original, self.failed_at, self.crashed)
                if own + crashed < MAX_ATTEMPTS:
                    self.judge.fail("queue_no_attempt_burned", now,
                                    f"{self.TOPIC} message {original} was dead-lettered "
                                    f"({', '.join(message.reasons) or _reason(message.body)})"
                                    f" after {own} failure(s) of its own and {crashed} "
                                    "crashed receive(s): only its fifth receive counted for "
                                    "its own failure or a crash of the function holding it "
                                    "dead-letters it")
                message.deleted = True


    def _dead_letter_kept(self, message: Message, batch_id: str) -> None:
        """``queue_nothing_lost``'s "on a -dlq with a reason": a dead letter the consumer
        wrote (not one the redrive policy moved) is the summary docs/queues.md describes,
        judged against what the world sent and raised: the message as sent, its topic, the
        delivery it failed on and the error the handler raised there."""
        if message.reasons:  # moved by the redrive policy: the message itself, no summary
            return
        try:
            summary = json.loads(message.body)
        except ValueError:
            summary = None
        if not isinstance(summary, dict):
            summary = {}
        error, delivery = self.raised.get(batch_id, ("", 0))
        wrong = [name for name, ok in (
            ("originalMessage", isinstance(summary.get("originalMessage"), dict)
             and _without_signature(json.dumps(summary["originalMessage"]))
             == self.sent.get(batch_id)),
            ("originalTopic", summary.get("originalTopic") == self.TOPIC),
            ("deliveryCount", summary.get("deliveryCount") == delivery),
            ("errorMessage", bool(error) and error in str(summary.get("errorMessage") or "")),
            ("failedAt", isinstance(summary.get("failedAt"), str)),
            ("originalMessageId", isinstance(summary.get("originalMessageId"), str)),
        ) if not ok]
        if wrong:
            self.judge.fail("queue_nothing_lost", self.now(),
                            f"{self.TOPIC} batch {batch_id} was dead-lettered without "
                            f"{', '.join(wrong)} as the world sent and raised it "
                            f"({message.body[:160]!r})")


def _without_signature(body: str) -> dict[str, Any]:
    """A message's content as the world sent it, without the signature (a redrive signs
    again) and the fields the publisher stamps."""
    try:
        data = json.loads(body)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if k not in ("signature",)}


def receives_charged(message_id: str, failed_at: set[tuple[str, int]],
                     crashed: dict[str, int]) -> tuple[int, int]:
    """The receives of SQS message ``message_id`` that may count towards its dead-lettering:
    those it failed on for its own sake, and those an invocation holding it crashed on (SQS
    counts a receive the function died in; a crash holding another message explains
    nothing about this one, and an outage copy is a message of its own)."""
    own = sum(1 for failed, _ in failed_at if failed == message_id)
    return own, crashed.get(message_id, 0)


def _original_id(message: Message) -> str:
    """The SQS message a dead letter stands for: its summary's ``originalMessageId``, or
    the message itself (moved by the redrive policy)."""
    if message.reasons:
        return message.id
    try:
        summary = json.loads(message.body)
    except ValueError:
        return message.id
    original = summary.get("originalMessageId") if isinstance(summary, dict) else None
    return str(original) if isinstance(original, str) else message.id


def _original_batch(body: str) -> str:
    """The batch id of a dead letter: its summary's ``originalMessage``, or the message
    itself (moved by the redrive policy)."""
    try:
        summary = json.loads(body)
    except ValueError:
        return body[:64]
    original = summary.get("originalMessage") if isinstance(summary, dict) else None
    return str((original if isinstance(original, dict) else summary).get("batchId"))


def _reason(body: str) -> str:
    try:
        summary = json.loads(body)
    except ValueError:
        return "no summary"
    return str(summary.get("errorMessage") or "no reason")[:200]
