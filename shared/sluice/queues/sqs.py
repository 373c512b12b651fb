"""The SQS client of the push queues: queue URLs looked up once, sends carrying the key attribute."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sluice.core.errors import ConfigurationError, NotFound, TransientStoreError
from sluice.core.settings import Settings
from sluice.queues.keys import IDEMPOTENCY_ATTRIBUTE
from sluice.queues.topics import dlq_name, queue_name


@contextmanager
def _unanswered() -> Iterator[None]:
    """SQS not answering (no connection, no reply in time) is a ``TransientStoreError``:
    the same send may work later, and callers branch on that type."""
    from botocore.exceptions import (  # type: ignore[import-untyped]
        ConnectionClosedError,
        ConnectTimeoutError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    try:
        yield
    except (ConnectionClosedError, ConnectTimeoutError, EndpointConnectionError,
            ReadTimeoutError) as exc:
        raise TransientStoreError(f"sqs: {exc}") from exc


class QueueMissing(NotFound):
    """The SQS queue does not exist (not provisioned for this prefix and stage)."""

    code = "queue_missing"


class Sqs:
    """The boto3 SQS client with queue URLs looked up once and cached."""

    def __init__(self, client: Any, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self._urls: dict[str, str] = {}

    @classmethod
    def connect(cls, settings: Settings, *, timeout_s: float | None = None) -> Sqs:
        """``timeout_s``: each call is one attempt that gives up after that long connecting
        and as long reading (an app's request path); else three attempts, 5 s and 20 s."""
        import boto3  # type: ignore[import-untyped]
        from botocore.config import Config  # type: ignore[import-untyped]
        from botocore.exceptions import BotoCoreError

        config = (Config(retries={"mode": "standard", "max_attempts": 3}, connect_timeout=5,
                         read_timeout=20) if timeout_s is None else
                  Config(retries={"mode": "standard", "max_attempts": 1},
                         connect_timeout=timeout_s, read_timeout=timeout_s))
        try:
            # boto3 reads AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL itself.
            client = boto3.client("sqs", config=config)
        except BotoCoreError as exc:
            raise ConfigurationError(f"SLUICE_QUEUE_MODE=sqs but no SQS client: {exc}") from exc
        return cls(client, settings.queue_prefix)

    def url(self, name: str) -> str:
        url = self._urls.get(name)
        if url is None:
            try:
                with _unanswered():
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

    def send(self, url: str, body: str, key: str | None = None, *, delay_s: int = 0,
             trace: Mapping[str, str] | None = None) -> str:
        """``delay_s``: the message becomes visible that much later (SQS: 0-900 s).
        ``trace``: the producer's trace context (``traceparent``, ``tracestate``), sent as
        message attributes beside the key, outside the signed body."""
        attributes = ({IDEMPOTENCY_ATTRIBUTE: {"DataType": "String", "StringValue": key}}
                      if key else {})
        for name, value in (trace or {}).items():
            attributes[name] = {"DataType": "String", "StringValue": value}
        extra = {"DelaySeconds": delay_s} if delay_s else {}
        with _unanswered():
            sent = self.client.send_message(QueueUrl=url, MessageBody=body,
                                            MessageAttributes=attributes, **extra)
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

