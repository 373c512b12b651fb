"""The handlers behind each topic, and the consumers that wrap them.

``rss.ingest`` re-checks the ``rssQueuePipeline`` flag (a message in flight
during a flag flip must not run an unwanted build) and then runs the global
catalog refresh. ``rss.enrich``, ``rss.cluster`` and ``rss.synthesize`` are
reserved: they fail loud, so a message that reaches one retries and
dead-letters instead of vanishing.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary

from shared.core.errors import ConfigurationError, SluiceError
from shared.core.observe import logger
from shared.queues.consumer import Consumer, Handler
from shared.queues.publish import (
    REGISTRY,
    RESERVED,
    TOPICS,
    Delivery,
    Publisher,
    Registry,
    Sqs,
)
from shared.store.flags import FlagStore

if TYPE_CHECKING:
    from shared.core.services import Services

PIPELINE_FLAG = "rssQueuePipeline"
# Where the rss-refresh feature puts the global catalog refresh, imported when
# none was registered explicitly: "module:function(services)".
CATALOG_REFRESH_TARGET = "shared.rss_refresh:refresh_global_catalog"

CatalogRefresh = Callable[["Services"], Any]
_catalog_refresh: list[CatalogRefresh] = []


class NotImplementedTopic(SluiceError):
    """This topic's consumer is not implemented."""

    code = "topic_not_implemented"


def register_catalog_refresh(refresh: CatalogRefresh | None) -> None:
    """Set (or with ``None`` clear) the function ``rss.ingest`` runs."""
    _catalog_refresh.clear()
    if refresh is not None:
        _catalog_refresh.append(refresh)


def catalog_refresh() -> CatalogRefresh:
    if _catalog_refresh:
        return _catalog_refresh[0]
    module, _, attr = CATALOG_REFRESH_TARGET.partition(":")
    try:
        refresh: CatalogRefresh = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"no catalog refresh is available ({CATALOG_REFRESH_TARGET})"
                                 ) from exc
    return refresh


def ingest_handler(services: Services) -> Handler:
    flags = FlagStore(services.state)

    def handle(message: dict[str, Any], delivery: Delivery) -> None:
        batch = message.get("batchId")
        if not flags.enabled(PIPELINE_FLAG):
            logger.info(f"[queues:rss.ingest] {PIPELINE_FLAG} is off; acknowledged without work "
                        f"batch={batch}", extra={"messageId": delivery.message_id})
            return
        logger.info(f"[queues:rss.ingest] running aggregation refresh batch={batch}",
                    extra={"messageId": delivery.message_id})
        catalog_refresh()(services)

    return handle


def reserved_handler(topic: str) -> Handler:
    def handle(message: dict[str, Any], delivery: Delivery) -> None:
        text = f"{topic} consumer is not implemented; do not enable a producer for this topic"
        logger.error(f"[queues:{topic}] {text}", extra={"messageId": delivery.message_id})
        raise NotImplementedTopic(text)

    return handle


def handler_for(topic: str, services: Services) -> Handler:
    return reserved_handler(topic) if topic in RESERVED else ingest_handler(services)


def consumers_for(services: Services, *, sqs: Sqs | None = None,
                  registry: Registry | None = REGISTRY,
                  topics: tuple[str, ...] = TOPICS) -> dict[str, Consumer]:
    """One consumer per topic, registered in process (so local publishing reaches them)."""
    return {topic: Consumer(topic, handler_for(topic, services), services, sqs=sqs,
                            registry=registry)
            for topic in topics}


_PUBLISHERS: WeakKeyDictionary[Services, Publisher] = WeakKeyDictionary()


def publisher_of(services: Services) -> Publisher:
    """The process's publisher for ``services`` (built once; its SQS client too)."""
    publisher = _PUBLISHERS.get(services)
    if publisher is None:
        publisher = _PUBLISHERS[services] = Publisher(services.settings)
        if publisher.mode == "local":
            # In process, the consumers register themselves when built (as importing a
            # consumer function does on Lambda), so a local publish reaches them.
            consumers_for(services)
    return publisher
