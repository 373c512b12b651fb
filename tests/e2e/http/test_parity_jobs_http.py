"""The scheduled surface as the reference documents describe it, through the HTTP app:
the five routes by their paths, each a cron ``GET`` and an admin ``POST`` that run the job,
the queue pipeline's flag off on a fresh install, and the rss tick as the only scheduled
evaluation of alert rules."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from sluice.alerts.rules import RulesStore
from sluice.core.services import Services
from sluice.delivery.store import DeliveryStore
from sluice.http.app import create_app
from sluice.jobs.runs import RunStore
from sluice.rss.store import RssStore
from tests.conftest import CRON_SECRET, admin_token
from tests.providers.feeds import FeedServer
from tests.rss_support import feed_services

# The document's five routes, by path, and the job each one runs.
DOCUMENTED = {
    "/api/admin/rss/refresh": "rss-refresh",
    "/api/admin/ai/metering/flush": "metering-flush",
    "/api/admin/ai/ledger/retry/flush": "ledger-redrive",
    "/api/admin/state/cleanup": "state-cleanup",
    "/api/admin/erasure/purge": "erasure-purge",
}
CRON = {"authorization": f"Bearer {CRON_SECRET}"}


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


def admin(*roles: str) -> dict[str, str]:
    return {"authorization": f"Bearer {admin_token(list(roles), subject='operator')}"}


def test_the_five_documented_routes_run_their_jobs_on_get_and_post(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    services = make_services(sqlite_url)
    client = TestClient(create_app(services), raise_server_exceptions=False)
    runs = RunStore(services.db)
    for path, job in DOCUMENTED.items():
        got = client.get(path, headers=CRON)
        assert got.status_code == 200, (path, got.text)
        assert runs.recent(job)[0]["trigger"] == "cron_http", path
        posted = client.post(path, headers=admin("super_admin"))
        assert posted.status_code == 200, (path, posted.text)
        assert runs.recent(job)[0]["trigger"] == "admin", path
        assert [r["trigger"] for r in runs.recent(job)] == ["admin", "cron_http"], path


def test_a_fresh_install_has_the_queue_pipeline_off(
        sqlite_url: str, make_services: Callable[..., Services]) -> None:
    client = TestClient(create_app(make_services(sqlite_url)))
    [flag] = client.get("/api/admin/flags", headers=admin("super_admin")).json()["flags"]
    assert (flag["key"], flag["enabled"]) == ("rssQueuePipeline", False)
    tick = client.get("/api/admin/rss/refresh", headers=CRON).json()
    assert (tick["pipelineEnabled"], tick["published"], tick["inlineRefreshed"]) == (
        False, False, True)


def test_of_the_scheduled_jobs_only_the_rss_tick_evaluates_alert_rules(
        sqlite_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    """A tenant with a stored build and a rule its stories match: every other scheduled job,
    run by its cron ``GET``, enqueues nothing; the rss tick does."""
    services = feed_services(make_services, sqlite_url)
    client = TestClient(create_app(services), raise_server_exceptions=False)
    store = RssStore(services.db)
    store.put_scope("a", "tenant-a", (store.add_source(feeds.add_rss("/a", items=3)).id,),
                    "en", True)
    assert client.get("/api/admin/rss/refresh", headers=CRON).status_code == 200  # a build
    RulesStore(services).put("a", [{"id": "r1", "match": {"keywords": ["story 1"]},
                                    "destination": {"channel": "slack",
                                                    "recipient": "C0ALERTS"}}])
    jobs = client.get("/api/admin/jobs", headers=admin("super_admin")).json()["jobs"]
    others = [j for j in jobs if j["name"] != "rss-refresh"]
    assert len(others) == len(jobs) - 1 >= 4
    for job in others:
        assert client.get(job["route"], headers=CRON).status_code == 200, job["name"]
    assert DeliveryStore(services.db).list(limit=10) == []
    swept = client.get("/api/admin/rss/refresh", headers=CRON).json()["alertSweep"]
    assert swept["enqueued"] == 1
    assert len(DeliveryStore(services.db).list(limit=10)) == 1
