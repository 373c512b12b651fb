"""The benchmark's app channel, declared through the extension API as an app declares one
(``SLUICE_APP=bench.peers.channel``): ``bench-noop``, whose send returns at once, so the
figures are the queue's own work and none of a receiver's."""

from __future__ import annotations

from typing import Any

from sluice.extend import (
    NO_PROGRESS,
    Channel,
    ChannelAdapter,
    DeliveryEntry,
    Outbound,
    Progress,
    RequestError,
    Retrier,
    Settings,
)

NAME = "bench-noop"


class NoopAdapter:
    name = NAME

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str:
        return entry.id


def _build(settings: Settings, outbound: Outbound, retrier: Retrier) -> ChannelAdapter | None:
    return NoopAdapter()


def _check(value: Any, field: str) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= 64:
        raise RequestError(f"{field} must be a name of 1 to 64 characters", field=field)
    return value


CHANNELS = [Channel(NAME, "any name", _build, check=_check)]
