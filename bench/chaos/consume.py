"""``python -m bench.chaos.consume``: one pass of an SQS event source mapping over a topic.

What Lambda's poller does, in one process with the function: receive up to 10 messages
(each receive counts), hand them to ``Consumer.lambda_handler`` as an SQS event, delete
those not reported as item failures (none when the function raised or died), and repeat
until nothing is visible. The receipt handles are appended to ``CHAOS_HANDLES`` as they
are received, so the harness can make whatever was left in flight visible again
(a lapsed visibility timeout, without the wait). A batch is received with a short
visibility that becomes the queue's once its handles are on file, so a kill between
the two still lets the batch come back soon.

The handler has an observable, keyed effect: a row per message keyed by its signed
``batchId`` (written once whatever happens), and a journal row per application, noting
whether the consumer had already recorded the message as completed (it never should).
A message with ``"poison": true`` always fails.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from shared.core.services import Services
from shared.queues.consumer import Consumer, Handler, InboundMessage
from shared.queues.keys import CompletedKeys, dedupe_key
from shared.store.db import utcnow

TOPIC = "rss.ingest"
EFFECT = "chaos-consumer:effect:"
APPLIED = "chaos-consumer:applied:"
MODE_ENV = "CHAOS_COMPLETIONS"
HANDLES_ENV = "CHAOS_HANDLES"
UNFILED_VISIBILITY_S = 8  # until the batch's receipt handles are on file
VISIBILITY_S = 300


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


def main() -> int:
    from shared.queues.sqs import Sqs
    from tests.sqs_helpers import to_record

    services = Services.from_env()
    sqs = Sqs.connect(services.settings)
    consumer = Consumer(TOPIC, effect_handler(services), services, sqs=sqs, registry=None,
                        completions=os.environ.get(MODE_ENV, "record"))  # type: ignore[arg-type]
    url = sqs.topic_url(TOPIC)
    arn = sqs.client.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"]
    handles = os.environ[HANDLES_ENV]
    while True:
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
        print(json.dumps({"received": len(got), "failed": len(failed)}), flush=True)
    services.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
