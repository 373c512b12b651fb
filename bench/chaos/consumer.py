"""The push-queue consumer in the kill sweep: its scenario, and the process it kills.

``python -m bench.chaos.consumer`` is one pass of an SQS event source mapping over a
topic, in one process with the function: receive up to 10 messages (each receive
counts), hand them to ``Consumer.lambda_handler`` as an SQS event, delete those not
reported as item failures (none when the function raised or died), make the failed ones
visible again at once (their backoff, without the wait) and repeat until nothing is
visible. The receipt handles are appended to ``CHAOS_HANDLES`` as they are received, so
the harness can make whatever a killed pass left in flight visible again (a lapsed
visibility timeout, without the wait). A batch is received with a short visibility that
becomes the queue's once its handles are on file, so a kill in between still lets the
batch come back soon.

The handler has an observable, keyed effect: a row per message keyed by its signed
``batchId`` (written once whatever happens), and a journal row per application, noting
whether the consumer had already recorded the message as completed (it never should).
A message with ``"poison": true`` always fails.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.core.services import Services
from sluice.queues.consumer import Consumer, Handler, InboundMessage
from sluice.queues.keys import CompletedKeys, dedupe_key
from sluice.store.db import utcnow

if TYPE_CHECKING:
    from bench.chaos.kill import Counts

TOPIC = "rss.ingest"
QUEUE_SECRET = "chaos-queue-secret-0123456789abcdef"
EFFECT = "chaos-consumer:effect:"
APPLIED = "chaos-consumer:applied:"
MODE_ENV = "CHAOS_COMPLETIONS"
HANDLES_ENV = "CHAOS_HANDLES"
UNFILED_VISIBILITY_S = 8  # until the batch's receipt handles are on file
VISIBILITY_S = 300
MAX_RECEIVES_PER_PASS = 60  # a message that never settles ends the pass (it is then stuck)


class Poison(RuntimeError):
    """This message always fails."""


def effect_handler(services: Services) -> Handler:
    keys = CompletedKeys(services.db)

    def handle(message: dict[str, Any], inbound: InboundMessage) -> None:
        if message.get("poison"):
            raise Poison(f"poison message {message['batchId']}")
        key = message["batchId"]
        repeat = keys.done(dedupe_key(TOPIC, message))
        now = utcnow()
        with services.db.transaction() as tx:
            tx.execute("INSERT INTO platform_state (key, value, updated_at) "
                       "VALUES (:key, :value, :now) ON CONFLICT (key) DO NOTHING",
                       {"key": EFFECT + key, "value": tx.json({"messageId": inbound.message_id}),
                        "now": now})
            tx.execute("INSERT INTO platform_state (key, value, updated_at) "
                       "VALUES (:key, :value, :now)",
                       {"key": f"{APPLIED}{key}:{uuid.uuid4().hex}",
                        "value": tx.json({"afterCompletion": repeat}), "now": now})

    return handle


@contextmanager
def moto_sqs() -> Iterator[dict[str, str]]:
    """SQS on a moto server on loopback; the environment that points boto3 at it."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "eu-north-1", "AWS_REGION": "eu-north-1",
               "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    finally:
        server.stop()


