"""Consumers and the publisher, built from the topic table.

A topic's handler is its table entry's ``target`` (imported when its consumer is
built); a reserved topic gets a handler that fails loud, so a message that reaches
it retries and dead-letters instead of vanishing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from sluice.core.errors import SluiceError
from sluice.core.observe import logger
from sluice.queues.consumer import Consumer, Handler, InboundMessage
from sluice.queues.publish import REGISTRY, Publisher, Registry
from sluice.queues.sqs import Sqs
from sluice.queues.topics import TOPICS, get_topic

if TYPE_CHECKING:
    from sluice.core.services import Services


class NotImplementedTopic(SluiceError):
    """This topic's consumer is not implemented."""

    code = "topic_not_implemented"


def reserved_handler(topic: str) -> Handler:
    def handle(message: dict[str, Any], inbound: InboundMessage) -> None:
        text = f"{topic} consumer is not implemented; do not enable a producer for this topic"
        logger.error(f"[queues:{topic}] {text}", extra={"messageId": inbound.message_id})
        raise NotImplementedTopic(text)

    return handle


def handler_for(topic: str, services: Services) -> Handler:
    target = get_topic(topic).target
    if target is None:
        return reserved_handler(topic)
    module, _, attr = target.partition(":")
    factory: Callable[[Services], Handler] = getattr(importlib.import_module(module), attr)
    return factory(services)


def consumers_for(services: Services, *, sqs: Sqs | None = None,
                  registry: Registry | None = REGISTRY,
                  topics: Iterable[str] = TOPICS) -> dict[str, Consumer]:
    """One consumer per topic, registered in process (so local publishing reaches them)."""
    return {topic: Consumer(topic, handler_for(topic, services), services, sqs=sqs,
                            registry=registry)
            for topic in topics}


_PUBLISHERS: WeakKeyDictionary[Services, dict[bool, Publisher]] = WeakKeyDictionary()


def publisher_of(services: Services, *, request_path: bool = False) -> Publisher:
    """The process's publisher for ``services`` (built once; its SQS client too).
    ``request_path``: the app's, whose SQS calls are one attempt each, bounded by
    ``SLUICE_REQUEST_PATH_TIMEOUT_SECONDS``."""
    built = _PUBLISHERS.setdefault(services, {})
    publisher = built.get(request_path)
    if publisher is None:
        settings = services.settings
        sqs = (Sqs.connect(settings, timeout_s=settings.request_path_timeout_s)
               if request_path and settings.queue_mode == "sqs" else None)
        publisher = built[request_path] = Publisher(settings, sqs=sqs)
        if publisher.mode == "local" and publisher.signer.configured and len(built) == 1:
            # In process, the consumers register themselves when built (as importing a
            # consumer function does on Lambda), so a local publish reaches them. Without
            # a secret there are none: a publish fails for want of the secret anyway.
            consumers_for(services)
    return publisher
