"""Channel adapters, one module per channel, and the registry that lists them.

A Sluice channel is one module here (an adapter with ``send``, and a
``build(settings, outbound, retrier)`` that returns it when its credential is set),
registered as a ``Channel`` in the delivery pack's ``CHANNELS`` (``sluice.packs.delivery``)
with its recipient check from ``sluice.core.validate.RECIPIENTS``. Its settings go in the
settings table (credentials marked ``secret``). An app's channel is a ``Channel`` with its
own recipient ``check`` in its extension module's ``CHANNELS`` (``sluice.core.extensions``);
``channels()`` merges both, and is empty when the delivery pack is off.
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING, Any

from sluice.core.errors import ConfigurationError
from sluice.core.extensions import Table
from sluice.core.validate import refuse
from sluice.delivery.channels.base import Channel, ChannelAdapter, Outbound, refused, webhook_guard
from sluice.delivery.channels.webhook import IDEMPOTENCY_HEADER
from sluice.delivery.retry import Retrier

if TYPE_CHECKING:
    from sluice.core.settings import Settings

__all__ = ["IDEMPOTENCY_HEADER", "Channel", "ChannelAdapter", "Outbound",
           "build_adapters", "channels", "check_recipient", "deduplicating", "refused",
           "webhook_guard"]

NAME = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
MAX_NAME = 32


def check_channel(item: object, source: str) -> Channel:
    """A declared channel, well formed: a name, a callable ``build`` and its recipient
    check (nothing is stored for a channel that cannot say what it can address)."""
    if not isinstance(item, Channel):
        raise ConfigurationError(f"{source}: CHANNELS holds {item!r}, not a "
                                 "sluice.extend.Channel")
    where = f"{source}: channel {item.name!r}"
    if not (isinstance(item.name, str) and NAME.fullmatch(item.name)
            and len(item.name) <= MAX_NAME):
        raise ConfigurationError(f"{where}: a name is lower-case words joined by '-' "
                                 f"(at most {MAX_NAME} characters)")
    if not callable(item.build) or not callable(item.check):
        raise ConfigurationError(f"{where}: build and check must be functions")
    return item


@cache
def _table() -> Table[Channel]:
    return Table("CHANNELS", (), lambda channel: channel.name, check_channel)


def channels() -> dict[str, Channel]:
    """Every channel by name: the delivery pack's, then the app's."""
    return _table().merged()


def check_recipient(channel: str, value: Any, *, field: str) -> str:
    """What ``channel`` can address, by the channel's own ``check``."""
    found = channels().get(channel)
    if found is None or found.check is None:
        raise refuse(field, f"no recipient check for channel {channel!r}")
    return found.check(value, field)


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
