"""What a channel is declared and built with: ``Channel``, the adapter protocol, its ways out.

Light on purpose: every function imports the channel declarations at cold start (the
delivery pack's and an app's ``CHANNELS``), while the adapters themselves, and the HTTP
client under ``Outbound``, load only where a delivery is sent
(``sluice.delivery.channels``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, Self

if TYPE_CHECKING:
    from sluice.core.settings import Settings
    from sluice.delivery.retry import Retrier
    from sluice.delivery.store import DeliveryEntry
    from sluice.egress import AddressGuard, Egress


class Progress(Protocol):
    """What one send of a chunked entry reads and leaves behind (``sluice.delivery.chunks``)."""

    def done(self) -> Mapping[int, str | None]:
        """The chunks already accepted, by index (None: refused for good, skipped)."""
        ...

    def slot(self) -> None:
        """A rate slot for the next chunk, or ``NoRateSlot``."""
        ...

    def took(self, chunk: int, message_id: str | None) -> None:
        """Record chunk ``chunk``'s answer durably, before the next chunk is sent."""
        ...


class NoProgress:
    """A send that records nothing and takes no further slot (one message, or a test)."""

    def done(self) -> Mapping[int, str | None]:
        return {}

    def slot(self) -> None:
        return None

    def took(self, chunk: int, message_id: str | None) -> None:
        return None


NO_PROGRESS = NoProgress()


class ChannelAdapter(Protocol):
    name: str

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str: ...


def webhook_guard(allow_hosts: Sequence[str] = ()) -> AddressGuard:
    """Webhook recipients come from rules: public addresses only, unless the host is in
    ``SLUICE_WEBHOOK_ALLOW_HOSTS``."""
    from sluice.egress import AddressGuard

    return AddressGuard(allow_hosts, setting="SLUICE_WEBHOOK_ALLOW_HOSTS", field="recipient")


class Outbound(NamedTuple):
    """The adapters' ways out: ``providers`` for the APIs set in settings (Slack, Telegram:
    trusted as configured), ``webhooks`` for recipients named in rules (guarded); both end
    every request by ``deadline`` (``time.monotonic`` seconds)."""

    providers: Egress
    webhooks: Egress
    deadline: float | None = None

    @classmethod
    def open(cls, settings: Settings, *, deadline_s: float | None = None) -> Outbound:
        from sluice.egress import Egress

        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        timeout = settings.delivery_send_timeout_s
        return cls(Egress(timeout_s=timeout, deadline=deadline),
                   Egress(timeout_s=timeout, deadline=deadline,
                          guard=webhook_guard(settings.webhook_allow_hosts)),
                   deadline)

    def close(self) -> None:
        self.providers.close()
        self.webhooks.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


RecipientCheck = Callable[[Any, str], str]


class Channel(NamedTuple):
    """One channel's registration: its name, what a recipient is, how to build its adapter
    (None when its credential is not configured), whether its receivers drop a repeated
    message by its idempotency key (then an unknown outcome may be resent freely), and
    ``check(value, field)``, its recipient check: it returns the recipient as stored or
    raises ``sluice.RequestError`` naming ``field``."""

    name: str
    recipient: str
    build: Callable[[Settings, Outbound, Retrier], ChannelAdapter | None]
    deduplicates: bool = False
    check: RecipientCheck | None = None
