"""The example app's channel (docs/examples/exampleapp/exampleapp/pager.py) against a real
local pager service that answers 4xx: the adapter raises the typed refusal with the
service's own words (not a TypeError), and the delivery drain fails the entry for good at
once, or retries it, as the status says. Oracles: the error the adapter raises, the entry
the drain leaves in the store, and the requests the service received."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import sluice.delivery.channels as registry
from sluice.core.extensions import load
from sluice.core.services import Services
from sluice.delivery.channels import Outbound, build_adapters
from sluice.delivery.classify import PermanentDeliveryError, TransientDeliveryError
from sluice.delivery.retry import Retrier, RetryPolicy
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from tests.conftest import ROOT
from tests.integration.delivery.helpers import drain_once
from tests.providers.http import ProviderServer, json_response

APP = ROOT / "docs" / "examples" / "exampleapp"
# what the pager service answers each pager id with
ANSWERS = {"gone": (404, b"no such pager: gone"), "busy": (429, b"slow down"),
           "team": (200, json.dumps({"id": "page-1"}).encode())}


@pytest.fixture
def pager_service() -> Iterator[ProviderServer]:
    def answer(method: str, path: str, headers: dict[str, str],
               body: bytes) -> tuple[int, dict[str, str], bytes]:
        status, text = ANSWERS[path.removeprefix("/pages/")]
        if status == 200:
            return json_response(200, json.loads(text))
        return status, {"content-type": "text/plain"}, text

    with ProviderServer(answer) as server:
        yield server


@pytest.fixture
def services(pager_service: ProviderServer, sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
             make_services: Callable[..., Services]) -> Services:
    """Services whose channels table is the example app's (its pager beside Sluice's own)."""
    monkeypatch.syspath_prepend(str(APP))
    monkeypatch.setenv("EXAMPLEAPP_PAGER_URL", pager_service.url)
    table = registry._table().using(load(["exampleapp.sluice_ext"], group=None))
    monkeypatch.setattr(registry, "_table", lambda: table)
    return make_services(sqlite_url)


def _send(services: Services, recipient: str) -> Any:
    entry, _ = DeliveryStore(services.db).enqueue("exampleapp-pager", recipient, {"text": "hi"})
    retrier = Retrier(RetryPolicy(attempts=1), sleep=lambda s: None)
    with Outbound.open(services.settings, deadline_s=10) as outbound:
        adapter = build_adapters(services.settings, outbound, retrier)["exampleapp-pager"]
        return adapter.send(entry)


def test_a_4xx_is_the_pagers_refusal_in_its_own_words(services: Services,
                                                      pager_service: ProviderServer) -> None:
    with pytest.raises(PermanentDeliveryError) as gone:
        _send(services, "gone")
    assert gone.value.message == "pager: no such pager: gone"
    assert gone.value.context["status"] == 404
    with pytest.raises(TransientDeliveryError, match="pager: slow down"):
        _send(services, "busy")  # 429 says "later"
    assert _send(services, "team") == "page-1"
    assert [r["path"] for r in pager_service.requests] == ["/pages/gone", "/pages/busy",
                                                           "/pages/team"]


def test_the_drain_fails_a_refused_page_at_once_and_retries_a_busy_one(
        services: Services, pager_service: ProviderServer) -> None:
    store = DeliveryStore(services.db)
    gone, _ = store.enqueue("exampleapp-pager", "gone", {"text": "hi"})
    busy, _ = store.enqueue("exampleapp-pager", "busy", {"text": "hi"})
    drain_once(services)
    gone_after, busy_after = store.get(gone.id), store.get(busy.id)
    assert gone_after is not None and busy_after is not None
    assert (gone_after.status, gone_after.attempts) == (DeliveryStatus.FAILED, 1)
    assert gone_after.last_error == "PermanentDeliveryError: pager: no such pager: gone"
    assert busy_after.status is DeliveryStatus.PENDING and "slow down" in (busy_after.last_error
                                                                            or "")
    assert {r["path"] for r in pager_service.requests} == {"/pages/gone", "/pages/busy"}
