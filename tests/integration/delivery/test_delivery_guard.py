"""A webhook entry aimed inside (stored before the save-time check, or by hand) fails for good
with a reason that reflects nothing from the target, and is never dialled; the good entry
beside it is delivered.
No storage semantics change here, so these run on SQLite only."""

from __future__ import annotations

import socket
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from tests.integration.delivery.helpers import Providers, drain_once

INSIDE = ("http://127.0.0.1:6379/", "http://169.254.169.254/latest/meta-data/",
          "http://[::1/x", "http://0177.0.0.2/", "http://localhost:6379/")


def test_a_stored_webhook_aimed_inside_fails_for_good_and_is_never_dialled(
        sqlite_url: str, make_services: Callable[..., Services], providers: Providers,
        monkeypatch: pytest.MonkeyPatch) -> None:
    receiver_port = urlsplit(providers.webhook.url).port
    svc = make_services(sqlite_url, **{**providers.env(),
                                   "SLUICE_WEBHOOK_ALLOW_HOSTS": f"127.0.0.1:{receiver_port}"})
    dials: list[tuple[str, int]] = []
    real = socket.create_connection

    def recording(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        dials.append((str(address[0]), int(address[1])))
        if not str(address[0]).startswith("127."):
            raise AssertionError(f"dialled {address[0]}")
        return real(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", recording)
    store = DeliveryStore(svc.db)
    bad = [store.enqueue("webhook", url, {"text": "x"})[0] for url in INSIDE]
    good, _ = store.enqueue("webhook", providers.webhook.url, {"text": "ok"})

    result = drain_once(svc)

    assert result["recovered"] == 1 and result["failed"] == len(INSIDE)
    assert store.get(good.id).status is DeliveryStatus.ACKED
    assert len(providers.webhook.received) == 1
    for entry in bad:
        settled = store.get(entry.id)
        assert settled.status is DeliveryStatus.FAILED, (entry.recipient, settled.last_error)
        assert settled.platform_message_id is None
        reason = settled.last_error or ""
        assert ("webhook: the destination is " in reason
                or "webhook: the URL cannot be parsed" in reason), reason
        assert "6379" not in reason and "169.254" not in reason, reason
    assert {port for _, port in dials if port == 6379} == set(), "the Redis port was never dialled"
    assert all(port == receiver_port for _, port in dials if port != 587)
