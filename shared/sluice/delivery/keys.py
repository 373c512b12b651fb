"""Where an entry goes, decided once, from its channel and recipient, when it is enqueued.

Every entry carries two keys, both stored with it (``delivery_queue.destination`` and
``delivery_queue.receiver``) and never recomputed:

- its **destination**, ``<channel>:<recipient>``: the exact URL, chat, Slack channel or
  address. "Gone" (a ``410``, a chat that blocked the bot) belongs here: it disables this
  destination alone.
- its **receiver**, where rates and outages live: a webhook's host and port
  (``webhook:<host>:<port>``, the port always written out), one SMTP relay for email
  (``email:smtp``), and for a chat, a Slack channel or an app's channel the destination
  itself. A receiver that refuses connections holds its entries; its rate spaces them.

An operator names either kind (``sluice.delivery.destinations.check_key`` reads what an
operator types into these forms); every statement that selects a destination's entries
selects ``destination = :key OR receiver = :key``.
"""

from __future__ import annotations

from typing import NamedTuple

from sluice.egress.errors import DestinationRefused
from sluice.egress.urls import receiver as url_receiver

SMTP_RECEIVER = "email:smtp"  # one relay sends every email


class Keys(NamedTuple):
    destination: str
    receiver: str


def webhook_receiver(url: str) -> str | None:
    """``<host>:<port>`` of the receiver a webhook URL reaches (lower case, IDNA, no
    trailing dot, the scheme's default port written out), the one name its receiver key
    and its rate key use; None when the URL cannot be parsed."""
    try:
        host, port = url_receiver(url)
    except DestinationRefused:
        return None
    return f"{host}:{port}"


def keys_for(channel: str, recipient: str) -> Keys:
    """The destination and the receiver of an entry for ``recipient`` on ``channel``."""
    destination = f"{channel}:{recipient}"
    if channel == "webhook":
        found = webhook_receiver(recipient)
        # a URL that does not parse is refused at the door; one stored before is its own
        return Keys(destination, f"webhook:{found}" if found else destination)
    if channel == "email":
        return Keys(destination, SMTP_RECEIVER)
    return Keys(destination, destination)


__all__ = ["SMTP_RECEIVER", "Keys", "keys_for", "webhook_receiver"]
