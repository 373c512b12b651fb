"""The rss-refresh tick end to end on the stores: the fixed order and result keys, the
budget and rotation with an injected clock, per-tenant isolation, the admin path, and the
pipeline flag: publish to rss.ingest (in process, and on moto SQS) and the consumer
builds the global catalog without touching tenant scopes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.jobs.registry import JOBS, Deadline
from sluice.jobs.runner import run_job
from sluice.queues.publish import REGISTRY
from sluice.queues.runtime import consumers_for
from sluice.rss.catalog import Catalog, peek, peek_scope
from sluice.rss.store import GLOBAL_KEY, RssStore
from sluice.rss.tick import ROTATION_WINDOW_MS, refresh_tick
from sluice.store.flags import FlagStore
from tests.providers.feeds import FeedServer
from tests.rss_support import FakeClock, catalog, feed_services, scope_with_a_rule
from tests.sqs_helpers import bodies, create_queues, new_prefix, poll

SECRET = "queue-secret-for-tests-0123456789"
KEYS = {"published", "pipelineEnabled", "inlineRefreshed", "tenantIngestion", "alertSweep",
        "refreshedAt"}


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    REGISTRY.clear()


def seed(svc: Services, feeds: FeedServer, scopes: int = 4) -> tuple[str, list[str]]:
    """One global source, and ``scopes`` completed scopes over two sets (+ one incomplete)."""
    store = RssStore(svc.db)
    store.add_source(feeds.add_rss("/global", items=3), "Global wire", True)
    sets = [tuple(store.add_source(feeds.add_rss(f"/t{k}/{j}", items=2)).id for j in range(2))
            for k in range(2)]
    ids = [f"scope-{n}" for n in range(scopes)]
    for n, scope_id in enumerate(ids):
        store.put_scope(scope_id, f"tenant-{n}", sets[n % 2], "en", True)
    store.put_scope("onboarding", "tenant-x", sets[0], "fr", False)
    return GLOBAL_KEY, ids


def test_the_tick_refreshes_global_then_tenants_then_sweeps(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    _, scopes = seed(svc, feeds)
    outcome = run_job(JOBS["rss-refresh"], svc, "cron_http")
    assert outcome.status == 200 and outcome.outcome == "ok"
    body = outcome.body
    assert KEYS <= set(body)
    assert (body["published"], body["pipelineEnabled"], body["inlineRefreshed"]) == (
        False, False, True)
    tenants = body["tenantIngestion"]
    assert set(tenants) == {"tenantScopes", "refreshed", "shared", "throttled", "locked",
                            "failed", "skippedTimeBudget", "elapsedMs"}
    # Four scopes over two source sets: two builds, two scopes served by them.
    assert (tenants["tenantScopes"], tenants["refreshed"], tenants["shared"],
            tenants["throttled"], tenants["locked"], tenants["failed"],
            tenants["skippedTimeBudget"]) == (4, 2, 2, 0, 0, 0, 0)
    again = run_job(JOBS["rss-refresh"], svc, "cron_http").body
    assert (again["inlineRefreshed"], again["tenantIngestion"]["throttled"],
            again["tenantIngestion"]["refreshed"]) == (False, 4, 0), "inside the throttle"
    assert body["alertSweep"] == {"tenantsWithRules": 0, "evaluated": 0,
                                  "skippedNoFeedCache": 0, "failed": 0,
                                  "skippedDeadline": 0, "evaluations": 0, "enqueued": 0}
    assert body["refreshedAt"].endswith("Z")
    assert body["catalog"]["builds"] == 3  # global + two shared tenant sets
    global_build = peek(svc, GLOBAL_KEY)
    assert global_build is not None and len(global_build.stories) == 3
    assert all(peek_scope(svc, s) is not None for s in scopes)
    assert peek_scope(svc, "onboarding") is None  # not completed: not ingested
    assert all(count == 1 for count in feeds.hits.values())


def test_the_admin_post_refreshes_global_and_sweeps_without_tenant_ingestion(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    _, scopes = seed(svc, feeds)
    body = run_job(JOBS["rss-refresh"], svc, "admin").body
    assert body["inlineRefreshed"] is True
    assert body["tenantIngestion"]["tenantScopes"] == 0
    assert peek(svc, GLOBAL_KEY) is not None
    assert all(peek_scope(svc, s) is None for s in scopes)
    assert set(feeds.hits) == {"/global"}


def test_the_admin_post_rebuilds_the_global_catalog_inside_the_throttle(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    seed(svc, feeds)
    first = run_job(JOBS["rss-refresh"], svc, "cron_http").body
    assert first["inlineRefreshed"] is True
    built_at = peek(svc, GLOBAL_KEY).built_at  # type: ignore[union-attr]
    manual = run_job(JOBS["rss-refresh"], svc, "admin").body
    assert manual["inlineRefreshed"] is True and manual["catalog"]["builds"] == 1
    assert peek(svc, GLOBAL_KEY).built_at > built_at  # type: ignore[union-attr]
    assert feeds.hits["/global"] == 2
    scheduled = run_job(JOBS["rss-refresh"], svc, "cron_http").body
    assert scheduled["inlineRefreshed"] is False, "the throttle held: nothing was rebuilt"


def test_alerts_from_new_stories_are_counted_in_the_ticks_answer(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    clock = FakeClock()
    scope_with_a_rule(svc, feeds, clock)
    clock.advance(3600)
    with catalog(svc, clock) as cat:
        body = refresh_tick(svc, tenant_ingestion=True, deadline=Deadline(60),
                            started_at=clock.now(), catalog=cat, monotonic=clock.monotonic)
    assert body["newStoryAlerts"] == {"enqueued": 2, "failed": 0}
    assert body["alertSweep"]["enqueued"] == 2, "the sweep then saw the old stories too"


def test_the_budget_with_an_injected_clock(db_url: str, make_services: Callable[..., Services],
                                           feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    _, scopes = seed(svc, feeds, scopes=6)
    clock = FakeClock()
    order: list[str] = []
    with catalog(svc, clock) as cat:
        real = cat.refresh_scope

        def slow_refresh(scope_id: str, *, force: bool = True) -> Any:
            order.append(scope_id)
            clock.advance(100)  # each scope takes 100 s of the 240 s budget
            return real(scope_id, force=force)

        cat.refresh_scope = slow_refresh  # type: ignore[method-assign]
        started = clock.now().replace(microsecond=0)
        result = refresh_tick(svc, tenant_ingestion=True, deadline=Deadline(600),
                              started_at=started, catalog=cat, monotonic=clock.monotonic)
    tenants = result["tenantIngestion"]
    assert (tenants["tenantScopes"], tenants["refreshed"], tenants["shared"],
            tenants["skippedTimeBudget"]) == (6, 2, 1, 3), "3 scopes over 2 sets: 2 builds"
    assert tenants["elapsedMs"] == 300_000
    offset = (int(started.timestamp() * 1000) // ROTATION_WINDOW_MS) % 6
    assert order == (scopes[offset:] + scopes[:offset])[:3]
    unreached = set(scopes) - set(order)
    assert all(RssStore(svc.db).scope(s).last_refreshed_at is None for s in unreached)


def test_the_budget_never_outlasts_the_run_deadline(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    seed(svc, feeds)
    clock = FakeClock()
    with catalog(svc, clock) as cat:
        result = refresh_tick(svc, tenant_ingestion=True,
                              deadline=Deadline(0, clock=clock.monotonic),
                              started_at=clock.now(), catalog=cat, monotonic=clock.monotonic)
    assert result["tenantIngestion"]["skippedTimeBudget"] == 4
    assert result["tenantIngestion"]["refreshed"] == 0


def test_one_failing_tenant_is_isolated_and_reported(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        caplog: pytest.LogCaptureFixture) -> None:
    svc = feed_services(make_services, db_url)
    seed(svc, feeds)
    caplog.set_level("ERROR", logger="sluice")
    with catalog(svc) as cat:
        real = cat.refresh_scope

        def flaky(scope_id: str, *, force: bool = True) -> Any:
            if scope_id == "scope-2":
                raise RuntimeError("tenant store exploded")
            return real(scope_id, force=force)

        cat.refresh_scope = flaky  # type: ignore[method-assign]
        result = refresh_tick(svc, tenant_ingestion=True, deadline=Deadline(60),
                              started_at=FakeClock().now(), catalog=cat)
    assert result["tenantIngestion"]["failed"] == 1 and result["failed"] == 1
    assert result["tenantIngestion"]["refreshed"] + result["tenantIngestion"]["shared"] == 3
    assert [r.getMessage() for r in caplog.records if "ingestion failed" in r.getMessage()] == [
        "[rss-refresh] tenant ingestion failed for scope-2: tenant store exploded"]


def test_a_failing_drain_is_reported_through_the_cron_contract(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer,
        monkeypatch: pytest.MonkeyPatch) -> None:
    svc = feed_services(make_services, db_url)
    seed(svc, feeds)
    monkeypatch.setattr(Catalog, "refresh_scope", lambda self, scope_id, force=True: 1 / 0)
    outcome = run_job(JOBS["rss-refresh"], svc, "schedule")
    assert outcome.status == 200 and outcome.outcome == "failures"
    assert outcome.body["tenantIngestion"]["failed"] == 4


def test_flag_on_publishes_in_process_and_the_consumer_builds_the_global_catalog(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    seed(svc, feeds)
    FlagStore(svc.state).set("rssQueuePipeline", True)
    body = run_job(JOBS["rss-refresh"], svc, "admin").body
    assert (body["published"], body["pipelineEnabled"], body["inlineRefreshed"]) == (
        True, True, False)
    assert peek(svc, GLOBAL_KEY) is not None and feeds.hits["/global"] == 1


def test_flag_on_but_no_publish_refreshes_inline(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)  # no signing secret: publish refuses
    seed(svc, feeds)
    FlagStore(svc.state).set("rssQueuePipeline", True)
    body = run_job(JOBS["rss-refresh"], svc, "admin").body
    assert (body["published"], body["pipelineEnabled"], body["inlineRefreshed"]) == (
        False, True, True)
    assert peek(svc, GLOBAL_KEY) is not None


@pytest.mark.aws
def test_flag_on_publishes_to_sqs_and_the_consumer_builds_only_the_global_catalog(
        aws_env: dict[str, str], sqlite_url: str, make_services: Callable[..., Services],
        feeds: FeedServer, caplog: pytest.LogCaptureFixture) -> None:
    svc = feed_services(make_services, sqlite_url, SLUICE_QUEUE_MODE="sqs",
                        SLUICE_QUEUE_SIGNING_SECRET=SECRET, SLUICE_QUEUE_PREFIX=new_prefix())
    urls = create_queues(svc.settings.queue_prefix)
    _, scopes = seed(svc, feeds)
    FlagStore(svc.state).set("rssQueuePipeline", True)

    body = run_job(JOBS["rss-refresh"], svc, "admin").body
    assert (body["published"], body["inlineRefreshed"]) == (True, False)
    [message] = bodies(urls["rss.ingest"])
    assert (message["topic"], message["sourceId"], message["feedUrl"]) == (
        "rss.ingest", "all-sources", "")
    assert peek(svc, GLOBAL_KEY) is None  # nothing built until the consumer runs

    caplog.set_level("INFO", logger="sluice")
    consumer = consumers_for(svc, registry=None)["rss.ingest"]
    polled = poll(urls["rss.ingest"], consumer.lambda_handler)
    assert polled.failed_ids == [] and len(polled.deleted_ids) == 1
    build = peek(svc, GLOBAL_KEY)
    assert build is not None and [s.title for s in build.stories] == [
        "global story 2", "global story 1", "global story 0"]
    assert any(f"running aggregation refresh batch={message['batchId']}" in r.getMessage()
               for r in caplog.records)
    assert all(peek_scope(svc, s) is None for s in scopes)  # never touches tenant scopes
    assert set(feeds.hits) == {"/global"}
    assert bodies(urls["rss.ingest-dlq"]) == []
