"""The ``webhook`` channel: the payload POSTed as JSON to the recipient URL, signed.

Headers: ``x-sluice-timestamp``, ``x-sluice-signature: v1=<hex HMAC-SHA256 of
"<timestamp>.<body>">``, ``idempotency-key`` (the caller's key, else the entry id:
the same on every retry, in-process or across runs, so the receiver can drop
duplicates), ``x-sluice-delivery-id`` and ``x-sluice-attempt``. The receiver gets the
payload as it is (no chunking). A 4xx other than 408, 409, 425, 429 is permanent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from sluice.delivery.channels.base import (
    Channel,
    ChannelAdapter,
    Outbound,
    json_of,
    message_of,
    refused,
    transport_error,
)
from sluice.delivery.classify import PermanentDeliveryError
from sluice.delivery.retry import Retrier
from sluice.delivery.store import DeliveryEntry
from sluice.egress import Egress, EgressError
from sluice.egress.pacing import DEFAULT_CAP_S, retry_after_header

if TYPE_CHECKING:
    from sluice.core.settings import Settings

SIGNATURE_HEADER = "x-sluice-signature"
TIMESTAMP_HEADER = "x-sluice-timestamp"
IDEMPOTENCY_HEADER = "idempotency-key"


def webhook_signature(secret: str, timestamp: str, body: bytes) -> str:
    """``v1=`` + hex HMAC-SHA256 of ``<timestamp>.<body>`` (the timestamp stops replays)."""
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256)
    return "v1=" + mac.hexdigest()


def verify_webhook(secret: str, headers: Mapping[str, str], body: bytes, *,
                   now: float | None = None, tolerance_s: float = 300) -> bool:
    """What a receiver runs: the signature matches and the timestamp is recent (within
    ``tolerance_s``, so a replayed request is refused). ``headers`` in any case, as a
    framework or a Lambda event gives them; ``body`` is the raw bytes received."""
    headers = {str(name).lower(): value for name, value in headers.items()}
    timestamp = headers.get(TIMESTAMP_HEADER, "")
    if not timestamp.isdigit() or abs((now or time.time()) - int(timestamp)) > tolerance_s:
        return False
    expected = webhook_signature(secret, timestamp, body)
    return hmac.compare_digest(expected.encode(), headers.get(SIGNATURE_HEADER, "").encode())


class WebhookAdapter:
    name = "webhook"

    def __init__(self, client: Egress, secret: str, retrier: Retrier | None = None,
                 clock: Callable[[], float] = time.time, *,
                 pacing_cap_s: float = DEFAULT_CAP_S) -> None:
        self.client = client
        self.secret = secret
        self.retrier = retrier or Retrier()
        self.clock = clock
        self.pacing_cap_s = pacing_cap_s

    def outage_key(self, entry: DeliveryEntry) -> str:
        try:
            parts = urlsplit(entry.recipient)
            return f"webhook:{parts.hostname}:{parts.port or ''}"
        except ValueError:  # unparseable: the send refuses it for good, alone
            return f"webhook:invalid:{entry.id}"

    def send(self, entry: DeliveryEntry) -> str:
        if not entry.recipient.startswith(("https://", "http://")):
            raise PermanentDeliveryError(f"webhook: recipient is not an http(s) URL: "
                                         f"{entry.recipient[:80]!r}")
        message_of(entry)
        body = json.dumps(entry.payload, separators=(",", ":"), sort_keys=True).encode()
        return self.retrier.call(lambda: self._post(entry, body), label=f"webhook {entry.id}")

    def _post(self, entry: DeliveryEntry, body: bytes) -> str:
        timestamp = str(int(self.clock()))  # signed afresh per request: a retry stays fresh
        headers = {
            "content-type": "application/json",
            TIMESTAMP_HEADER: timestamp,
            SIGNATURE_HEADER: webhook_signature(self.secret, timestamp, body),
            IDEMPOTENCY_HEADER: entry.dedupe_key,
            "x-sluice-delivery-id": entry.id,
            "x-sluice-attempt": str(entry.attempts),
        }
        try:
            response = self.client.request("POST", entry.recipient, content=body,
                                           headers=headers)
        except EgressError as exc:
            raise transport_error("webhook", exc) from None
        if response.ok:
            found = json_of(response).get("id")
            return str(found)[:200] if found is not None else entry.dedupe_key
        raise refused(f"webhook answered {response.status}: {response.text[:200]}",
                      status=response.status,
                      pacing=retry_after_header(response.headers.get("retry-after"),
                                                cap_s=self.pacing_cap_s, now=self.clock()))


def build(settings: Settings, client: Outbound, retrier: Retrier) -> ChannelAdapter | None:
    if not settings.webhook_signing_secret:
        return None
    return WebhookAdapter(client.webhooks, settings.webhook_signing_secret, retrier,
                          pacing_cap_s=settings.delivery_pacing_cap_s)


CHANNEL = Channel("webhook", "an http(s) URL", build, deduplicates=True)
