"""Channel adapters, one module per channel, and the registry that lists them.

A new channel is one module here (an adapter with ``send`` and ``outage_key``, a
``build(settings, outbound, retrier)`` that returns it when its credential is set, and
``CHANNEL = Channel(name, recipient, build)``) plus its name in ``CHANNEL_MODULES``.
Its settings go in the settings table (credentials marked ``secret``).
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

from sluice.delivery.channels.base import Channel, ChannelAdapter, Outbound, refused, webhook_guard
from sluice.delivery.channels.webhook import IDEMPOTENCY_HEADER
from sluice.delivery.retry import Retrier

if TYPE_CHECKING:
    from sluice.core.settings import Settings

# The registry: one line per channel module of this package.
CHANNEL_MODULES = ("webhook", "slack", "telegram", "email")

__all__ = ["CHANNEL_MODULES", "IDEMPOTENCY_HEADER", "Channel", "ChannelAdapter", "Outbound",
           "build_adapters", "channels", "deduplicating", "refused", "webhook_guard"]


@cache
def channels() -> dict[str, Channel]:
    found = {}
    for module in CHANNEL_MODULES:
        channel: Channel = importlib.import_module(f"{__name__}.{module}").CHANNEL
        found[channel.name] = channel
    return found


def deduplicating() -> frozenset[str]:
    """The channels whose receivers drop a repeat by its idempotency key."""
    return frozenset(name for name, channel in channels().items() if channel.deduplicates)


def build_adapters(settings: Settings, client: Outbound,
                   retrier: Retrier | None = None) -> dict[str, ChannelAdapter]:
    """The adapters whose credentials are configured; an entry for any other channel waits
    (``MissingAdapter``, a configuration problem) until its credential is set."""
    retrier = retrier or Retrier()
    adapters = {}
    for name, channel in channels().items():
        adapter = channel.build(settings, client, retrier)
        if adapter is not None:
            adapters[name] = adapter
    return adapters
