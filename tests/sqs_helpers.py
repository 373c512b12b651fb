"""SQS in tests: queues on the moto server, and an event source mapping in miniature.

``poll`` does what Lambda's SQS poller does: receive a batch, hand it to the
function as an SQS event, and delete what the function did not report as an
item failure (all of it stays when the function raised).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

import boto3
from aws_lambda_powertools.utilities.batch.exceptions import BatchProcessingError

from sluice.queues.topics import TOPICS, VISIBILITY_TIMEOUT_S, dlq_name, queue_name

REGION = "eu-north-1"


def sqs_client() -> Any:
    return boto3.client("sqs", region_name=REGION)


def new_prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}-"


def create_queues(prefix: str, topics: tuple[str, ...] = tuple(TOPICS), *,
                  max_receive_count: int = 8) -> dict[str, str]:
    """Each topic's queue and its -dlq (the redrive policy is only the backstop)."""
    client = sqs_client()
    urls = {}
    for topic in topics:
        dlq = client.create_queue(QueueName=dlq_name(prefix, topic))["QueueUrl"]
        dlq_arn = client.get_queue_attributes(QueueUrl=dlq, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        urls[topic] = client.create_queue(QueueName=queue_name(prefix, topic), Attributes={
            "VisibilityTimeout": str(VISIBILITY_TIMEOUT_S),
            "RedrivePolicy": json.dumps({"deadLetterTargetArn": dlq_arn,
                                         "maxReceiveCount": str(max_receive_count)}),
        })["QueueUrl"]
        urls[topic + "-dlq"] = dlq
    return urls


def queue_arn(url: str) -> str:
    return str(sqs_client().get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])[
        "Attributes"]["QueueArn"])


def to_record(message: dict[str, Any], arn: str) -> dict[str, Any]:
    return {
        "messageId": message["MessageId"],
        "receiptHandle": message["ReceiptHandle"],
        "body": message["Body"],
        "attributes": dict(message.get("Attributes", {})),
        "messageAttributes": {
            name: {"stringValue": value.get("StringValue"), "dataType": value["DataType"],
                   "stringListValues": [], "binaryListValues": []}
            for name, value in message.get("MessageAttributes", {}).items()
        },
        "md5OfBody": message["MD5OfBody"],
        "eventSource": "aws:sqs",
        "eventSourceARN": arn,
        "awsRegion": REGION,
    }


def receive(url: str, *, visibility: int = VISIBILITY_TIMEOUT_S, max_messages: int = 10,
            ) -> list[dict[str, Any]]:
    got = sqs_client().receive_message(
        QueueUrl=url, MaxNumberOfMessages=max_messages, VisibilityTimeout=visibility,
        MessageSystemAttributeNames=["All"], MessageAttributeNames=["All"])
    messages: list[dict[str, Any]] = got.get("Messages", [])
    return messages


@dataclass
class Polled:
    event: dict[str, Any]
    response: dict[str, Any] | None  # None: the function raised (every record failed)
    failed_ids: list[str]
    deleted_ids: list[str]


def deliver(messages: list[dict[str, Any]], url: str, handler: Any) -> Polled:
    arn = queue_arn(url)
    event = {"Records": [to_record(m, arn) for m in messages]}
    try:
        response: dict[str, Any] | None = handler(event, None)
    except BatchProcessingError:
        response = None
    ids = [m["MessageId"] for m in messages]
    failed = ids if response is None else [f["itemIdentifier"]
                                           for f in response["batchItemFailures"]]
    deleted = []
    for message in messages:
        if message["MessageId"] not in failed:
            sqs_client().delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            deleted.append(message["MessageId"])
    return Polled(event, response, failed, deleted)


def poll(url: str, handler: Any) -> Polled:
    return deliver(receive(url), url, handler)


def bodies(url: str) -> list[dict[str, Any]]:
    """Every message now visible on ``url`` (they stay, visible again at once)."""
    found: dict[str, dict[str, Any]] = {}
    for message in receive(url, visibility=0):
        found[message["MessageId"]] = json.loads(message["Body"])
    return list(found.values())
