"""One drain run with several sends in flight (``SLUICE_DELIVERY_DRAIN_CONCURRENCY``), on
both stores: the sends overlap, every entry goes out exactly once with one attempt, the
summary counts each once, and the store's trouble in any worker stops the run."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

from sluice.core.errors import TransientStoreError
from sluice.core.services import Services
from sluice.delivery.channels import Outbound
from sluice.delivery.drain import Deliverer
from sluice.delivery.store import DeliveryStatus, DeliveryStore
from sluice.jobs.registry import Deadline
from tests.integration.delivery.conftest import WIDE_RATES
from tests.integration.delivery.helpers import Providers
from tests.providers.http import ProviderServer, json_response

WORKERS = 4


class Overlapping:
    """A webhook receiver whose first ``WORKERS`` requests each wait until all of them have
    arrived: a drain that sends one entry after another never gets past the first (its
    wait ends in a 503 after 60 s, and the test fails), one with ``WORKERS`` sends in flight
    passes at once."""

    def __init__(self) -> None:
        self.barrier = threading.Barrier(WORKERS, timeout=60)
        self.lock = threading.Lock()
        self.keys: Counter[str] = Counter()
        self.arrived = 0
        self.server = ProviderServer(self._handle)

    def _handle(self, method: str, path: str, headers: dict[str, str],
                body: bytes) -> tuple[int, dict[str, str], bytes]:
        with self.lock:
            self.arrived += 1
            first = self.arrived <= WORKERS
            self.keys[headers.get("idempotency-key", "")] += 1
        if first:
            try:
                self.barrier.wait()
            except threading.BrokenBarrierError:
                return 503, {}, b"the sends did not overlap"
        return json_response(200, {"ok": True, "body": json.loads(body)["text"]})


@pytest.fixture
def overlapping() -> Iterator[Overlapping]:
    receiver = Overlapping()
    with receiver.server:
        yield receiver


def _services(db_url: str, providers: Providers,
              make_services: Callable[..., Services]) -> Services:
    return make_services(db_url, **providers.env(), **WIDE_RATES,
                         SLUICE_DELIVERY_DRAIN_CONCURRENCY=str(WORKERS))


def test_one_drain_keeps_several_sends_in_flight_and_sends_each_entry_once(
        db_url: str, providers: Providers, overlapping: Overlapping,
        make_services: Callable[..., Services]) -> None:
    svc = _services(db_url, providers, make_services)
    store = DeliveryStore(svc.db)
    url = overlapping.server.url + "/hook"
    ids = [store.enqueue("webhook", url, {"text": f"n{n}"})[0].id for n in range(30)]
    telegram = [store.enqueue("telegram", "1001", {"text": f"t{n}"})[0].id for n in range(6)]

    with Outbound.open(svc.settings, deadline_s=120) as client:
        summary = Deliverer.from_services(svc, client).drain(Deadline(120))

    assert summary["recovered"] == 36 and summary["failed"] == 0, summary
    # a worker finding the chat's next slot taken by another (a millisecond apart at these
    # rates) sets its entry aside, nothing counted, and the run sends it at the slot: the
    # rate limit is no failure (every entry below is acked on its first attempt)
    assert summary["unknown"] == 0
    assert sorted(overlapping.keys) == sorted(ids), "every webhook entry reached it"
    assert set(overlapping.keys.values()) == {1}, "none twice"
    assert sorted(m["text"] for m in providers.telegram.messages) == [f"t{n}" for n in range(6)]
    for entry_id in ids + telegram:
        stored = store.get(entry_id)
        assert stored.status is DeliveryStatus.ACKED and stored.attempts == 1


def test_the_store_failing_in_one_worker_stops_the_run_and_loses_nothing(
        db_url: str, providers: Providers, make_services: Callable[..., Services],
        monkeypatch: pytest.MonkeyPatch) -> None:
    svc = _services(db_url, providers, make_services)
    store = DeliveryStore(svc.db)
    ids = [store.enqueue("webhook", providers.webhook.url, {"text": f"n{n}"})[0].id
           for n in range(20)]
    claims = 0
    lock = threading.Lock()
    real_claim = DeliveryStore.claim

    def claim(self: DeliveryStore, *args: object, **kwargs: object) -> object:
        nonlocal claims
        with lock:
            claims += 1
            if claims == 6:
                raise TransientStoreError("the store went away")
        return real_claim(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(DeliveryStore, "claim", claim)
    with Outbound.open(svc.settings, deadline_s=60) as client, \
            pytest.raises(TransientStoreError, match="went away"):
        Deliverer.from_services(svc, client).drain(Deadline(60))
    monkeypatch.undo()

    sent = Counter(r["key"] for r in providers.webhook.received)
    assert set(sent.values()) <= {1}
    statuses = Counter(store.get(i).status for i in ids)
    # what was sent is acked; the rest waits, pending, for the next run (none in flight:
    # the workers that were sending settled before they stopped)
    assert statuses[DeliveryStatus.ACKED] == len(sent)
    assert statuses[DeliveryStatus.PENDING] == len(ids) - len(sent)
    with Outbound.open(svc.settings, deadline_s=60) as client:
        again = Deliverer.from_services(svc, client).drain(Deadline(60))
    assert again["recovered"] == len(ids) - len(sent)
    assert Counter(r["key"] for r in providers.webhook.received) == Counter(ids)
