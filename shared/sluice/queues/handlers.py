"""The handlers of the implemented topics (each named by its entry in the topic table).

``rss.ingest`` re-checks the ``rssQueuePipeline`` flag (a message in flight during a
flag flip must not run an unwanted build) and then runs the global catalog refresh, or,
for a message of the tick's fan-out (``sourceId: "build"`` with a ``buildKey``), that
one build.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sluice.core.errors import ConfigurationError
from sluice.core.observe import logger
from sluice.queues.consumer import Handler, InboundMessage
from sluice.store.flags import FlagStore

if TYPE_CHECKING:
    from sluice.core.services import Services

PIPELINE_FLAG = "rssQueuePipeline"
# Where the rss-refresh feature puts the global catalog refresh, imported when
# none was registered explicitly: "module:function(services, message)".
CATALOG_REFRESH_TARGET = "sluice.rss.catalog:refresh_global_catalog"
# The same for one build of the tick's fan-out: "module:function(services, message)".
BUILD_REFRESH_TARGET = "sluice.rss.fanout:refresh_build_message"
BUILD_SOURCE_ID = "build"

CatalogRefresh = Callable[["Services", dict[str, Any]], Any]
_catalog_refresh: list[CatalogRefresh] = []


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


def build_refresh() -> Callable[[Services, dict[str, Any]], Any]:
    module, _, attr = BUILD_REFRESH_TARGET.partition(":")
    try:
        refresh: Callable[[Services, dict[str, Any]], Any] = getattr(
            importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigurationError(f"no build refresh is available ({BUILD_REFRESH_TARGET})"
                                 ) from exc
    return refresh


def ingest_handler(services: Services) -> Handler:
    flags = FlagStore(services.state)

    def handle(message: dict[str, Any], inbound: InboundMessage) -> None:
        batch = message.get("batchId")
        if not flags.enabled(PIPELINE_FLAG):
            logger.info(f"[queues:rss.ingest] {PIPELINE_FLAG} is off; acknowledged without work "
                        f"batch={batch}", extra={"messageId": inbound.message_id})
            return
        if message.get("sourceId") == BUILD_SOURCE_ID and message.get("buildKey"):
            logger.info(f"[queues:rss.ingest] building {message['buildKey']} batch={batch}",
                        extra={"messageId": inbound.message_id})
            build_refresh()(services, message)
            return
        logger.info(f"[queues:rss.ingest] running aggregation refresh batch={batch}",
                    extra={"messageId": inbound.message_id})
        catalog_refresh()(services, message)

    return handle
