"""The rss tick in a deployment without the alerts pack: the sweep is not run, its result
has no ``alertSweep``, new stories are announced to no listener, and the rules a scope
holds enqueue nothing; with the pack on, the same store and rules give the sweep's counts
and deliveries. The pack
choice is this process's (``packs_on``, read by ``sluice.rss.sweep``); the oracles are the
tick's result and the delivery queue."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.jobs.registry import Deadline
from sluice.rss import sweep as rss_sweep
from sluice.rss.tick import refresh_tick
from tests.providers.feeds import FeedServer
from tests.rss_support import FakeClock, catalog, feed_services, scope_with_a_rule


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def _tick(svc: Services, clock: FakeClock) -> dict[str, Any]:
    clock.advance(3600)
    with catalog(svc, clock) as cat:
        return refresh_tick(svc, tenant_ingestion=True, deadline=Deadline(60),
                            started_at=clock.now(), catalog=cat, monotonic=clock.monotonic)


def test_without_the_alerts_pack_the_tick_sweeps_and_announces_nothing(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The alerts listener is registered in this process (as the HTTP app's import of
    ``sluice.alerts`` does); with the pack off it still hears nothing."""
    import sluice.alerts  # noqa: F401 - registers the listener, as the HTTP app's import does

    svc = feed_services(make_services, sqlite_url)
    clock = FakeClock()
    scope_with_a_rule(svc, feeds, clock)  # two new stories for the next build
    monkeypatch.setattr(rss_sweep, "packs_on", lambda: ("delivery", "rss"))
    off = _tick(svc, clock)
    assert "alertSweep" not in off and off["tenantIngestion"]["refreshed"] == 1
    assert off["newStoryAlerts"] == {"enqueued": 0, "failed": 0}
    assert DeliveryStore(svc.db).list(limit=10) == []
    # the same store, rules and feed with the pack on: the sweep finds every match
    monkeypatch.setattr(rss_sweep, "packs_on", lambda: ("delivery", "rss", "alerts"))
    feeds.add_rss("/t/live", items=5)
    on = _tick(svc, clock)
    assert on["newStoryAlerts"]["enqueued"] == 1
    assert on["alertSweep"]["tenantsWithRules"] == 1
    assert len(DeliveryStore(svc.db).list(limit=10)) == 5