class ConsumerKill:
    """A topic's consumer killed mid-batch, then SQS's at-least-once redelivery.

    Seeded: ``GOOD`` signed messages whose handler writes a row keyed by the signed
    ``batchId`` (and journals each application), one poison message (always fails: must
    end in the DLQ with its reason) and one forgery (must end in the quarantine). After
    a kill nothing was reported, so everything received comes back (its receive count
    up by one), as it would on SQS; lapsed visibility is moved into the past instead of
    waited for.

    Repeated applications are counted as duplicated effects; the key makes them
    harmless. Unexpected: an application after the consumer had recorded the message as
    completed, and, where completions are written per record, more than the one record
    in flight repeated by a kill.
    """

    name = "kill: consumer, completions per record"
    job = "consumer-record"
    prefix = "consumer."
    module = "bench.chaos.consumer"
    completions = "record"
    GOOD = 22  # three batches of up to 10, the poison and the forgery in the first
    max_runs = 4  # passes after the kill (one settles everything; a pass redelivers in itself)

    def __init__(self, stack: ExitStack) -> None:
        self.aws = stack.enter_context(moto_sqs())
        self.dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="chaos-q-")))
        self.queue_prefix = ""
        self.handles = self.dir / "handles"
        self.forged_id = ""

    def _client(self) -> Any:
        import boto3  # type: ignore[import-untyped]

        return boto3.client("sqs", region_name=self.aws["AWS_REGION"],
                            endpoint_url=self.aws["AWS_ENDPOINT_URL"],
                            aws_access_key_id="testing", aws_secret_access_key="testing")

    def _urls(self) -> tuple[str, str]:
        from sluice.queues.topics import dlq_name, queue_name

        client = self._client()
        return (client.get_queue_url(QueueName=queue_name(self.queue_prefix, "rss.ingest"))[
                    "QueueUrl"],
                client.get_queue_url(QueueName=dlq_name(self.queue_prefix, "rss.ingest"))[
                    "QueueUrl"])

    def prepare(self, url: str) -> dict[str, str]:
        from sluice.queues.keys import IDEMPOTENCY_ATTRIBUTE, idempotency_key
        from sluice.queues.signing import Signer
        from sluice.queues.topics import dlq_name, queue_name

        self.queue_prefix = f"chaos{uuid.uuid4().hex[:8]}-"
        self.handles.write_text("")
        client = self._client()
        dlq = client.create_queue(QueueName=dlq_name(self.queue_prefix, "rss.ingest"))[
            "QueueUrl"]
        dlq_arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        queue = client.create_queue(
            QueueName=queue_name(self.queue_prefix, "rss.ingest"),
            Attributes={"VisibilityTimeout": "300", "RedrivePolicy": json.dumps(
                {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": "50"})})["QueueUrl"]
        signer = Signer([QUEUE_SECRET])
        base = {"topic": "rss.ingest", "sourceId": "chaos", "feedUrl": "",
                "publishedAt": "2026-11-30T00:00:00.000Z"}
        good = [signer.sign({**base, "batchId": f"good-{i}"}) for i in range(self.GOOD)]
        poison = signer.sign({**base, "batchId": "poison", "poison": True})
        forged = Signer(["another-secret-0123456789abcdef"]).sign({**base, "batchId": "forged"})
        for message in (*good[:4], poison, forged, *good[4:]):
            sent = client.send_message(
                QueueUrl=queue, MessageBody=json.dumps(message),
                MessageAttributes={IDEMPOTENCY_ATTRIBUTE: {
                    "DataType": "String", "StringValue": idempotency_key(message)}})
            if message is forged:
                self.forged_id = sent["MessageId"]
        return {**self.aws, "SLUICE_QUEUE_SIGNING_SECRET": QUEUE_SECRET,
                "SLUICE_QUEUE_MODE": "sqs", "SLUICE_QUEUE_PREFIX": self.queue_prefix,
                MODE_ENV: self.completions, HANDLES_ENV: str(self.handles)}

    def crash_args(self, point: str) -> list[str]:
        return []

    def between(self, url: str) -> None:
        # What the killed or finished pass left in flight comes back when its visibility
        # lapses: move that moment into the past.
        queue, _ = self._urls()
        client = self._client()
        for handle in dict.fromkeys(self.handles.read_text().split()):
            try:
                client.change_message_visibility(QueueUrl=queue, ReceiptHandle=handle,
                                                 VisibilityTimeout=0)
            except client.exceptions.ClientError:
                pass  # deleted meanwhile
        self.handles.write_text("")
        # A pass killed before it filed a batch's handles: that batch returns by itself,
        # within the driver's short first visibility.
        deadline = time.monotonic() + UNFILED_VISIBILITY_S + 5
        while self._in_flight(queue) and time.monotonic() < deadline:
            time.sleep(0.5)

    def _in_flight(self, queue: str) -> int:
        return int(self._client().get_queue_attributes(
            QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessagesNotVisible"])[
            "Attributes"]["ApproximateNumberOfMessagesNotVisible"])

    def left(self, url: str) -> int:
        queue, _ = self._urls()
        attributes = self._client().get_queue_attributes(
            QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessages",
                                            "ApproximateNumberOfMessagesNotVisible"])[
            "Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(
            attributes["ApproximateNumberOfMessagesNotVisible"])

    def dead_letters(self) -> list[dict[str, Any]]:
        _, dlq = self._urls()
        client = self._client()
        found: dict[str, dict[str, Any]] = {}
        for _ in range(5):
            got = client.receive_message(QueueUrl=dlq, MaxNumberOfMessages=10,
                                         VisibilityTimeout=30).get("Messages", [])
            for message in got:
                found[message["MessageId"]] = json.loads(message["Body"])
            if not got:
                break
        return list(found.values())

    def check(self, url: str) -> Counts:
        from bench.chaos.kill import Counts, _db
        from sluice.queues.deadletters import Quarantine

        db = _db(url)
        with db.transaction() as tx:
            rows = tx.fetchall("SELECT key, value FROM platform_state WHERE key LIKE :p",
                               {"p": "chaos-consumer:%"})
        quarantined = {r["message_id"]: r["reason"] for r in Quarantine(db).list(100)}
        db.close()
        effects = {r["key"].removeprefix(EFFECT) for r in rows if r["key"].startswith(EFFECT)}
        applied: dict[str, int] = {}
        after_completion = 0
        for r in rows:
            if r["key"].startswith(APPLIED):
                batch = r["key"].removeprefix(APPLIED).rsplit(":", 1)[0]
                applied[batch] = applied.get(batch, 0) + 1
                value = r["value"] if isinstance(r["value"], dict) else json.loads(r["value"])
                after_completion += int(bool(value.get("afterCompletion")))
        dead = self.dead_letters()
        dead_ids = [d.get("originalMessage", {}).get("batchId") for d in dead]
        # While messages are still on the queue, what they would do is stuck, not lost.
        counts = Counts(stuck=self.left(url), unexpected=after_completion)
        settled = counts.stuck == 0
        for i in range(self.GOOD):
            batch = f"good-{i}"
            if batch not in effects and settled:
                counts.lost += 1
            counts.duplicated += max(0, applied.get(batch, 0) - 1)
            counts.burned += dead_ids.count(batch)
        if self.completions == "record":  # one kill: at most the record in flight repeats
            counts.unexpected += max(0, counts.duplicated - 1)
        poison = [d for d in dead if d.get("originalMessage", {}).get("batchId") == "poison"]
        if not poison and settled:
            counts.lost += 1
        elif poison and not all("poison message" in d.get("errorMessage", "") for d in poison):
            counts.lost += 1
            counts.notes.append("a dead letter without its reason")
        if len(poison) > 1:  # killed after the DLQ send, before the acknowledgement
            counts.duplicated += len(poison) - 1  # a redrive dedupes on the content key
        if settled and quarantined.get(self.forged_id) != "signature does not match":
            counts.lost += 1
            counts.notes.append(f"forgery not quarantined with its reason: {quarantined}")
        if after_completion:
            counts.notes.append(f"{after_completion} handler runs after completion was recorded")
        return counts


class ConsumerKillBatch(ConsumerKill):
    name = "kill: consumer, completions per batch"
    job = "consumer-batch"
    completions = "batch"


def main() -> int:
    from sluice.queues.sqs import Sqs
    from tests.sqs_helpers import to_record

    services = Services.from_env()
    sqs = Sqs.connect(services.settings)
    consumer = Consumer(TOPIC, effect_handler(services), services, sqs=sqs, registry=None,
                        completions=os.environ.get(MODE_ENV, "record"))  # type: ignore[arg-type]
    url = sqs.topic_url(TOPIC)
    arn = sqs.client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    handles = os.environ[HANDLES_ENV]
    for _ in range(MAX_RECEIVES_PER_PASS):
        got = sqs.client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=UNFILED_VISIBILITY_S,
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"]).get("Messages", [])
        if not got:
            break
        with open(handles, "a", encoding="utf-8") as out:
            out.writelines(m["ReceiptHandle"] + "\n" for m in got)
        sqs.client.change_message_visibility_batch(QueueUrl=url, Entries=[
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": VISIBILITY_S}
            for n, m in enumerate(got)])
        event = {"Records": [to_record(m, arn) for m in got]}
        try:
            response: dict[str, Any] | None = consumer.lambda_handler(event, None)
        except Exception:  # noqa: BLE001 - the function raised (every record failed, or a
            response = None  # store error): Lambda then acknowledges nothing
        failed = ({m["MessageId"] for m in got} if response is None
                  else {f["itemIdentifier"] for f in response["batchItemFailures"]})
        for message in got:
            if message["MessageId"] not in failed:
                sqs.client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            elif response is not None:  # reported: back after its backoff, here at once
                sqs.client.change_message_visibility(
                    QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
        print(json.dumps({"received": len(got), "failed": len(failed)}), flush=True)
    services.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
