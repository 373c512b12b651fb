"""The ``webhook`` channel: the payload POSTed as JSON to the recipient URL, signed.

Signed per Standard Webhooks (:mod:`sluice.core.webhooks`): ``webhook-id`` is the entry's
key (the caller's idempotency key, else the entry id), the same on every retry, in-process
or across runs, and sent again as ``idempotency-key``, so the receiver drops duplicates;
``webhook-timestamp`` and ``webhook-signature`` are made afresh per request. The receiver
gets the payload as it is (no chunking). A 4xx other than 408, 409, 425, 429 is permanent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from sluice.core.webhooks import sign
from sluice.delivery.channels.base import (
    NO_PROGRESS,
    ChannelAdapter,
    Outbound,
    Progress,
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

IDEMPOTENCY_HEADER = "idempotency-key"


class WebhookAdapter:
    name = "webhook"

    def __init__(self, client: Egress, secrets: Sequence[str], retrier: Retrier | None = None,
                 clock: Callable[[], float] = time.time, *,
                 pacing_cap_s: float = DEFAULT_CAP_S) -> None:
        self.client = client
        self.secrets = tuple(secrets)
        self.retrier = retrier or Retrier()
        self.clock = clock
        self.pacing_cap_s = pacing_cap_s

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str:
        if not entry.recipient.startswith(("https://", "http://")):
            raise PermanentDeliveryError(f"webhook: recipient is not an http(s) URL: "
                                         f"{entry.recipient[:80]!r}")
        message_of(entry)
        body = json.dumps(entry.payload, separators=(",", ":"), sort_keys=True).encode()
        return self.retrier.call(lambda: self._post(entry, body), label=f"webhook {entry.id}")

    def _post(self, entry: DeliveryEntry, body: bytes) -> str:
        # signed afresh per request (a retry's timestamp stays fresh), under one id
        headers = {"content-type": "application/json", IDEMPOTENCY_HEADER: entry.dedupe_key,
                   **sign(self.secrets, entry.dedupe_key, int(self.clock()), body)}
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
    if not settings.webhook_signing_secrets:
        return None
    return WebhookAdapter(client.webhooks, settings.webhook_signing_secrets, retrier,
                          pacing_cap_s=settings.delivery_pacing_cap_s)
