"""The admin refresh over HTTP right after a tick: with ``rssQueuePipeline`` off it rebuilds
the global catalog inline; with it on, the ``rss.ingest`` consumer runs the same forced
refresh, so the feed is fetched once either way, inside the rebuild throttle."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from sluice.core.services import Services
from sluice.http.app import create_app
from sluice.queues.publish import REGISTRY
from sluice.rss.catalog import peek
from sluice.rss.store import GLOBAL_KEY, RssStore
from tests.conftest import CRON_SECRET, admin_token
from tests.providers.feeds import FeedServer
from tests.rss_support import FEED_ENV

SECRET = "queue-secret-for-tests-0123456789"
CRON = {"authorization": f"Bearer {CRON_SECRET}"}


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    REGISTRY.clear()


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_manual_refresh_right_after_a_tick_fetches_the_global_feed_once(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        pipeline: bool) -> None:
    svc = make_services(db_url, **FEED_ENV, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    RssStore(svc.db).add_source(feeds.add_rss("/global", items=3), "Global wire", True)
    client = TestClient(create_app(svc), raise_server_exceptions=False)
    owner = {"authorization": f"Bearer {admin_token(['super_admin'], subject='root-1')}"}
    flipped = client.put("/api/admin/flags", headers=owner,
                         json={"key": "rssQueuePipeline", "enabled": pipeline})
    assert flipped.status_code == 200, flipped.text

    tick = client.get("/api/admin/rss/refresh", headers=CRON)
    assert tick.status_code == 200, tick.text
    assert tick.json()["published"] is pipeline and feeds.hits["/global"] == 1
    built_at = peek(svc, GLOBAL_KEY).built_at  # type: ignore[union-attr]

    manual = client.post("/api/admin/rss/refresh", headers=owner)

    assert manual.status_code == 200, manual.text
    assert manual.json()["published"] is pipeline
    assert manual.json()["inlineRefreshed"] is not pipeline
    assert feeds.hits["/global"] == 2, "the manual refresh fetched the global feed once"
    assert peek(svc, GLOBAL_KEY).built_at > built_at  # type: ignore[union-attr]
