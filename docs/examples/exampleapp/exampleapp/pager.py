"""The ``exampleapp-pager`` channel: POST the text to the app's pager service.

``EXAMPLEAPP_PAGER_URL`` is the app's own setting (a service the app trusts, so the
request goes through Sluice's provider egress: deadlines and size caps, no address guard).
"""

from __future__ import annotations

import os

from sluice.extend import (
    NO_PROGRESS,
    ChannelAdapter,
    DeliveryEntry,
    EgressError,
    Outbound,
    Progress,
    Retrier,
    Settings,
    TransientDeliveryError,
    message_of,
    refused,
    transport_error,
)


class PagerAdapter:
    name = "exampleapp-pager"

    def __init__(self, outbound: Outbound, base_url: str, retrier: Retrier) -> None:
        self.client = outbound.providers
        self.base_url = base_url.rstrip("/")
        self.retrier = retrier

    def send(self, entry: DeliveryEntry, progress: Progress = NO_PROGRESS) -> str:
        # one request per entry: nothing to resume, so ``progress`` is not used
        text = "\n".join(message_of(entry).parts)
        return self.retrier.call(lambda: self._post(entry, text), label=f"pager {entry.id}")

    def _post(self, entry: DeliveryEntry, text: str) -> str:
        try:
            answer = self.client.request(
                "POST", f"{self.base_url}/pages/{entry.recipient}", json={"text": text},
                headers={"idempotency-key": entry.idempotency_key or str(entry.id)})
        except EgressError as exc:
            raise transport_error("pager", exc) from None
        if answer.status >= 500:
            raise TransientDeliveryError(f"pager answered {answer.status}")
        if answer.status >= 400:
            raise refused(f"pager: {answer.text[:200]}", status=answer.status)
        return str(answer.json().get("id"))


def build(settings: Settings, outbound: Outbound, retrier: Retrier) -> ChannelAdapter | None:
    url = os.environ.get("EXAMPLEAPP_PAGER_URL")
    return PagerAdapter(outbound, url, retrier) if url else None
