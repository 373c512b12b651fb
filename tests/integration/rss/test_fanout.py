"""The tick's fan-out with ``rssQueuePipeline`` on: one ``rss.ingest`` message per due build,
consumers building them (in process and on moto SQS), concurrent consumers sharing one
build per key, the tick's figures in its response and on the operations page."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from sluice.core.services import Services
from sluice.jobs.registry import JOBS
from sluice.jobs.runner import run_job
from sluice.ops.overview import queue_figures
from sluice.queues.publish import REGISTRY
from sluice.queues.runtime import consumers_for, publisher_of
from sluice.rss.catalog import peek_scope
from sluice.rss.fanout import recent_ticks, refresh_build, tick_report
from sluice.rss.store import RssStore
from sluice.store.db import utcnow
from sluice.store.flags import FlagStore
from tests.providers.feeds import FeedServer
from tests.rss_support import feed_services
from tests.sqs_helpers import bodies, create_queues, new_prefix, poll

SECRET = "queue-secret-for-tests-0123456789"


@pytest.fixture
def feeds() -> Iterator[FeedServer]:
    with FeedServer() as server:
        yield server


@pytest.fixture(autouse=True)
def clean_registry() -> Iterator[None]:
    yield
    REGISTRY.clear()


def seed(svc: Services, feeds: FeedServer, *, sets: int = 3, scopes: int = 7) -> list[str]:
    """``scopes`` completed scopes over ``sets`` source sets of two feeds (+ one incomplete)."""
    store = RssStore(svc.db)
    source_sets = [tuple(store.add_source(feeds.add_rss(f"/f{k}/{j}", items=2)).id
                         for j in range(2)) for k in range(sets)]
    ids = [f"scope-{n}" for n in range(scopes)]
    for n, scope_id in enumerate(ids):
        store.put_scope(scope_id, f"tenant-{n}", source_sets[n % sets], "en", True)
    store.put_scope("onboarding", "tenant-x", source_sets[0], "fr", False)
    return ids


def test_flag_on_the_tick_publishes_one_message_per_due_build_and_consumers_build_them(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    scopes = seed(svc, feeds)
    FlagStore(svc.state).set("rssQueuePipeline", True)

    body = run_job(JOBS["rss-refresh"], svc, "schedule").body
    fan_out = body["fanOut"]
    assert (fan_out["due"], fan_out["published"], fan_out["publishFailed"]) == (3, 3, 0)
    # in process, the consumer ran inside each publish: everything is already done
    assert (fan_out["built"], fan_out["shared"], fan_out["failed"], fan_out["pending"]) == (
        3, 0, 0, 0)
    assert fan_out["lagMaxMs"] >= 0
    assert body["tenantIngestion"]["tenantScopes"] == 0  # nothing left to build inline
    assert all(peek_scope(svc, s) is not None for s in scopes)
    assert peek_scope(svc, "onboarding") is None
    assert all(count == 1 for count in feeds.hits.values())

    # the next tick, inside the throttle: nothing is due, nothing is fetched
    again = run_job(JOBS["rss-refresh"], svc, "schedule").body["fanOut"]
    assert (again["due"], again["published"]) == (0, 0)
    assert all(count == 1 for count in feeds.hits.values())
    ticks = queue_figures(svc)["rssFanOut"]
    assert [t["tickId"] for t in ticks] == [again["tickId"], fan_out["tickId"]]
    assert ticks[1]["built"] == 3


def test_concurrent_consumers_of_one_key_build_it_once(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url)
    seed(svc, feeds, sets=1, scopes=3)
    key = RssStore(svc.db).scope("scope-0").build_key
    tick = "tick-concurrent"
    with svc.db.transaction() as tx:
        tx.execute("INSERT INTO rss_fanout_ticks (tick_id, started_at, due, published) "
                   "VALUES (:t, :now, 1, 8)", {"t": tick, "now": utcnow()})
    message = {"buildKey": key, "tickId": tick, "publishedAt": "2026-01-01T00:00:00.000Z"}
    outcomes: list[str] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def consume() -> None:
        try:
            barrier.wait()
            outcomes.append(str(refresh_build(svc, message)["outcome"]))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=consume) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert outcomes.count("built") == 1
    assert all(count == 1 for count in feeds.hits.values())
    report = tick_report(svc.db, tick)
    assert report is not None
    assert (report["built"], report["shared"] + report["locked"], report["failed"],
            report["pending"]) == (1, 7, 0, 0)
    assert report["lagMaxMs"] > 0
    assert recent_ticks(svc.db)[0]["tickId"] == tick


@pytest.mark.aws
def test_flag_on_publishes_per_build_messages_to_sqs_and_the_consumer_builds_them(
        aws_env: dict[str, str], sqlite_url: str, make_services: Callable[..., Services],
        feeds: FeedServer) -> None:
    svc = feed_services(make_services, sqlite_url, SLUICE_QUEUE_MODE="sqs",
                        SLUICE_QUEUE_SIGNING_SECRET=SECRET, SLUICE_QUEUE_PREFIX=new_prefix())
    urls = create_queues(svc.settings.queue_prefix)
    scopes = seed(svc, feeds)
    FlagStore(svc.state).set("rssQueuePipeline", True)

    body = run_job(JOBS["rss-refresh"], svc, "schedule").body
    fan_out = body["fanOut"]
    assert (fan_out["published"], fan_out["built"], fan_out["pending"]) == (3, 0, 3)
    messages = bodies(urls["rss.ingest"])
    keyed = sorted(m["buildKey"] for m in messages if m.get("buildKey"))
    assert len(keyed) == 3 and len(messages) == 4  # plus the seed's all-sources message
    assert all(peek_scope(svc, s) is None for s in scopes)

    consumer = consumers_for(svc, registry=None)["rss.ingest"]
    polled = poll(urls["rss.ingest"], consumer.lambda_handler)
    assert polled.failed_ids == [] and len(polled.deleted_ids) == 4
    assert all(peek_scope(svc, s) is not None for s in scopes)
    report = tick_report(svc.db, fan_out["tickId"])
    assert report is not None and (report["built"], report["pending"]) == (3, 0)
    assert bodies(urls["rss.ingest-dlq"]) == []


def test_a_publish_that_fails_leaves_the_rest_to_the_inline_path(
        db_url: str, make_services: Callable[..., Services], feeds: FeedServer) -> None:
    svc = feed_services(make_services, db_url, SLUICE_QUEUE_SIGNING_SECRET=SECRET)
    scopes = seed(svc, feeds)
    FlagStore(svc.state).set("rssQueuePipeline", True)
    publisher_of(svc)  # builds and registers the in-process consumers
    real = REGISTRY.get("rss.ingest")
    assert real is not None

    class QueueDownForBuilds:
        """The seed's message goes through; the per-build ones are refused."""

        def deliver_local(self, body: str, message_id: str) -> Any:
            if '"buildKey"' in body:
                return SimpleNamespace(outcome=SimpleNamespace(value="retry"), reason="down")
            return real.deliver_local(body, message_id)

    REGISTRY.register("rss.ingest", QueueDownForBuilds())
    body = run_job(JOBS["rss-refresh"], svc, "schedule").body
    fan_out = body["fanOut"]
    assert (fan_out["due"], fan_out["published"], fan_out["publishFailed"]) == (3, 0, 1)
    tenants = body["tenantIngestion"]
    # three builds made inline, the other four scopes share them
    assert (tenants["tenantScopes"], tenants["refreshed"], tenants["shared"],
            tenants["failed"]) == (7, 3, 4, 0)
    assert all(peek_scope(svc, s) is not None for s in scopes)
    assert all(count == 1 for count in feeds.hits.values())
