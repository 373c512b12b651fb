"""The delivery pack: the write-ahead delivery queue, drained by delivery-drain through
Sluice's four channels (each an adapter module of ``sluice.delivery.channels``, built only
where a delivery is sent; its recipient check from ``sluice.core.validate``)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from sluice.extend import Channel, Job

if TYPE_CHECKING:  # what a build is given, named for its signature only: loaded where it runs
    from sluice.extend import ChannelAdapter, Outbound, Retrier, Settings

JOBS = [
    Job(name="delivery-drain", route="/api/admin/delivery/drain", schedule="rate(1 minute)",
        surface="delivery", target="sluice.delivery.drain:run_delivery_drain",
        failure_keys=("failed", "skippedMaxRetries", "fatal", "notSent"), budget_s=45.0,
        timeout_s=60),
]


class _Adapter:
    """``build`` of the channel module ``sluice.delivery.channels.<module>``, imported when
    called, and the channel's recipient check."""

    def __init__(self, module: str) -> None:
        self.module = module

    def build(self, settings: Settings, outbound: Outbound,
              retrier: Retrier) -> ChannelAdapter | None:
        built: ChannelAdapter | None = importlib.import_module(
            f"sluice.delivery.channels.{self.module}").build(settings, outbound, retrier)
        return built

    def check(self, value: Any, field: str) -> str:
        from sluice.core.validate import check_recipient

        return check_recipient(self.module, value, field=field)


def _channel(name: str, recipient: str, *, deduplicates: bool = False) -> Channel:
    adapter = _Adapter(name)
    return Channel(name, recipient, adapter.build, deduplicates=deduplicates,
                   check=adapter.check)


CHANNELS = [
    _channel("webhook", "an http(s) URL", deduplicates=True),
    _channel("slack", "a channel id"),
    _channel("telegram", "a chat id"),
    _channel("email", "an email address"),
]
